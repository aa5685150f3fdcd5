"""How `fencepost serve` runs: one process, or `--workers N` processes sharing the port.

One grpc.aio process tops out at one core: gRPC's per-call machinery runs on
the event loop. Past that only more processes help, so with `--workers N` this
module becomes a small supervisor that starts N worker processes, each a
complete server with its own event loop, all bound to the same address with
SO_REUSEPORT (the kernel spreads incoming connections over them).

Workers share nothing in memory. They are replicas like DynamoDB replicas:
- sqlite: one file shared by every worker (WAL; each worker group-commits its
  own writes, BEGIN IMMEDIATE serialises the workers' transactions, and
  version tokens are minted inside that transaction).
- dynamodb: every worker is one more stateless replica.
- memory://: refused, a worker's dict would be invisible to the others.

The supervisor forwards SIGTERM / SIGINT (graceful drain in every worker) and
SIGHUP (token reload in every worker), restarts a worker that dies (logged),
and relays the workers' output. A worker whose first start fails with exit 1,
2 or 3 (a bug, or a configuration this machine cannot run) stops the server
with that code, as one process would exit; one that exits non-zero after the
stop (its drain failed) makes the supervisor exit 1, and a stop before any
worker served exits 130. Workers die with the supervisor (a kill -9 of
the supervisor takes the whole server down, as for one process). Each worker
serves its own health and, with `--metrics-listen host:port`, its own
`/metrics` on port + worker index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any

from .config import Settings

log = logging.getLogger("fencepost.workers")

#: a worker that dies sooner than this after its start is restarted after a pause
_RESTART_PAUSE = 1.0
_PR_SET_PDEATHSIG = 1
#: a worker's exit codes when it cannot start (cli.Exit.ERROR, USAGE, START_FAILED): a
#: configuration this machine cannot run, or a bug that one process would exit 1 on
_ERROR, _USAGE, _START_FAILED = 1, 2, 3
_CANNOT_START = (_ERROR, _USAGE, _START_FAILED)
_INTERRUPTED = 130  # cli.Exit.INTERRUPTED: stopped before serving
#: a worker's exit codes after a stop that went well: drained (cli.Exit.OK),
#: stopped before it served (cli.Exit.INTERRUPTED), or killed by the SIGTERM
#: the supervisor sent, or a terminal's Ctrl-C (SIGINT reaches the whole
#: process group), before its handler existed (still importing: nothing open)
_STOPPED_CLEANLY = (0, _INTERRUPTED, -signal.SIGTERM, -signal.SIGINT)
READY_LINE = b"fencepost serving on"
#: the most `--workers`: each is a whole server (its own process, event loop,
#: backend connections and background loops). Past a core each they only
#: contend; a host with more cores than this runs another replica instead.
MAX_WORKERS = 64


def run_loop(main: Coroutine[Any, Any, int], use_uvloop: bool) -> int:
    """Run `main` on uvloop when asked for and installed, else on asyncio."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            log.info("uvloop is not installed; running on asyncio")
        else:
            return int(uvloop.run(main))
    return asyncio.run(main)


def refusal(settings: Settings, workers: int) -> str | None:
    """Why `workers` processes cannot serve these settings (None when they can)."""
    if not 1 <= workers <= MAX_WORKERS:
        return f"--workers must be 1..{MAX_WORKERS} (got {workers})"
    if workers > 1 and settings.backend_scheme() == "memory":
        return ("--workers > 1 needs a shared backend (sqlite or dynamodb): "
                "each worker of memory:// would hold its own separate data")
    return None


def serve(settings: Settings, *, create_table: bool, workers: int, tracing_line: str | None = None) -> int:
    """`fencepost serve`: in this process, or as the supervisor of `workers`
    processes (each configures tracing from the same environment)."""
    from .cli import serve as serve_one

    if workers == 1:
        return run_loop(serve_one(settings, create_table=create_table, tracing_line=tracing_line), settings.uvloop)
    return Supervisor(settings, workers, create_table).run()


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    started: float
    pending: bytes = b""
    ready: bool = False
    #: a SIGHUP came while the worker was starting: sent once it serves
    reload_owed: bool = False
    #: the replacement of a worker that died (not the server's first start of this index)
    restart: bool = False


