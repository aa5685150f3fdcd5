"""Memory read latency for agents with 1k and 10k entries.

Search and List p50 through a real server over SQLite (the default backend),
plus the same reads against the domain directly (no gRPC) and the cold fold
of a replica that has never seen the agent. The cached fold is what keeps
10k within a small factor of 1k: a warm read costs one `list` after the
cached head, never a replay of the lane.

    python -m bench.memory         (or via `make bench` once bench/__main__ runs it)
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import fencepost
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.domain.memory import Entry, MemoryStore
from fencepost_server.storage.sqlite import SqliteStorage

SIZES = (1_000, 10_000)
CALLS = 300
TENANT = "default"


async def _p50(call: Callable[[int], Awaitable[Any]], n: int = CALLS) -> float:
    for i in range(20):  # warm up
        await call(i)
    samples = []
    for i in range(n):
        started = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


async def _populate(memory: MemoryStore, agent: str, n: int) -> None:
    base = 1_700_000_000_000_000
    batch = [
        Entry(f"e{i}", f"fact {i} about topic{i % 50}: word{i} is stored", base + i * 1000, about=(f"topic{i % 50}",))
        for i in range(n)
    ]
    for start in range(0, n, 1000):
        await memory.import_entries(TENANT, agent, batch[start:start + 1000])


async def run(report: Callable[..., None]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        storage = SqliteStorage(Path(tmp) / "bench.db", synchronous="NORMAL")
        loader = MemoryStore(storage)
        results: dict[int, dict[str, float]] = {}
        for n in SIZES:
            await _populate(loader, f"agent-{n}", n)
        app = App(Settings(listen="127.0.0.1:0"), storage=storage)
        await app.start()
        try:
            async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=30.0) as client:
                for n in SIZES:
                    agent = f"agent-{n}"
                    cold = MemoryStore(storage)
                    started = time.perf_counter()
                    await cold.list(TENANT, agent, limit=20)
                    cold_ms = (time.perf_counter() - started) * 1e3
                    figures = {
                        "search_one_p50_us": await _p50(lambda i: client.memory_search(agent, f"word{(i * 7919) % n}")),
                        "search_topic_p50_us": await _p50(lambda i: client.memory_search(agent, f"topic{i % 50}")),
                        "search_topic_relevance_p50_us": await _p50(
                            lambda i: client.memory_search(agent, f"topic{i % 50}", strategy="relevance")
                        ),
                        "search_topic_hybrid_p50_us": await _p50(
                            lambda i: client.memory_search(agent, f"topic{i % 50}", strategy="hybrid")
                        ),
                        "list_limit20_p50_us": await _p50(lambda i: client.memory_list(agent, limit=20)),
                        "list_page100_p50_us": await _p50(lambda i: client.memory_list(agent, page_size=100)),
                        "domain_search_p50_us": await _p50(
                            lambda i: cold.search(TENANT, agent, f"word{(i * 7919) % n}")
                        ),
                        "domain_list_p50_us": await _p50(lambda i: cold.list(TENANT, agent, limit=20)),
                        "cold_fold_ms": cold_ms,
                    }
                    results[n] = figures
                    report(f"memory.read entries={n}", **{k: round(v, 1) for k, v in figures.items()})
        finally:
            await app.stop(grace=0.5)  # closes the storage
        small, large = results[SIZES[0]], results[SIZES[-1]]
        report(
            f"memory.read ratio {SIZES[-1]}/{SIZES[0]} (target < 3)",
            **{k: round(large[k] / small[k], 2) for k in small if k.endswith("_us")},
        )


def _print_row(name: str, **figures: object) -> None:
    print(f"{name:45s} " + "  ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(run(_print_row))
