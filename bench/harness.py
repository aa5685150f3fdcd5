"""A bounded load harness: N calls at a given concurrency, calls/s and latency
percentiles. Servers run as subprocesses on loopback so the server and the
load generator each get a core of this 2-core machine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Result:
    calls: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_us: float | None = None  # server CPU per call, when measured
    client_us: float | None = None  # this (client) process's CPU per call

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0


async def measure(call: Callable[[int], Awaitable[object]], *, concurrency: int, total: int,
                  warmup: int = 200) -> Result:
    """Run `total` calls of `call(i)` with `concurrency` in flight."""
    for i in range(min(warmup, total)):
        await call(-1 - i)
    latencies: list[float] = []
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < total:
            i = next_i
            next_i += 1
            t0 = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return Result(len(latencies), elapsed, statistics.median(latencies) * 1e3, p99 * 1e3)


async def measure_for(call: Callable[[int], Awaitable[object]], *, concurrency: int, seconds: float,
                      warmup: float = 0.5, cpu: Callable[[], float] | None = None) -> Result:
    """Closed loop: `concurrency` callers run `call(i)` (i % concurrency is the
    caller's own slot, so per-slot state never races) for `warmup` and then
    `seconds` seconds; latencies and (with `cpu`, a reader of the server's CPU
    seconds) the server's CPU per call count only the measured part."""
    return (await measure_interleaved([(call, cpu)], concurrency=concurrency, seconds=seconds,
                                      warmup=warmup, slices=1))[0]


async def measure_interleaved(targets: list[tuple[Callable[[int], Awaitable[object]], Callable[[], float] | None]],
                              *, concurrency: int, seconds: float, warmup: float = 0.5,
                              slices: int = 1) -> list[Result]:
    """`measure_for` of several targets at once, taking turns: `slices` turns
    of `seconds / slices` each (after one `warmup` each, and a short re-warm-up
    before every later turn), so whatever else runs on this shared machine
    lands on every target alike and their ratios are taken at one moment
    (the order rotates from turn to turn). Each target's figures sum its turns."""
    totals = [_Totals() for _ in targets]
    order = list(range(len(targets)))
    for turn in range(slices):
        for k in order[turn % len(order):] + order[:turn % len(order)]:  # each turn starts with the next target
            call, cpu = targets[k]
            await _closed_loop(call, concurrency, seconds / slices, warmup if turn == 0 else _REWARM, cpu, totals[k])
    return [t.result(cpu is not None) for t, (_, cpu) in zip(totals, targets)]


#: before each later turn of an interleaved measurement: time for the loop to fill again
_REWARM = 0.05


@dataclass
class _Totals:
    seconds: float = 0.0
    cpu: float = 0.0
    client: float = 0.0
    latencies: list[float] = field(default_factory=list)
    #: calls issued per caller slot, carried across turns (each slot's i keeps counting)
    issued: list[int] = field(default_factory=list)

    def result(self, with_cpu: bool) -> Result:
        latencies = sorted(self.latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        result = Result(len(latencies), self.seconds, statistics.median(latencies) * 1e3, p99 * 1e3)
        result.cpu_us = self.cpu / len(latencies) * 1e6 if with_cpu else None
        result.client_us = self.client / len(latencies) * 1e6
        return result


async def _closed_loop(call: Callable[[int], Awaitable[object]], concurrency: int, seconds: float, warmup: float,
                       cpu: Callable[[], float] | None, total: _Totals) -> None:
    latencies = total.latencies
    clock = time.perf_counter
    measuring = False
    stop_at = clock() + warmup
    issued = total.issued = total.issued or [0] * concurrency

    async def caller(slot: int) -> None:
        # caller `slot` issues i = slot, slot + concurrency, ...: i % concurrency is its own
        while True:
            i = slot + concurrency * issued[slot]
            issued[slot] += 1
            t0 = clock()
            if t0 >= stop_at:
                return
            await call(i)
            if measuring:
                latencies.append(clock() - t0)

    await asyncio.gather(*(caller(slot) for slot in range(concurrency)))
    measuring = True
    cpu0 = cpu() if cpu else 0.0
    client0 = time.process_time()
    started = clock()
    stop_at = started + seconds
    await asyncio.gather(*(caller(slot) for slot in range(concurrency)))
    total.seconds += clock() - started
    total.client += time.process_time() - client0
    total.cpu += (cpu() - cpu0) if cpu else 0.0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process `pid` and of its live children
    (a `--workers` supervisor's workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in [pid, *children(pid)]:
        with contextlib.suppress(OSError):
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def connections_per_process(pids: list[int], port: int) -> dict[int, int]:
    """Established TCP connections on local `port` held by each of `pids` (from /proc)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 01: ESTABLISHED
                    inodes.add(f"socket:[{fields[9]}]")
    counts = {}
    for pid in pids:
        n = 0
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    n += os.readlink(f"/proc/{pid}/fd/{fd}") in inodes
        counts[pid] = n
    return counts


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


@contextlib.contextmanager
def subprocess_server(args: list[str], port: int, env: dict[str, str] | None = None,
                      ready: Callable[[], bool] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    try:
        wait_port(port)
        while ready is not None and not ready():
            time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def fencepost_server(port: int, backend: str, *extra: str,
                     workers: int = 1) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """`fencepost serve` as a subprocess; with `workers` > 1 ready once every
    worker runs (a worker binds the shared port a moment after it starts)."""
    args = ["-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{port}", "--backend", backend,
            "--log-level", "WARNING", *extra]
    if workers == 1:
        return subprocess_server(args, port)
    settle = time.monotonic() + 3.0
    return subprocess_server([*args, "--workers", str(workers)], port, ready=lambda: time.monotonic() > settle)


class Reporter:
    """Prints one aligned row per figure set."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, object]]] = []

    def __call__(self, name: str, **figures: object) -> None:
        self.rows.append((name, figures))
        cells = "  ".join(f"{k}={_fmt(v)}" for k, v in figures.items())
        print(f"{name:<48} {cells}", flush=True)

    def result(self, name: str, res: Result, **extra: object) -> None:
        self(name, calls_per_s=res.rate, p50_ms=res.p50_ms, p99_ms=res.p99_ms, **extra)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if v < 100 else f"{v:,.0f}"
    return str(v)
