"""Server settings: one object built from the command line (or by tests)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .domain.ledger.core import LedgerConfig
from .domain.limits import Limits
from .domain.retention import RetentionConfig


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
    backend_warning_seconds: float = 60.0  # while the backend stays down, warn at most this often
    request_sweep_seconds: float = 600.0
    uvloop: bool = True  # when installed
    #: bind with SO_REUSEPORT: set for each process of `serve --workers N` (they share the port)
    reuse_port: bool = False
    eval_history_window: int = 50  # ListEvalRuns keeps this many newest runs per agent
    # security (spec/security.md): any of these turns authentication on
    tokens_file: Path | None = None
    spiffe_map: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    trust_xfcc: bool = False
    # page tokens: a file holding the deployment's 32-byte secret as 64 hex
    # digits; None = the secret kept in the backend (shared by every replica)
    page_token_key_file: Path | None = None
    metrics_listen: str | None = None
    # ledger: the janitor runs in every replica (safe: every action is conditional)
    ledger_janitor: bool = True
    ledger_janitor_seconds: float = 5.0
    ledger_orphan_grace_seconds: float = 10.0
    ledger_watch_poll_seconds: float = 1.0
    # erasure operations (AdminService): every replica looks for unfinished ones this often
    erasure_poll_seconds: float = 5.0
    # retention (docs/lifecycle.md): 0 = keep forever (the default for each)
    retain_idle_sessions_seconds: float = 0.0
    retain_journal_archives_seconds: float = 0.0
    retain_commit_markers_seconds: float = 0.0
    retention_seconds: float = 60.0  # one bounded pass this often
    retention_batch: int = 1000  # list calls per pass
    # journal (spec/journal.md): flush the tail when older / larger than these,
    # rotate the live journal at max_journal_bytes
    journal_flush_seconds: float = 30.0
    journal_flush_bytes: int = 64 * 1024
    max_journal_bytes: int = 5 * 1024 * 1024
    # schedule (spec/schedule.md): WatchDue sleeps at most this long between
    # clock re-reads; the clock is injectable for tests (None = time.time)
    schedule_watch_seconds: float = 1.0
    schedule_clock: Callable[[], float] | None = None

    def ledger_config(self) -> LedgerConfig:
        return LedgerConfig(
            janitor_interval=self.ledger_janitor_seconds,
            orphan_grace=self.ledger_orphan_grace_seconds,
            watch_poll=self.ledger_watch_poll_seconds,
        )

    def retention_config(self) -> RetentionConfig:
        return RetentionConfig(
            idle_session_seconds=self.retain_idle_sessions_seconds,
            archive_seconds=self.retain_journal_archives_seconds,
            commit_marker_seconds=self.retain_commit_markers_seconds,
            batch=self.retention_batch, interval=self.retention_seconds,
        )

    def backend_url(self) -> str:
        if self.backend:
            return self.backend
        return f"sqlite://{(self.state_root / 'fencepost.db').resolve()}"

    def backend_scheme(self) -> str:
        """`memory`, `sqlite` or `dynamodb`: the backend URL's scheme, lower-cased
        as the backend registry reads it (`MEMORY://` is memory://)."""
        return urlsplit(self.backend_url()).scheme

    def auth_configured(self) -> bool:
        return bool(self.tokens_file or self.tls_client_ca or self.trust_xfcc)

    def tls_configured(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    def listen_is_loopback(self) -> bool:
        host = self.listen.rsplit(":", 1)[0].strip("[]")
        if host in ("localhost", ""):
            return host == "localhost"
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False
