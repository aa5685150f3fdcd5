"""Scale: what one page of every listing costs as the data behind it grows.

For each size (1k and 10k items; also 100k with FENCEPOST_FULL_SCALE=1, the
switch `make reliability` uses for its full counts) a fresh SQLite store is
filled through the domain, then served by a real server process:

    sessions   ListSessions: first page, and a page half way down the listing
    records    ReadLog of one session: first page, and the tail
    keys       KV List: first page, and a page half way down
    inbox      ListInbox: first page of a session with that many pending events
    entries    memory List (first page, half way) and Search; the cold fold
    reminders  the reminder fold of the long session: cold and warm (domain only)

Each row gives the page's p50 over gRPC (one server process per size, all
running at once and measured in turns, so load drifting on this shared
machine hits every size alike), the backend calls one page costs (the same
call through the domain over CountingStorage), and each server's RSS after
the ListSessions pages (`rss_mb`) and after everything (`rss_end_mb`: the
memory fold holds an agent's entries in memory, by design).

    python -m bench.scale        (or `make bench ARGS=scale`)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import fencepost
from fencepost_server.domain.keys import TenantKeys
from fencepost_server.domain.kv import KvStore
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.ledger.layout import encode_event, new_inbox_id
from fencepost_server.domain.memory import Entry, MemoryStore
from fencepost_server.domain.requests import RequestLog
from fencepost_server.domain.schedule.service import Schedule
from fencepost_server.storage import Put, Storage
from fencepost_server.storage.counting import CountingStorage
from fencepost_server.storage.sqlite import SqliteStorage

from .harness import fencepost_server, free_port

FULL = os.environ.get("FENCEPOST_FULL_SCALE") == "1"
SIZES = (1_000, 10_000, 100_000) if FULL else (1_000, 10_000)
CALLS = 100
PAGE = 100
TENANT = "default"
AGENT = "scale"
MANY = 2**31 - 1  # caps that never bind: page through the whole listing

Report = Callable[..., None]


async def _calls(storage: CountingStorage, call: Callable[[], Awaitable[Any]]) -> int:
    await call()  # warm: caches and one-time index checks
    storage.reset()
    await call()
    return storage.total()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# -- filling a store ---------------------------------------------------------------
async def _fill(storage: Storage, n: int) -> dict[str, Any]:
    ledger = Ledger(storage)
    started = time.perf_counter()
    sids: list[str] = []
    for start in range(0, n, 200):  # sessions: open, acquire, one commit each
        async def one(i: int) -> str:
            view, _ = await ledger.open(TENANT, AGENT, f"user-{i}")
            g = (await ledger.acquire(TENANT, view.session_id, "bench", ttl=3600)).generation
            await ledger.commit(TENANT, view.session_id, g, 0, [b"r" * 200])
            return view.session_id

        sids += await asyncio.gather(*(one(i) for i in range(start, min(n, start + 200))))
    log_view, _ = await ledger.open(TENANT, "scale-log", "long")  # records: one long session
    g = (await ledger.acquire(TENANT, log_view.session_id, "bench", ttl=3600)).generation
    seq = 0
    while seq < n:
        take = min(64, n - seq)
        await ledger.commit(TENANT, log_view.session_id, g, seq, [b"%d" % (seq + i) for i in range(take)])
        seq += take
    sk = ledger.keys(TENANT, log_view.session_id)  # inbox: that session's pending events
    for start in range(0, n, 100):
        puts = []
        for i in range(start, min(n, start + 100)):
            inbox_id = new_inbox_id(1_700_000_000 + i / 1000)
            puts.append(Put(sk.inbox_key(inbox_id), encode_event({"t": 1_700_000_000.0, "d": ""}, b"event")))
        await storage.transact((), puts)
    keys = TenantKeys(TENANT)  # keys: plain KV keys
    for start in range(0, n, 100):
        await storage.transact((), [Put(keys.kv(f"k/{i:08d}"), b"v" * 100) for i in range(start, min(n, start + 100))])
    memory = MemoryStore(storage)  # entries
    base = 1_700_000_000_000_000
    entries = [Entry(f"e{i}", f"fact {i} about topic{i % 50}: word{i}", base + i * 1000, about=(f"topic{i % 50}",))
               for i in range(n)]
    for start in range(0, n, 1000):
        await memory.import_entries(TENANT, AGENT, entries[start:start + 1000])
    return {"log": log_view.session_id, "fill_s": time.perf_counter() - started}


# -- one size, in process: fill, and count the calls one page costs --------------------
async def _prepare(report: Report, n: int, path: Path) -> dict[str, Any]:
    storage = SqliteStorage(path, synchronous="OFF")
    filled = await _fill(storage, n)
    counting = CountingStorage(storage)
    ledger, memory = Ledger(counting), MemoryStore(counting)
    kv = KvStore(counting, Limits(), RequestLog(counting))
    # Backend calls per page, through the domain (what the servicer calls).
    half_sessions = await _deep_session_token(ledger, n)
    log_sid = filled["log"]
    calls = {
        "sessions first": await _calls(counting, lambda: ledger.list_sessions(
            TENANT, AGENT, MANY, 1e9, MANY, PAGE)),
        "sessions deep": await _calls(counting, lambda: ledger.list_sessions(
            TENANT, AGENT, MANY, 1e9, MANY, PAGE, half_sessions)),
        "records first": await _calls(counting, lambda: _first_log_page(ledger, log_sid, 1)),
        "records tail": await _calls(counting, lambda: _first_log_page(ledger, log_sid, n - PAGE + 1)),
        "keys": await _calls(counting, lambda: kv.list(TENANT, "k/", PAGE, "")),
        "inbox": await _calls(counting, lambda: ledger.list_inbox(TENANT, log_sid, PAGE)),
        "entries list": await _calls(counting, lambda: memory.list(TENANT, AGENT, size=PAGE)),
        "entries search": await _calls(counting, lambda: memory.search(TENANT, AGENT, "topic7 word7")),
    }
    cold = CountingStorage(storage)
    started = time.perf_counter()
    await MemoryStore(cold).list(TENANT, AGENT, size=PAGE)
    calls["cold fold ms"], calls["cold fold calls"] = (time.perf_counter() - started) * 1e3, cold.total()
    # Reminders fold the session's log: cold (a replica that never saw it), then warm.
    reminders = Schedule(Ledger(cold))
    figures: dict[str, float] = {}
    for phase in ("cold", "warm"):
        cold.reset()
        started = time.perf_counter()
        await reminders.list(TENANT, log_sid, size=PAGE)
        figures[f"{phase}_ms"], figures[f"{phase}_calls"] = (time.perf_counter() - started) * 1e3, cold.total()
    report(f"scale reminders fold n={n}", **figures)
    await storage.close()
    return {"n": n, "path": path, "log": log_sid, "calls": calls, "fill_s": filled["fill_s"]}


# -- every size served side by side, measured in interleaved rounds ----------------------
ROUNDS = 5


async def _interleaved(calls: dict[int, Callable[[], Awaitable[Any]]]) -> dict[int, float]:
    """p50 per size, the sizes taking turns (load on this shared machine drifts)."""
    samples: dict[int, list[float]] = {n: [] for n in calls}
    for call in calls.values():
        for _ in range(5):
            await call()
    for _ in range(ROUNDS):
        for n, call in calls.items():
            for _ in range(CALLS // ROUNDS):
                started = time.perf_counter()
                await call()
                samples[n].append(time.perf_counter() - started)
    return {n: statistics.median(v) * 1e3 for n, v in samples.items()}


async def _serve_all(report: Report, sizes: list[dict[str, Any]]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        clients, procs = {}, {}
        for size in sizes:
            port = free_port()
            procs[size["n"]] = stack.enter_context(fencepost_server(port, f"sqlite://{size['path']}"))
            clients[size["n"]] = await stack.enter_async_context(
                fencepost.AsyncClient(f"127.0.0.1:{port}", timeout=120))
        await _measure_all(report, sizes, clients, procs)


async def _measure_all(report: Report, sizes: list[dict[str, Any]], clients: dict[int, Any],
                       procs: dict[int, Any]) -> None:
    by_n = {size["n"]: size for size in sizes}

    def sessions(c: Any, token: str = "", size: int = PAGE) -> Awaitable[Any]:
        return c.list_sessions_page(AGENT, max_sessions=MANY, max_age=1e9, max_total_bytes=MANY,
                                    page_size=size, page_token=token)

    deep = {n: await _deep_token(lambda t, c=c, n=n: sessions(c, t, _stride(n)), n) for n, c in clients.items()}
    first_ms = await _interleaved({n: (lambda c=c: sessions(c)) for n, c in clients.items()})
    deep_ms = await _interleaved({n: (lambda c=c, n=n: sessions(c, deep[n])) for n, c in clients.items()})
    for n in clients:
        calls = by_n[n]["calls"]
        report(f"scale sessions n={n}", first_p50_ms=first_ms[n], deep_p50_ms=deep_ms[n],
               calls_first=calls["sessions first"], calls_deep=calls["sessions deep"],
               rss_mb=_rss_mb(procs[n].pid), fill_s=by_n[n]["fill_s"])

    async def log_page(c: Any, sid: str, from_seq: int) -> None:
        async for _ in c.read_log(sid, from_seq=from_seq, limit=PAGE):
            pass

    first = await _interleaved({n: (lambda c=c, n=n: log_page(c, by_n[n]["log"], 1)) for n, c in clients.items()})
    tail = await _interleaved({n: (lambda c=c, n=n: log_page(c, by_n[n]["log"], n - PAGE + 1))
                               for n, c in clients.items()})
    for n in clients:
        calls = by_n[n]["calls"]
        report(f"scale records n={n}", first_p50_ms=first[n], tail_p50_ms=tail[n],
               calls_first=calls["records first"], calls_tail=calls["records tail"])

    kv_deep = {n: await _deep_token(lambda t, c=c, n=n: c.list_page("k/", page_size=_stride(n), page_token=t), n)
               for n, c in clients.items()}
    first = await _interleaved({n: (lambda c=c: c.list_page("k/", page_size=PAGE)) for n, c in clients.items()})
    deeper = await _interleaved({n: (lambda c=c, n=n: c.list_page("k/", page_size=PAGE, page_token=kv_deep[n]))
                                 for n, c in clients.items()})
    for n in clients:
        report(f"scale keys n={n}", first_p50_ms=first[n], deep_p50_ms=deeper[n], calls_page=by_n[n]["calls"]["keys"])

    async def inbox_page(c: Any, sid: str) -> None:
        got = 0
        async for _ in c.list_inbox(sid, page_size=PAGE):
            got += 1
            if got == PAGE:
                break

    first = await _interleaved({n: (lambda c=c, n=n: inbox_page(c, by_n[n]["log"])) for n, c in clients.items()})
    for n in clients:
        report(f"scale inbox n={n}", first_p50_ms=first[n], calls_page=by_n[n]["calls"]["inbox"])

    mem_deep = {n: await _deep_token(lambda t, c=c, n=n: _memory_page(c, t, _stride(n)), n)
                for n, c in clients.items()}
    first = await _interleaved({n: (lambda c=c: _memory_page(c, "", PAGE)) for n, c in clients.items()})
    deeper = await _interleaved({n: (lambda c=c, n=n: _memory_page(c, mem_deep[n], PAGE)) for n, c in clients.items()})
    search = await _interleaved({n: (lambda c=c: c.memory_search(AGENT, "topic7 word7")) for n, c in clients.items()})
    for n in clients:
        calls = by_n[n]["calls"]
        report(f"scale entries n={n}", list_first_p50_ms=first[n], list_deep_p50_ms=deeper[n],
               search_p50_ms=search[n], calls_list=calls["entries list"], calls_search=calls["entries search"],
               cold_fold_ms=calls["cold fold ms"], cold_fold_calls=calls["cold fold calls"],
               rss_end_mb=_rss_mb(procs[n].pid))


async def _memory_page(c: fencepost.AsyncClient, token: str, size: int) -> tuple[list[Any], str]:
    res = await c.memory_list(AGENT, page_size=size, page_token=token)
    return list(res.entries), res.next_page_token


def _stride(n: int) -> int:
    """Page size used to walk to the middle of a listing of n items."""
    return max(PAGE, min(1000, n // 10))


async def _deep_token(page: Callable[[str], Awaitable[tuple[list[Any], str]]], n: int) -> str:
    """The token of the page half way down a listing of n items."""
    token, seen = "", 0
    while seen < n // 2:
        items, token = await page(token)
        seen += len(items)
        if not token:
            break
    return token


async def _deep_session_token(ledger: Ledger, n: int) -> str:
    return await _deep_token(lambda t: ledger.list_sessions(TENANT, AGENT, MANY, 1e9, MANY, _stride(n), t), n)


async def _first_log_page(ledger: Ledger, sid: str, from_seq: int) -> None:
    async for _ in ledger.read_log(TENANT, sid, from_seq, PAGE):
        break


async def run(report: Report) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sizes = [await _prepare(report, n, Path(tmp) / f"scale-{n}.db") for n in SIZES]
        await _serve_all(report, sizes)


def _print(name: str, **figures: Any) -> None:
    print(f"{name:28s} " + "  ".join(f"{k}={round(v, 2) if isinstance(v, float) else v}"
                                      for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(run(_print))
