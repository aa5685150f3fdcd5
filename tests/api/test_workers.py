"""`fencepost serve --workers N`: processes sharing the port and one SQLite
file, a dead worker restarted, SIGHUP reaching every worker, metrics per
worker, SIGTERM draining all of them, memory:// refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import fencepost
from tests.api.security_support import write_tokens
from tests.api.test_serve_process import free_port

#: a channel of its own (its own TCP connection), so the kernel may hand it to any worker
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
CLIENTS = 8


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait_for(predicate, what: str, seconds: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _start(tmp_path: Path, port: int, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / "server.out"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{port}",
             "--backend", f"sqlite://{tmp_path}/w.db", "--workers", "2", "--grace", "2", *extra],
            stdout=stdout, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def serving() -> bool:
        if proc.poll() is not None:  # it gave up: say why instead of waiting out the timeout
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read().decode() if proc.stderr else ''}")
        return out.read_text().count("fencepost serving on") == 2

    _wait_for(serving, "two workers")
    # each worker's banner says whose it is (two identical lines told nothing)
    assert {f"[worker {i}] fencepost serving on" in out.read_text() for i in (0, 1)} == {True}
    return proc, out


def _consecutive_free_ports(n: int) -> int:
    """A port p with p .. p + n - 1 all free now (worker i serves /metrics on p + i)."""
    import socket

    for _ in range(100):
        first = free_port()
        try:
            for port in range(first, first + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {n} consecutive free ports")


def _clients(port: int, token: str | None = None) -> list[fencepost.Client]:
    return [fencepost.Client(f"127.0.0.1:{port}", token=token, timeout=10, options=OWN_CONNECTION)
            for _ in range(CLIENTS)]


def test_two_workers_share_one_file_restart_a_dead_one_and_drain(tmp_path: Path) -> None:
    metrics = _consecutive_free_ports(2)
    port = free_port()
    while metrics <= port <= metrics + 1:
        port = free_port()
    proc, out = _start(tmp_path, port, "--metrics-listen", f"127.0.0.1:{metrics}")
    try:
        workers = _children(proc.pid)
        assert len(workers) == 2
        clients = _clients(port)
        versions = [c.put(f"k{i}.{n}", b"x") for n in range(20) for i, c in enumerate(clients)]
        assert len(set(versions)) == len(versions), "two workers minted the same version"
        # every acknowledged write is visible through every connection (any worker)
        for c in clients:
            for i in range(CLIENTS):
                assert c.get(f"k{i}.19") is not None
        # compare-and-set across workers: exactly one of two racing writers wins
        base = clients[0].put("cas", b"0")
        outcomes = [c.put_if_version("cas", b"1", base).applied for c in clients]
        assert outcomes.count(True) == 1

        scraped = [urllib.request.urlopen(f"http://127.0.0.1:{metrics + i}/metrics", timeout=10).read().decode()
                   for i in range(2)]
        served = sum(float(v) for text in scraped
                     for v in re.findall(r'fencepost_rpcs_total\{code="OK",method="Kv/Put"\} (\S+)', text))
        assert served >= len(versions)

        os.kill(workers[0], signal.SIGKILL)
        _wait_for(lambda: out.read_text().count("fencepost serving on") == 3, "the dead worker's replacement")
        assert len(_children(proc.pid)) == 2 and workers[0] not in _children(proc.pid)
        for c in clients:  # a client of the dead worker reconnects (the SDK retries reads)
            assert c.get("k0.0") is not None
        for c in clients:
            c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 0, stderr
    assert re.search(rf"worker 0 \(pid {workers[0]}\) exited with code -9; restarting it", stderr)
    assert out.read_text().count("fencepost stopped") == 2
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers[1:])


def test_sighup_reloads_tokens_in_every_worker(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.json", {"old-token": ("a", "service")})
    port = free_port()
    proc, _ = _start(tmp_path, port, "--tokens-file", str(tokens))
    try:
        write_tokens(tokens, {"new-token": ("a", "service")})
        proc.send_signal(signal.SIGHUP)

        def every_worker_reloaded() -> bool:
            clients = _clients(port, token="new-token")
            try:
                for c in clients:
                    c.get("anything")
                return True
            except fencepost.FencepostError:
                return False
            finally:
                for c in clients:
                    c.close()

        _wait_for(every_worker_reloaded, "the new token to work on every connection", seconds=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


@pytest.mark.parametrize("argv", [["--backend", "memory://", "--workers", "2"], ["--workers", "0"],
                                  # URL schemes are case-insensitive: this is memory:// too
                                  ["--backend", "MEMORY://", "--workers", "2"],
                                  ["--backend", "Memory://x", "--workers", "2"]])
def test_workers_refused_where_they_cannot_share_state(tmp_path: Path, argv: list[str]) -> None:
    where = [] if "--backend" in argv else ["--state-root", str(tmp_path)]
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0", *where, *argv],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 2
    assert "--workers" in res.stderr


def test_uvloop_is_the_default_and_no_uvloop_turns_it_off() -> None:
    from fencepost_server.cli import build_parser
    from fencepost_server.workers import run_loop

    parse = build_parser().parse_args
    assert parse(["serve"]).uvloop is True
    assert parse(["serve", "--uvloop"]).uvloop is True  # still accepted
    assert parse(["serve", "--no-uvloop"]).uvloop is False
    assert parse(["serve"]).workers == 1

    async def on_uvloop() -> int:
        import asyncio

        return int(type(asyncio.get_running_loop()).__module__.startswith("uvloop"))

    assert run_loop(on_uvloop(), use_uvloop=True) == 1
    assert run_loop(on_uvloop(), use_uvloop=False) == 0


def test_a_worker_that_cannot_start_stops_the_server_with_its_exit_code(tmp_path: Path) -> None:
    """A start failure is the same with --workers as without: exit 3 and the
    cause, not workers restarted forever on a file that will never open."""
    not_a_db = tmp_path / "notdb"
    not_a_db.write_bytes(b"garbage, not a database" * 100)
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{free_port()}",
         "--backend", f"sqlite://{not_a_db}", "--workers", "2"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert res.returncode == 3, (res.returncode, res.stderr)
    assert "file is not a database" in res.stderr
    assert "restarting" not in res.stderr
    assert "Traceback" not in res.stderr


def test_a_stop_during_a_restart_pause_starts_no_new_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM while the supervisor waits to restart a crashed worker: the
    replacement would be started after the stop was sent to every worker,
    never get it, and keep the supervisor (and the port) alive forever."""
    from fencepost_server import workers
    from fencepost_server.config import Settings

    sup = workers.Supervisor(Settings(backend="sqlite:///unused.db"), 2, False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sup.workers[0] = workers._Worker(0, dead, time.monotonic(), ready=True)  # type: ignore[arg-type]
    monkeypatch.setattr(workers.time, "sleep", lambda _s: sup._on_stop(signal.SIGTERM, None))
    started: list[int] = []
    monkeypatch.setattr(sup, "_start", started.append)
    sup._reap()
    assert started == [] and sup.workers == {}


def test_json_log_lines_of_a_worker_name_it(tmp_path: Path) -> None:
    """With --log-format json a worker's log lines carry "worker": i, as its
    text lines carry worker-i (which of N processes said it)."""
    import json

    not_a_db = tmp_path / "notdb"
    not_a_db.write_bytes(b"garbage, not a database" * 100)
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{free_port()}",
         "--backend", f"sqlite://{not_a_db}", "--workers", "2", "--log-format", "json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = [json.loads(line) for line in res.stderr.splitlines()]
    failures = [doc for doc in lines if "cannot start" in doc["msg"]]
    assert failures, res.stderr
    for doc in failures:
        assert doc["msg"].startswith(f"worker {doc.get('worker')} cannot start"), doc


def test_a_worker_whose_supervisor_is_gone_before_it_asked_to_die_with_it_exits() -> None:
    """The supervisor may die before a new worker sets its parent-death signal.
    The orphan's new parent is not always pid 1 (a subreaper: tini -s, a
    container runtime, systemd --user): the worker compares with the pid of
    the supervisor that started it."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that is no one's parent now
    res = subprocess.run(
        [sys.executable, "-c", "from fencepost_server.workers import _die_with_parent; _die_with_parent(); "
                               "print('still running')"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "FENCEPOST_SUPERVISOR_PID": str(gone.pid)},
    )
    assert res.returncode == 1 and "still running" not in res.stdout


def test_a_worker_that_fails_unexpectedly_at_its_first_start_stops_the_server(tmp_path: Path) -> None:
    """An unexpected failure (exit 1, a bug) before a worker ever served ends
    the server as it ends one process: one line, exit 1, no traceback without
    --log-level DEBUG, and no worker restarted forever on the same bug."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('FENCEPOST_WORKER') == '1':\n"
        "    import fencepost_server.cli as cli\n"
        "    async def broken(*args, **kwargs):\n"
        "        raise RuntimeError('a bug in start-up')\n"
        "    cli.serve = broken\n")
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{free_port()}",
         "--backend", f"sqlite://{tmp_path}/w.db", "--workers", "2"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1",
             "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])},
    )
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert "a bug in start-up" in res.stderr and "Traceback" not in res.stderr
    assert "restarting" not in res.stderr


