"""Journal appends at 64 concurrent writers on ONE agent (the case that broke
the client-side journal of seed 000), next to that old pattern simulated
through the same server: GET the whole journal with its version, append a
line, conditional PUT, retry (jittered backoff) on conflict.

Both lanes run against one in-process server over CountingStorage(SQLite),
driven by the same harness (N appends, 64 in flight), so the figures compare
like with like; the counting wrapper gives backend reads per append.

    python -m bench.journal            (or through `make bench`: run(report))
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import fencepost
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.domain.limits import Limits
from fencepost_server.storage.counting import CountingStorage
from fencepost_server.storage.sqlite import SqliteStorage

Report = Callable[..., None]

WRITERS = 64
FENCEPOST_APPENDS = 3000
CAS_APPENDS = 600
READS = ("get", "get_with_version", "list", "list_keys")


def _record(i: int) -> dict[str, Any]:
    # A typical turn record: ~1 KiB of compact JSON.
    return {
        "at": "2025-01-01T00:00:00Z", "sessionId": f"s{i % 50}", "channelId": "c1", "status": "completed",
        "title": "turn", "userMessage": "u" * 200, "result": "r" * 700, "usage": {"inputTokens": 1200},
    }


async def _drive(append: Callable[[int], Awaitable[None]], total: int) -> float:
    """`total` appends with WRITERS in flight; returns appends/s."""
    next_i = 0

    async def writer() -> None:
        nonlocal next_i
        while next_i < total:
            i = next_i
            next_i += 1
            await append(i)

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(WRITERS)))
    return total / (time.perf_counter() - started)


def _reads(counting: CountingStorage) -> int:
    return sum(counting.calls[op] for op in READS)


async def _serve(counting: CountingStorage, **settings: Any) -> App:
    # The CAS lane's journal is one KV value that grows past the 256 KiB value
    # limit; raise the limit so the old pattern can run at all.
    app = App(
        Settings(listen="127.0.0.1:0", limits=Limits(max_value_bytes=64 << 20), max_receive_bytes=64 << 20,
                 ledger_janitor=False,
                 **settings),
        storage=counting,
    )
    await app.start()
    return app


_REPORT: list[Report] = []


async def run(report: Report) -> None:
    _REPORT[:] = [report]
    with tempfile.TemporaryDirectory() as tmp:
        counting = CountingStorage(SqliteStorage(Path(tmp) / "bench.db"))
        app = await _serve(counting)
        opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        try:
            async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=60.0, options=opts) as fp:
                # -- fencepost: one blind write per append, background flusher on
                counting.reset()

                async def append_turn(i: int) -> None:
                    await fp.append_turn("bench-agent", _record(i))

                rate = await _drive(append_turn, FENCEPOST_APPENDS)
                reads_total = _reads(counting)
                writes = dict(counting.calls)
                report(
                    f"fencepost AppendTurn, {WRITERS} writers, one agent, sqlite",
                    appends_per_s=rate, backend_reads_per_append=reads_total / FENCEPOST_APPENDS,
                    backend_calls=writes,
                )
                counting.reset()
                got = await fp.read_journal("bench-agent")
                assert got is not None and got.record_count == FENCEPOST_APPENDS
                report("fencepost ReadJournal after the run (flush-on-read)",
                       records=got.record_count, bytes=got.size_bytes, backend_calls=dict(counting.calls))

                # -- the old pattern: GET whole journal + conditional PUT, retried
                counting.reset()
                attempts = 0
                line = fencepost.journal.compact_json(_record(0)) + b"\n"

                async def cas_append(i: int) -> None:
                    nonlocal attempts
                    delay = 0.001
                    while True:
                        attempts += 1
                        cur = await fp.get_with_version("journal/bench-agent.jsonl")
                        if cur is None:
                            res = await fp.put_if_absent("journal/bench-agent.jsonl", line)
                        else:
                            res = await fp.put_if_version("journal/bench-agent.jsonl", cur.value + line, cur.version)
                        if res.applied:
                            return
                        await asyncio.sleep(random.uniform(0, delay))
                        delay = min(delay * 2, 0.05)

                cas_rate = await _drive(cas_append, CAS_APPENDS)
                report(
                    f"client-side CAS journal, {WRITERS} writers, one key, sqlite",
                    appends_per_s=cas_rate, backend_reads_per_append=_reads(counting) / CAS_APPENDS,
                    attempts_per_append=attempts / CAS_APPENDS, final_journal_bytes=CAS_APPENDS * len(line),
                    backend_calls=dict(counting.calls),
                )
                report("journal ratio", fencepost_vs_cas_appends_per_s=rate / cas_rate)
        finally:
            await app.stop(grace=0)
        await _request_path(Path(tmp))


async def _request_path(tmp: Path) -> None:
    """Backend calls of the append path alone (background flusher idle)."""
    counting = CountingStorage(SqliteStorage(tmp / "path.db"))
    app = await _serve(counting, journal_flush_seconds=3600.0, journal_flush_bytes=1 << 40)
    try:
        async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=60.0) as fp:
            counting.reset()
            for i in range(100):
                await fp.append_turn("path-agent", _record(i))
            _REPORT[0](
                "fencepost AppendTurn request path (100 appends, flusher idle)",
                backend_reads_per_append=_reads(counting) / 100, backend_calls=dict(counting.calls),
            )
    finally:
        await app.stop(grace=0)


def _print(name: str, **figures: Any) -> None:
    print(f"{name:<60} " + "  ".join(f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(run(_print))
