"""The real server as a subprocess (`python -m fencepost_server serve
--backend URL`), killed with SIGKILL and restarted on the same port and the
same SQLite file or DynamoDB table. With `--workers N`, one worker process can
be killed alone (its supervisor restarts it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import free_port
from bench.load import assert_loopback

START_SECONDS = 60.0
READY_LINE = "fencepost serving on"

#: reconnect quickly after a restart (gRPC's default backoff starts at 1 s)
CLIENT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 300),
]


class CrashableServer:
    def __init__(self, backend_url: str, log_dir: Path, *extra: str) -> None:
        self.backend_url = backend_url
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        assert_loopback(self.target)
        self.log_dir = log_dir
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.kills = 0

    def start(self) -> None:
        """Start and wait for the ready line (raises with the log if it dies)."""
        self.starts += 1
        out = self.log_dir / f"server-{self.starts}.out"
        err = self.log_dir / f"server-{self.starts}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fencepost_server", "serve", "--listen", self.target,
                 "--backend", self.backend_url, "--log-level", "WARNING", "--grace", "1", *self.extra],
                stdout=stdout, stderr=stderr, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + START_SECONDS
        while READY_LINE not in out.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill9()
                raise RuntimeError(f"server did not start: {err.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)

    def kill9_worker(self, pick: int) -> None:
        """SIGKILL one worker of a `--workers N` server (the `pick`-th, modulo
        their count) and wait until the supervisor's replacement serves."""
        assert self.proc is not None
        workers = _children(self.proc.pid)
        out = self.log_dir / f"server-{self.starts}.out"
        ready = out.read_text(errors="replace").count(READY_LINE)
        os.kill(workers[pick % len(workers)], signal.SIGKILL)
        self.kills += 1
        deadline = time.monotonic() + START_SECONDS
        while out.read_text(errors="replace").count(READY_LINE) <= ready:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the supervisor did not restart its worker")
            time.sleep(0.05)

    def kill9(self) -> None:
        """SIGKILL: no drain, no flush, no close. A `--workers` server is
        killed whole: the supervisor and every worker (as a crash of the
        machine or a kill of its process group would)."""
        if self.proc is not None and self.proc.poll() is None:
            workers = _children(self.proc.pid)
            self.proc.send_signal(signal.SIGKILL)
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            deadline = time.monotonic() + 30
            while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
                time.sleep(0.01)  # gone, port released, before the restart binds it again
            self.kills += 1
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped holds no socket)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False