def test_a_worker_whose_drain_fails_makes_the_supervisor_exit_non_zero(tmp_path: Path) -> None:
    """A worker that exits non-zero on its way down (its drain failed) fails
    the stop: the supervisor exits 1 and names the worker, as one process's
    failed drain exits 1, instead of 0 ("stopped cleanly")."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('FENCEPOST_WORKER') == '1':\n"
        "    from fencepost_server.app import App\n"
        "    real_stop = App.stop\n"
        "    async def broken(self, *args, **kwargs):\n"
        "        await real_stop(self, *args, **kwargs)\n"
        "        raise RuntimeError('a bug in the drain')\n"
        "    App.stop = broken\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    port = free_port()
    out = tmp_path / "server.out"
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{port}",
             "--backend", f"sqlite://{tmp_path}/w.db", "--workers", "2", "--grace", "1"],
            stdout=stdout, stderr=subprocess.PIPE, env={**env, "PYTHONUNBUFFERED": "1"},
        )
    try:
        _wait_for(lambda: proc.poll() is not None or out.read_text().count("fencepost serving on") == 2,
                  "two workers")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 1, (code, stderr)
    assert "a bug in the drain" in stderr
    started = re.search(r"fencepost worker 1 started \(pid (\d+)\)", out.read_text())
    assert started, out.read_text()
    assert re.search(rf"worker 1 \(pid {started[1]}\) failed while stopping \(exit 1\)", stderr), stderr
    assert "worker 0 (pid" not in stderr  # the worker that drained cleanly is not blamed


@pytest.mark.parametrize("workers", ["65", "100000"])
def test_workers_past_the_cap_are_a_usage_error(tmp_path: Path, workers: str) -> None:
    """--workers has a ceiling (64): each worker is a whole server process, and
    --workers 100000 would fork until the machine gave out instead of failing."""
    from fencepost_server.workers import MAX_WORKERS

    assert MAX_WORKERS == 64  # the documented cap (README, docs/cli.md)
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0",
         "--state-root", str(tmp_path), "--workers", workers],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.startswith("fencepost: error: argument --workers: expected an integer >= 1 and <= 64"), res.stderr
    assert "fencepost worker" not in res.stdout  # refused before any worker started
    assert not (tmp_path / "fencepost.db").exists()


def test_workers_at_the_cap_pass_the_checks() -> None:
    from fencepost_server.cli import build_parser
    from fencepost_server.config import Settings
    from fencepost_server.workers import MAX_WORKERS, refusal

    assert build_parser().parse_args(["serve", "--workers", str(MAX_WORKERS)]).workers == MAX_WORKERS
    assert refusal(Settings(), MAX_WORKERS) is None
    assert "--workers" in (refusal(Settings(), MAX_WORKERS + 1) or "")


@pytest.mark.parametrize(("code", "exit_code"), [(0, 0), (130, 0), (-signal.SIGTERM, 0), (-signal.SIGINT, 0),
                                                (1, 1), (2, 2), (3, 3), (-signal.SIGKILL, 1)])
def test_which_exits_after_the_stop_fail_it(code: int, exit_code: int, caplog: pytest.LogCaptureFixture) -> None:
    """After the stop, a worker's exit is clean when it drained (0), stopped
    before serving (130), or got the SIGTERM before it could handle one (still
    importing: nothing opened yet); so is a SIGINT it could not handle yet: a
    terminal's Ctrl-C reaches every worker of the process group along with the
    supervisor. Any other exit fails the stop: a first start's failure (1, 2,
    3) with its own code, as one process would exit, anything else with 1."""
    failed = exit_code != 0
    from fencepost_server import workers
    from fencepost_server.config import Settings

    sup = workers.Supervisor(Settings(backend="sqlite:///unused.db"), 2, False)
    if code < 0:
        proc = subprocess.Popen([sys.executable, "-c", f"import os; os.kill(os.getpid(), {-code})"])
    else:
        proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    assert proc.wait() == code
    sup.workers[0] = workers._Worker(0, proc, time.monotonic(), ready=False)  # type: ignore[arg-type]
    sup.stopping = True
    with caplog.at_level("ERROR", logger="fencepost.workers"):
        sup._reap()
    assert sup.workers == {}
    assert sup.exit_code == exit_code
    assert bool(caplog.records) is failed


def test_a_stop_before_any_worker_served_exits_130(tmp_path: Path) -> None:
    """`fencepost serve` stopped before it served exits 130; with --workers the
    supervisor answered the same stop with 0, as if the server had served
    and drained."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{free_port()}",
         "--backend", f"sqlite://{tmp_path}/w.db", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]  # both workers started, still importing
    assert [b"worker 1 started" in line for line in lines] == [False, True], lines
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert b"serving on" not in out, out  # (a worker that served first would make this a drain)
    assert proc.returncode == 130, (proc.returncode, err.decode())
    assert b"Traceback" not in err


