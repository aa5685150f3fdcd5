"""Server settings: one object built from the command line (or by tests)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from .domain.limits import Limits


@dataclass
class Settings:
    listen: str = "127.0.0.1:50051"
    state_root: Path = Path(".fencepost")
    backend: str | None = None  # URL; default: sqlite file under state_root
    limits: Limits = field(default_factory=Limits)
    grace_seconds: float = 10.0
    max_receive_bytes: int = 8 * 1024 * 1024
    default_tenant: str = "default"
    health_probe_seconds: float = 5.0
    request_sweep_seconds: float = 600.0
    uvloop: bool = False
    # journal (spec/journal.md): flush the tail when older / larger than these,
    # rotate the live journal at max_journal_bytes
    journal_flush_seconds: float = 30.0
    journal_flush_bytes: int = 64 * 1024
    max_journal_bytes: int = 5 * 1024 * 1024

    def backend_url(self) -> str:
        if self.backend:
            return self.backend
        return f"sqlite://{(self.state_root / 'fencepost.db').resolve()}"

    def listen_is_loopback(self) -> bool:
        host = self.listen.rsplit(":", 1)[0].strip("[]")
        if host in ("localhost", ""):
            return host == "localhost"
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False
