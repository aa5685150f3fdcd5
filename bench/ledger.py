"""Ledger benchmarks: RPC throughput through a real server on loopback, and
backend calls per RPC counted with CountingStorage (on DynamoDB also the
HTTP requests sent, by operation).

    python -m bench.ledger            (or through `make bench`: run(report))
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import fencepost
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage import Storage
from fencepost_server.storage.counting import CountingStorage
from fencepost_server.storage.dynamodb import DynamoStorage
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.dynamo_support import REGION, moto_endpoint, unique_table

Report = Callable[..., None]
SECONDS = 1.5


async def _serve(storage: Storage) -> App:
    app = App(Settings(listen="127.0.0.1:0", ledger_janitor=False), storage=storage)
    await app.start()
    return app


async def _rate(workers: list[Callable[[], Awaitable[Any]]]) -> float:
    done = 0
    stop = time.perf_counter() + SECONDS

    async def loop(op: Callable[[], Awaitable[Any]]) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await op()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in workers))
    return done / (time.perf_counter() - started)


async def _throughput(report: Report, backend: str, storage: Storage) -> None:
    app = await _serve(storage)
    try:
        async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=30) as c:
            for inflight in (1, 64):
                tag = uuid.uuid4().hex[:6]
                sids = [(await c.open_session("bench", f"{tag}-{i}")).session_id for i in range(inflight)]

                def acquirer(sid: str) -> Callable[[], Awaitable[Any]]:
                    return lambda: c.acquire_lease(sid, "bench-holder", ttl=60)

                acquire = await _rate([acquirer(s) for s in sids])
                gens = {s: (await c.acquire_lease(s, "bench-holder", ttl=600)).generation for s in sids}
                seqs = {s: 0 for s in sids}

                def committer(sid: str) -> Callable[[], Awaitable[Any]]:
                    async def op() -> None:
                        seqs[sid] = (await c.commit(sid, gens[sid], seqs[sid], [b"x" * 200])).seq
                    return op

                commit = await _rate([committer(s) for s in sids])

                def deliverer(sid: str) -> Callable[[], Awaitable[Any]]:
                    return lambda: c.deliver(b"e" * 200, session_id=sid)

                deliver = await _rate([deliverer(s) for s in sids])
                report(
                    f"ledger rpc/s {backend} inflight={inflight}",
                    commit=round(commit), deliver=round(deliver), acquire=round(acquire),
                )
    finally:
        await app.stop(grace=0.5)


async def _costs(report: Report, backend: str, storage: Storage) -> None:
    counting = CountingStorage(storage)
    app = await _serve(counting)
    n = 50
    sent: Counter[str] = Counter()
    if isinstance(storage, DynamoStorage):
        def before_send(**kwargs: Any) -> None:
            sent[kwargs["event_name"].rsplit(".", 1)[-1]] += 1

        (await storage.client()).meta.events.register("before-send.dynamodb", before_send)
    try:
        async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=30) as c:
            sids = [(await c.open_session("cost", f"{uuid.uuid4().hex}")).session_id for _ in range(n)]

            async def per_rpc(fn: Callable[[str], Awaitable[Any]]) -> dict[str, float]:
                counting.reset()
                sent.clear()
                for sid in sids:
                    await fn(sid)
                calls = {k: v / n for k, v in counting.calls.items()}
                calls["total"] = counting.total() / n
                calls.update({f"http.{k}": v / n for k, v in sent.items()})
                return calls

            acquire = await per_rpc(lambda s: c.acquire_lease(s, "h", ttl=60))
            gens = {s: (await c.get_session(s)).lease.generation for s in sids}
            renew = await per_rpc(lambda s: c.renew_lease(s, gens[s], ttl=60, holder_id="h"))
            inbox: dict[str, str] = {}

            async def deliver(s: str) -> None:
                inbox[s] = (await c.deliver(b"e", session_id=s)).inbox_id

            deliver_calls = await per_rpc(deliver)
            commit = await per_rpc(lambda s: c.commit(s, gens[s], 0, [b"r"], consume=[inbox[s]]))
            for s in sids:
                await c.release_lease(s, gens[s])
            deliver_lease = await per_rpc(lambda s: c.deliver(b"e", session_id=s, try_lease="courier", ttl=60))
            for name, calls in (
                ("commit+drain", commit), ("acquire", acquire), ("renew", renew),
                ("deliver", deliver_calls), ("deliver+try_lease", deliver_lease),
            ):
                report(f"ledger backend calls/rpc {backend} {name}", **{k: round(v, 2) for k, v in calls.items()})
    finally:
        await app.stop(grace=0.5)


async def run(report: Report) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await _costs(report, "memory", MemoryStorage())
        await _costs(report, "sqlite", SqliteStorage(Path(tmp) / "cost.db"))
        dynamo = DynamoStorage(unique_table(), endpoint_url=moto_endpoint(), region=REGION)
        try:
            await dynamo.create_table()
            await _costs(report, "dynamodb", dynamo)
        finally:
            await dynamo.close()
        await _throughput(report, "memory", MemoryStorage())
        await _throughput(report, "sqlite", SqliteStorage(Path(tmp) / "bench.db"))


def _print(name: str, **figures: Any) -> None:
    print(f"{name:55s} " + "  ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(run(_print))
