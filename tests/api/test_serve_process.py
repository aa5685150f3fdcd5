"""`fencepost serve` as a real process: start-up line, reflection, SIGTERM
drain with exit 0, and durability across a restart on the SQLite default."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import fencepost


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(state_root: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    """`fencepost serve` on SQLite under `state_root`, or on the `--backend` in `extra`."""
    where = [] if "--backend" in extra else ["--state-root", str(state_root)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{port}", *where, *extra],
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


#: runs `fencepost serve` on SQLite and stops it (argv[2]: SIGTERM or SIGINT)
#: while it is still starting: right after the backend was opened ("open"), or
#: in the middle of the start-up probe, the gRPC port already bound ("start");
#: the probe hangs either way. The backend's close is made visible on stdout.
_SERVE_STOPPED_WHILE_STARTING = """
import asyncio, os, signal, sys
from fencepost_server import app, cli

state_root, sig, stage = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3]
real_open = cli.open_storage

def open_storage(settings):
    storage = real_open(settings)
    real_close = storage.close

    async def close():
        print("backend closed", flush=True)
        await real_close()

    storage.close = close
    if stage == "open":
        os.kill(os.getpid(), sig)
    return storage

async def probe_forever(self):
    if stage == "start":
        os.kill(os.getpid(), sig)
    await asyncio.sleep(60)  # a start-up probe that hangs: the stop must not wait for it

cli.open_storage = open_storage
app.App._probe_once = probe_forever
sys.exit(cli.main(["serve", "--listen", "127.0.0.1:0", "--state-root", state_root, "--no-uvloop"]))
"""


@pytest.mark.parametrize("stage", ["open", "start"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_while_starting_closes_the_backend(tmp_path: Path, sig: str, stage: str) -> None:
    """A stop signal after the backend was opened but before the server
    serves closes the backend (the SQLite writer, its connections) and exits
    130, "interrupted before serving": SIGTERM's default action killed the
    process with nothing closed."""
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-c", _SERVE_STOPPED_WHILE_STARTING, str(tmp_path), sig, stage],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 130, (res.returncode, res.stdout, res.stderr)
    assert "backend closed" in res.stdout
    assert "fencepost serving on" not in res.stdout
    assert "Traceback" not in res.stderr
    assert time.monotonic() - started < 30  # never waited out the hanging probe
