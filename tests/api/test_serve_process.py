"""`fencepost serve` as a real process: start-up line, reflection, SIGTERM
drain with exit 0, and durability across a restart on the SQLite default."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import fencepost


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(state_root: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{port}",
         "--state-root", str(state_root), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "fencepost serving on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_serve_reflection_sigterm_and_restart_durability(tmp_path: Path) -> None:
    port = free_port()
    proc = start_server(tmp_path, port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = {s.name for r in responses for s in r.list_services_response.service}
        assert "fencepost.v1.KvService" in names
        assert "grpc.health.v1.Health" in names
        with fencepost.Client(f"127.0.0.1:{port}") as fp:
            version = fp.put("durable", b"survives restart")
    finally:
        stop_server(proc)
    assert (tmp_path / "fencepost.db").exists()

    proc = start_server(tmp_path, port)
    try:
        with fencepost.Client(f"127.0.0.1:{port}") as fp:
            entry = fp.get("durable")
            assert entry is not None and entry.value == b"survives restart" and entry.version == version
            assert fp.put("durable", b"again") != version  # versions never reused across restarts
    finally:
        stop_server(proc)


def test_non_loopback_listen_without_auth_is_refused(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "0.0.0.0:0", "--state-root", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode != 0
    assert "--insecure" in res.stderr


def test_sigterm_drains_an_in_flight_long_poll_and_exits_zero(tmp_path: Path) -> None:
    import threading
    import time

    port = free_port()
    proc = start_server(tmp_path, port, "--grace", "20")
    outcome: dict[str, object] = {}

    def long_poll() -> None:
        with fencepost.Client(f"127.0.0.1:{port}", retry=fencepost.NO_RETRY) as fp:
            started = time.monotonic()
            try:
                outcome["result"] = fp.claim_orphan("worker", ttl=5, wait=15)
            except fencepost.FencepostError as exc:
                outcome["error"] = exc
            outcome["seconds"] = time.monotonic() - started

    worker = threading.Thread(target=long_poll)
    worker.start()
    time.sleep(1.0)  # the long-poll is now in flight
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    worker.join(timeout=30)
    # Drained, not cut: the poll answered "nothing to claim" instead of an error,
    # and it ended with the shutdown rather than running its full 15 s.
    assert "error" not in outcome, outcome
    assert outcome["result"] is None
    assert float(outcome["seconds"]) < 14  # type: ignore[arg-type]


#: runs `fencepost serve`, sending itself SIGTERM the moment the start-up line
#: is out (what a supervisor that waits for that line and stops it at once does)
_SERVE_STOPPED_AT_THE_READY_LINE = """
import builtins, os, signal, sys, time
from fencepost_server import cli

def print_then_stop(*args, **kwargs):
    builtins.print(*args, **kwargs)
    if args and str(args[0]).startswith("fencepost serving on"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # delivered here: handled, or the default action kills

cli.print = print_then_stop
sys.exit(cli.main(["serve", "--listen", "127.0.0.1:0", "--backend", "memory://"]))
"""


def test_sigterm_right_after_the_ready_line_drains() -> None:
    res = subprocess.run([sys.executable, "-c", _SERVE_STOPPED_AT_THE_READY_LINE], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    assert "fencepost stopped" in res.stdout


def test_a_closed_stdout_does_not_stop_the_drain() -> None:
    """Whoever read the start-up line may be gone by the stop (a log pipe that
    died): "fencepost draining…" then failed with BrokenPipeError before the
    drain, exit 1, in-flight calls cut and the backend never closed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0", "--backend", "memory://"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert "fencepost serving on" in proc.stdout.readline()
    proc.stdout.close()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    stderr = proc.stderr.read()
    assert code == 0, stderr
    assert "BrokenPipe" not in stderr