def test_a_ctrl_c_while_a_worker_starts_is_a_stop_before_serving(tmp_path: Path) -> None:
    """A terminal's Ctrl-C sends SIGINT to the supervisor and to every worker.
    One that lands while a worker is still setting up (before its event loop
    handles it) is a stop before serving, exit 130 as `fencepost serve`
    answers it, not a KeyboardInterrupt traceback and a killed worker that
    the supervisor reports as failed."""
    import pickle

    from fencepost_server.config import Settings

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import os, signal\n"
        "if os.environ.get('FENCEPOST_WORKER'):\n"
        "    from fencepost_server import tracing\n"
        "    real = tracing.configure_from_env\n"
        "    def interrupted(*args, **kwargs):\n"
        "        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the worker starts\n"
        "        return real(*args, **kwargs)\n"
        "    tracing.configure_from_env = interrupted\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
           "FENCEPOST_WORKER": "0", "FENCEPOST_SUPERVISOR_PID": str(os.getpid())}
    config = (Settings(listen="127.0.0.1:0", backend="memory://"), False, 30, False)
    res = subprocess.run([sys.executable, "-m", "fencepost_server.workers"], input=pickle.dumps(config),
                         capture_output=True, env=env, timeout=60)
    stderr = res.stderr.decode()
    assert res.returncode == 130, (res.returncode, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert b"fencepost serving on" not in res.stdout
