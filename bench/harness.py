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
from dataclasses import dataclass


@dataclass
class Result:
    calls: int
    seconds: float
    p50_ms: float
    p99_ms: float

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
def subprocess_server(
    args: list[str], port: int, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    try:
        wait_port(port)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def fencepost_server(
    port: int, backend: str, *extra: str
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    return subprocess_server(
        ["-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{port}", "--backend", backend,
         "--log-level", "WARNING", *extra],
        port,
    )


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