class Supervisor:
    def __init__(self, settings: Settings, workers: int, create_table: bool) -> None:
        self.settings = settings
        self.count = workers
        self.create_table = create_table
        self.workers: dict[int, _Worker] = {}
        self.stopping = False
        self._selector = selectors.DefaultSelector()
        self._reserved: socket.socket | None = None
        #: the supervisor's exit code: a worker's when its first start failed
        self.exit_code = 0
        #: a worker said it serves (a stop before that exits 130, as one process)
        self.served = False

    def run(self) -> int:
        self.settings = replace(self.settings, listen=self._fixed_listen(), reuse_port=True)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        try:
            self._start(0)
            if self.create_table:  # the first worker creates the table before the others open it
                while self.workers and not self.workers[0].ready and not self.stopping:
                    self._pump(0.2)
                    self._reap()
            for i in range(1, self.count):
                if not self.stopping:
                    self._start(i)
            while self.workers:
                self._pump(0.2)
                self._reap()
            if self.stopping and not self.served and self.exit_code == 0:
                return _INTERRUPTED  # stopped before serving, as one process exits
        finally:
            for w in self.workers.values():
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
            if self._reserved is not None:
                self._reserved.close()
        return self.exit_code

    def _fixed_listen(self) -> str:
        """Port 0 means "any free port": pick one here so every worker binds the
        same one (a socket bound with SO_REUSEPORT keeps it reserved)."""
        host, _, port = self.settings.listen.rpartition(":")
        if port != "0":
            return self.settings.listen
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), 0))
        self._reserved = sock
        return f"{host}:{sock.getsockname()[1]}"

    def _start(self, index: int, *, restart: bool = False) -> None:
        # the table is created once, by the first worker
        config = (replace(self.settings, metrics_listen=_metrics_listen(self.settings.metrics_listen, index)),
                  self.create_table and index == 0, logging.getLogger().level, _json_logs())
        proc = subprocess.Popen(
            [sys.executable, "-m", "fencepost_server.workers"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "FENCEPOST_WORKER": str(index), "FENCEPOST_SUPERVISOR_PID": str(os.getpid())},
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(pickle.dumps(config))
        proc.stdin.close()
        os.set_blocking(proc.stdout.fileno(), False)
        worker = _Worker(index, proc, time.monotonic(), restart=restart)
        self._selector.register(proc.stdout, selectors.EVENT_READ, worker)
        self.workers[index] = worker
        _write(b"fencepost worker %d started (pid %d)\n" % (index, proc.pid))
        if self.stopping:  # the stop came while it was being started: it gets it too
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def _pump(self, timeout: float) -> None:
        """Relay the workers' output line by line (a worker's lines never interleave)."""
        for key, _ in self._selector.select(timeout):
            worker: _Worker = key.data
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self._selector.unregister(key.fileobj)
                continue
            *lines, worker.pending = (worker.pending + chunk).split(b"\n")
            out = []
            for line in lines:
                if not worker.ready and line.startswith(READY_LINE):
                    worker.ready = self.served = True
                    if worker.reload_owed:
                        worker.reload_owed = False
                        with contextlib.suppress(ProcessLookupError):
                            worker.proc.send_signal(signal.SIGHUP)
                if line.startswith(b"fencepost "):  # its banners: say whose (log lines name it already)
                    line = b"[worker %d] " % worker.index + line
                out.append(line + b"\n")
            _write(b"".join(out))

    def _reap(self) -> None:
        for index, worker in list(self.workers.items()):
            code = worker.proc.poll()
            if code is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(worker.proc.stdout)
            del self.workers[index]
            if self.stopping:
                self._stopped(worker, code)
                continue
            if code in _CANNOT_START and not worker.ready and not worker.restart:
                # the configuration cannot run here (its cause is the worker's
                # log line): fail as one process would, never restart forever
                log.error("worker %d (pid %d) could not start (exit %d); stopping the server",
                          index, worker.proc.pid, code)
                self.exit_code = code
                self._on_stop(signal.SIGTERM, None)
                continue
            log.warning("worker %d (pid %d) exited with code %s; restarting it", index, worker.proc.pid, code)
            if not worker.ready or time.monotonic() - worker.started < _RESTART_PAUSE:
                time.sleep(_RESTART_PAUSE)  # crash loop: do not spin
            if self.stopping:  # stopped during the pause: every worker was told, start none
                continue
            self._start(index, restart=True)

    def _stopped(self, worker: _Worker, code: int) -> None:
        """A worker that exited after the stop: 0 (drained), 130 (stopped
        before it served) or killed by the SIGTERM itself is clean; anything
        else failed the stop, and the supervisor exits 1 as one process whose
        drain failed would (a first start's failure keeps its own code)."""
        if code in _STOPPED_CLEANLY:
            return
        what = "failed while stopping" if worker.ready else "could not start"
        log.error("worker %d (pid %d) %s (exit %d)", worker.index, worker.proc.pid, what, code)
        if self.exit_code == 0:
            first_start = not worker.ready and not worker.restart and code in _CANNOT_START
            self.exit_code = code if first_start else _ERROR

    def _signal_all(self, sig: int) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(sig)

    def _on_stop(self, signum: int, _frame: Any) -> None:
        self.stopping = True
        self._signal_all(signal.SIGTERM)

    def _on_reload(self, signum: int, _frame: Any) -> None:
        # A worker that is still starting may not handle SIGHUP yet (its
        # default action kills it) and may have read the identity files
        # before this edit: it gets the signal once it says it serves (by
        # then its handler is installed), so no worker keeps a revoked token.
        for worker in self.workers.values():
            if not worker.ready:
                worker.reload_owed = True
                continue
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(signal.SIGHUP)


def _write(data: bytes) -> None:
    """Out on stdout; a reader that has gone never stops the server."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()


def stdout_gone() -> None:
    """Nobody reads stdout any more: send it to /dev/null, so later lines (and
    the interpreter's flush at exit) do not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _metrics_listen(listen: str | None, index: int) -> str | None:
    """Worker i serves /metrics on the given port + i (port 0: any free port)."""
    if not listen:
        return listen
    host, _, port = listen.rpartition(":")
    return listen if int(port) == 0 else f"{host}:{int(port) + index}"


def _json_logs() -> bool:
    from .observability import JsonFormatter

    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this worker when the supervisor dies (Linux)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    # the supervisor died before we asked: we were handed to pid 1 or to a
    # subreaper (tini -s, a container runtime), either way not our supervisor
    supervisor = int(os.environ.get("FENCEPOST_SUPERVISOR_PID") or 0)
    if os.getppid() == 1 or (supervisor and os.getppid() != supervisor):
        os._exit(1)


def _worker_main() -> int:
    _die_with_parent()
    settings, create_table, level, json_logs = pickle.loads(sys.stdin.buffer.read())
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        from .observability import JsonFormatter

        index = int(os.environ.get("FENCEPOST_WORKER", "-1"))

        def name_the_worker(record: logging.LogRecord) -> bool:
            record.worker = index  # a field of every JSON line, as worker-i is of a text one
            return True

        handler.addFilter(name_the_worker)
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s worker-{os.environ.get('FENCEPOST_WORKER', '?')} %(name)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    from . import tracing
    from .cli import quiet_libraries, serve as serve_one
    from .startup import ConfigError, StartFailure

    quiet_libraries()

    try:
        tracing_line = tracing.configure_from_env()  # checked by the supervisor already
        return run_loop(serve_one(settings, create_table=create_table, tracing_line=tracing_line), settings.uvloop)
    except KeyboardInterrupt:  # a Ctrl-C before the loop handles SIGINT: stopped before serving, as one process
        return _INTERRUPTED
    except (ConfigError, StartFailure) as exc:  # logged; the supervisor stops (first start) or restarts it
        log.error("worker %s cannot start: %s", os.environ.get("FENCEPOST_WORKER", "?"), exc)
        return _USAGE if isinstance(exc, ConfigError) else _START_FAILED
    except Exception as exc:  # as `fencepost serve` does: one line, the traceback only at DEBUG
        log.debug("failed", exc_info=exc)
        log.error("worker %s failed: unexpected %s: %s", os.environ.get("FENCEPOST_WORKER", "?"),
                  type(exc).__name__, exc)
        return _ERROR
    finally:
        tracing.shutdown()


if __name__ == "__main__":
    sys.exit(_worker_main())
