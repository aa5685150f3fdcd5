"""A bounded load generator: workers run steps until a step count or a time
limit is reached, whichever comes first. Loopback only. Used by the
reliability suite (tests/reliability) and by `make bench` (run below).

    load = BoundedLoad(max_steps=10_000, max_seconds=60)
    steps = await load.run([worker_a, worker_b])   # each: async () -> None
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable, Sequence

Step = Callable[[], Awaitable[object]]


def assert_loopback(target: str) -> None:
    """Refuse to generate load against anything but this machine."""
    host = target.rsplit(":", 1)[0].strip("[]")
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"load only runs against loopback, not {target}")


class BoundedLoad:
    def __init__(self, *, max_steps: int, max_seconds: float) -> None:
        if max_steps <= 0 or max_seconds <= 0:
            raise ValueError("a load needs a positive step count and time limit")
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.steps = 0
        self.errors = 0
        self.deadline = 0.0
        self.stopped = False

    def take(self) -> bool:
        """Reserve one step; False once either limit is reached."""
        if self.stopped or self.steps >= self.max_steps or time.monotonic() >= self.deadline:
            return False
        self.steps += 1
        return True

    def stop(self) -> None:
        self.stopped = True

    async def _loop(self, step: Step) -> None:
        while self.take():
            await step()

    async def run(self, workers: Sequence[Step], *, background: Sequence[Step] = ()) -> int:
        """Run every worker's step in a loop; `background` tasks (e.g. a
        killer) run alongside and are cancelled when the load ends."""
        self.deadline = time.monotonic() + self.max_seconds
        extra = [asyncio.ensure_future(b()) for b in background]
        try:
            await asyncio.gather(*(self._loop(w) for w in workers))
        finally:
            for task in extra:
                task.cancel()
            await asyncio.gather(*extra, return_exceptions=True)
        return self.steps


async def run(report: Callable[..., None]) -> None:
    """`make bench`: a bounded mixed KV load (CAS read-modify-write + gets)
    against a SQLite server subprocess on loopback."""
    import tempfile
    import uuid

    import fencepost

    from .harness import fencepost_server, free_port

    port = free_port()
    target = f"127.0.0.1:{port}"
    assert_loopback(target)
    with tempfile.TemporaryDirectory() as tmp, fencepost_server(port, f"sqlite://{tmp}/load.db"):
        async with fencepost.AsyncClient(target, timeout=30) as client:
            for concurrency in (1, 16):
                keys = [f"load/{uuid.uuid4().hex[:8]}/{i}" for i in range(concurrency)]

                def worker(key: str) -> Step:
                    async def step() -> None:
                        entry = await client.get_with_version(key)
                        if entry is None:
                            await client.put_if_absent(key, b"0")
                        else:
                            await client.put_if_version(key, str(int(entry.value) + 1).encode(), entry.version)
                    return step

                load = BoundedLoad(max_steps=3000, max_seconds=5.0)
                started = time.perf_counter()
                steps = await load.run([worker(k) for k in keys])
                elapsed = time.perf_counter() - started
                report(f"load cas-increment sqlite concurrency={concurrency}", steps=steps,
                       steps_per_s=steps / elapsed, rpcs_per_s=2 * steps / elapsed)
