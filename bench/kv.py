"""The targets of spec/performance.md, as ratios from one run.

Every server runs in a process of its own (so its CPU time per call can be
read from /proc) next to one client process driving all of them with the same
closed-loop harness: a bare grpc.aio echo server (the floor), fencepost over
memory:// and over SQLite through raw stubs, SQLite through the SDK, fenced
ledger commits, and SQLite with `--workers 2` against the same server with one
worker over several client channels. Rounds are interleaved (each round drives
every target in turn, so noise on this shared machine lands on all of them
alike); the median of the rounds is reported, then each target's ratio with
pass/fail, then backend calls per RPC.

    python -m bench kv     FENCEPOST_BENCH_SECONDS=1 FENCEPOST_BENCH_ROUNDS=1 for a quick look
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

import fencepost
from fencepost.v1 import kv_pb2, kv_pb2_grpc, ledger_pb2, ledger_pb2_grpc
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage.counting import CountingStorage
from fencepost_server.storage.memory import MemoryStorage

from .harness import Reporter, Result, cpu_seconds, fencepost_server, free_port, measure_for, subprocess_server

VALUE = b"v" * 200
KEYS = 1000
SECONDS = float(os.environ.get("FENCEPOST_BENCH_SECONDS", "3"))
WARMUP = 0.5
ROUNDS = int(os.environ.get("FENCEPOST_BENCH_ROUNDS", "3"))
CHANNELS = 4  # client channels (TCP connections) for the --workers comparison
#: a channel of its own: grpc would otherwise share one connection among equal channels
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]

Call = Callable[[int], Awaitable[Any]]
Figures = dict[tuple[str, str, int], Result]  # (target, op, in flight) -> result


def _stubs(channels: list[grpc.aio.Channel]) -> list[kv_pb2_grpc.KvServiceStub]:
    return [kv_pb2_grpc.KvServiceStub(ch) for ch in channels]


def _raw_ops(channels: list[grpc.aio.Channel], conc: int) -> dict[str, Call]:
    """put / get / cas through generated stubs, spread over the channels."""
    stubs = _stubs(channels)
    n = len(stubs)
    versions: dict[int, str] = {}

    async def put(i: int) -> None:
        await stubs[i % n].Put(kv_pb2.PutRequest(key=f"bench/{i % KEYS}", value=VALUE))

    async def get(i: int) -> None:
        await stubs[i % n].Get(kv_pb2.GetRequest(key=f"bench/{i % KEYS}"))

    async def cas(i: int) -> None:
        slot = i % conc  # one key per caller slot: the chain of versions never contends
        stub = stubs[i % n]
        res = await stub.PutIfVersion(kv_pb2.PutIfVersionRequest(
            key=f"cas/{slot}", value=VALUE, expected_version=versions[slot]))
        versions[slot] = res.version

    async def seed() -> None:
        for slot in range(conc):
            versions[slot] = (await stubs[0].Put(kv_pb2.PutRequest(key=f"cas/{slot}", value=VALUE))).version

    cas.seed = seed  # type: ignore[attr-defined]
    return {"put": put, "get": get, "cas": cas}


def _sdk_ops(client: fencepost.AsyncClient, conc: int) -> dict[str, Call]:
    """The same through the SDK: its CAS carries a request id (idempotent)."""
    versions: dict[int, str] = {}

    async def put(i: int) -> None:
        await client.put(f"bench/{i % KEYS}", VALUE)

    async def get(i: int) -> None:
        await client.get(f"bench/{i % KEYS}")

    async def cas(i: int) -> None:
        slot = i % conc
        versions[slot] = (await client.put_if_version(f"scas/{slot}", VALUE, versions[slot])).version

    async def seed() -> None:
        for slot in range(conc):
            versions[slot] = await client.put(f"scas/{slot}", VALUE)

    cas.seed = seed  # type: ignore[attr-defined]
    return {"put": put, "get": get, "cas": cas}


async def _drive(figures: Figures, target: str, ops: dict[str, Call], conc: int, pid: int) -> None:
    for op, call in ops.items():
        seed = getattr(call, "seed", None)
        if seed is not None:
            await seed()
        figures[(target, op, conc)] = await measure_for(
            call, concurrency=conc, seconds=SECONDS, warmup=WARMUP, cpu=lambda: cpu_seconds(pid))


def _channels(port: int, n: int) -> list[grpc.aio.Channel]:
    return [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION) for _ in range(n)]


async def _close(channels: list[grpc.aio.Channel]) -> None:
    for ch in channels:
        await ch.close()


async def _echo(figures: Figures, port: int, pid: int) -> None:
    channels = _channels(port, 1)
    echo = channels[0].unary_unary("/bench.Echo/Echo")

    async def call(i: int) -> None:
        await echo(VALUE)

    for conc in (1, 64):
        await _drive(figures, "echo", {"echo": call}, conc, pid)
    await _close(channels)


async def _raw(figures: Figures, target: str, port: int, pid: int, *, in_flight: tuple[int, ...] = (1, 64),
               channels: int = 1, ops: tuple[str, ...] = ("put", "get", "cas")) -> None:
    chs = _channels(port, channels)
    for conc in in_flight:
        chosen = {op: call for op, call in _raw_ops(chs, conc).items() if op in ops}
        await _drive(figures, target, chosen, conc, pid)
    await _close(chs)


async def _sdk(figures: Figures, port: int, pid: int) -> None:
    async with fencepost.AsyncClient(f"127.0.0.1:{port}", timeout=30) as client:
        await _drive(figures, "sqlite sdk", _sdk_ops(client, 64), 64, pid)


async def _ledger(figures: Figures, port: int, pid: int) -> None:
    """Fenced commits (one record of 200 bytes, a commit id: what the SDK
    sends), one session per caller slot, through raw stubs."""
    conc = 64
    async with fencepost.AsyncClient(f"127.0.0.1:{port}", timeout=30) as client:
        tag = uuid.uuid4().hex[:8]
        slots = []
        for s in range(conc):
            sid = (await client.open_session("bench", f"{tag}-{s}")).session_id
            slots.append([sid, (await client.acquire_lease(sid, "bench", ttl=600)).generation, 0])
    chs = _channels(port, 1)
    ledger = ledger_pb2_grpc.LedgerServiceStub(chs[0])

    async def commit(i: int) -> None:
        slot = slots[i % conc]
        res = await ledger.Commit(ledger_pb2.CommitRequest(
            session_id=slot[0], generation=slot[1], expected_seq=slot[2], records=[VALUE],
            commit_id=uuid.uuid4().hex))
        slot[2] = res.seq

    await _drive(figures, "sqlite ledger", {"commit": commit}, conc, pid)
    await _close(chs)


def _median(results: list[Result]) -> Result:
    return sorted(results, key=lambda r: r.rate)[len(results) // 2]


def _targets(report: Reporter, med: Figures) -> None:
    """Each target of spec/performance.md: the ratio, the bound, pass/fail."""
    rows: list[tuple[str, float, str, bool]] = []

    def rate(target: str, op: str, conc: int) -> float:
        return med[(target, op, conc)].rate

    def p50(target: str, op: str, conc: int) -> float:
        return med[(target, op, conc)].p50_ms

    def at_least(name: str, value: float, bound: float) -> None:
        rows.append((name, value, f">= {bound:.2f}", value >= bound))

    for op, bound in (("put", 0.90), ("get", 0.90), ("cas", 0.90)):
        at_least(f"memory {op} / echo, 64 in flight", rate("memory", op, 64) / rate("echo", "echo", 64), bound)
    for op, bound in (("put", 0.90), ("get", 0.90), ("cas", 0.85)):
        at_least(f"sqlite {op} / memory {op}, 64 in flight", rate("sqlite", op, 64) / rate("memory", op, 64), bound)
    extra = p50("sqlite", "put", 1) - p50("echo", "echo", 1)
    rows.append(("sqlite put p50 - echo p50 (ms), 1 in flight", extra, "<= 0.40", extra <= 0.40))
    ratio = p50("sqlite", "get", 1) / p50("memory", "get", 1)
    rows.append(("sqlite get p50 / memory get p50, 1 in flight", ratio, "<= 1.10", ratio <= 1.10))
    for op in ("put", "get", "cas"):
        at_least(f"sdk {op} / raw stub {op} (sqlite, 64 in flight)", rate("sqlite sdk", op, 64) / rate("sqlite", op, 64),
                 0.90)
    at_least("ledger commit / kv put (sqlite, 64 in flight)", rate("sqlite ledger", "commit", 64)
             / rate("sqlite", "put", 64), 0.75)
    for op in ("put", "get"):
        at_least(f"--workers 2 / --workers 1 sqlite {op} ({CHANNELS} channels, 64)",
                 rate("sqlite 2 workers", op, 64) / rate("sqlite 1 worker", op, 64), 1.30)
    for name, value, bound, ok in rows:
        report(f"target: {name}", value=round(value, 3), bound=bound, result="PASS" if ok else "FAIL")


async def run(report: Reporter) -> None:
    runs: list[Figures] = []
    names = ("echo", "memory", "sqlite", "workers")
    ports = {name: free_port() for name in names}
    with tempfile.TemporaryDirectory() as tmp, \
            subprocess_server(["-m", "bench.echo_server", str(ports["echo"])], ports["echo"]) as echo, \
            fencepost_server(ports["memory"], "memory://") as memory, \
            fencepost_server(ports["sqlite"], f"sqlite://{Path(tmp) / 'bench.db'}") as sqlite, \
            fencepost_server(ports["workers"], f"sqlite://{Path(tmp) / 'workers.db'}", workers=2) as workers:
        for _ in range(ROUNDS):
            figures: Figures = {}
            await _echo(figures, ports["echo"], echo.pid)
            await _raw(figures, "memory", ports["memory"], memory.pid)
            await _raw(figures, "sqlite", ports["sqlite"], sqlite.pid)
            await _sdk(figures, ports["sqlite"], sqlite.pid)
            await _ledger(figures, ports["sqlite"], sqlite.pid)
            for target, port, pid in (("sqlite 1 worker", ports["sqlite"], sqlite.pid),
                                      ("sqlite 2 workers", ports["workers"], workers.pid)):
                await _raw(figures, target, port, pid, in_flight=(64,), channels=CHANNELS, ops=("put", "get"))
            runs.append(figures)
    med = {key: _median([r[key] for r in runs]) for key in runs[0]}
    for (target, op, conc), res in med.items():
        report.result(f"{target} {op} in_flight={conc}", res, srv_us_per_call=round(res.cpu_us or 0.0))
    _targets(report, med)
    await backend_calls_per_rpc(report)


#: backend calls per RPC before this harness measured them per target (never more)
BASELINE_CALLS = {
    "Get": 1, "GetWithVersion": 1, "Put": 1, "PutIfAbsent": 1, "PutIfVersion (stale version)": 1, "Delete": 1,
    "List (one page of 10)": 1, "Txn (success branch)": 1, "PutIfVersion (applied)": 1,
    "PutIfVersion (applied, with request_id)": 1,
}


async def backend_calls_per_rpc(report: Reporter) -> None:
    for name, storage in (("memory", MemoryStorage()), ("sqlite", None)):
        with tempfile.TemporaryDirectory() as tmp:
            from fencepost_server.storage.sqlite import SqliteStorage

            inner = storage or SqliteStorage(Path(tmp) / "calls.db", synchronous="NORMAL")
            await _calls_on(report, name, CountingStorage(inner))


async def _calls_on(report: Reporter, backend: str, counting: CountingStorage) -> None:
    app = App(Settings(listen="127.0.0.1:0", ledger_janitor=False), storage=counting)
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
            kv = kv_pb2_grpc.KvServiceStub(ch)
            await kv.Put(kv_pb2.PutRequest(key="seed", value=b"x"))
            for i in range(30):
                await kv.Put(kv_pb2.PutRequest(key=f"list/{i:02d}", value=b"x"))
            version = (await kv.Get(kv_pb2.GetRequest(key="seed"))).version
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "Get": lambda: kv.Get(kv_pb2.GetRequest(key="seed")),
                "GetWithVersion": lambda: kv.GetWithVersion(kv_pb2.GetWithVersionRequest(key="seed")),
                "Put": lambda: kv.Put(kv_pb2.PutRequest(key="p", value=b"x")),
                "PutIfAbsent": lambda: kv.PutIfAbsent(kv_pb2.PutIfAbsentRequest(key="seed", value=b"x")),
                "PutIfVersion (stale version)": lambda: kv.PutIfVersion(
                    kv_pb2.PutIfVersionRequest(key="seed", value=b"x", expected_version=version)),
                "Delete": lambda: kv.Delete(kv_pb2.DeleteRequest(key="p")),
                "List (one page of 10)": lambda: kv.List(kv_pb2.ListRequest(prefix="list/", page_size=10)),
                "Txn (success branch)": lambda: kv.Txn(kv_pb2.TxnRequest(
                    compares=[kv_pb2.Compare(key="seed", exists=True)],
                    success_ops=[kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="t", value=b"x"))])),
            }
            chain = {"version": (await kv.Put(kv_pb2.PutRequest(key="chain", value=b"x"))).version, "n": 0}

            async def put_if_version_chained(request_id: bool) -> None:
                chain["n"] += 1
                res = await kv.PutIfVersion(kv_pb2.PutIfVersionRequest(
                    key="chain", value=b"x", expected_version=str(chain["version"]),
                    request_id=f"r{chain['n']}" if request_id else ""))
                chain["version"] = res.version

            calls["PutIfVersion (applied)"] = lambda: put_if_version_chained(False)
            calls["PutIfVersion (applied, with request_id)"] = lambda: put_if_version_chained(True)
            for name, call in calls.items():
                counting.reset()
                n = 20
                for _ in range(n):
                    await call()
                per_rpc = counting.total() / n
                report(f"backend calls per RPC {backend}: {name}", calls=per_rpc, by_op=dict(counting.calls),
                       result="PASS" if per_rpc <= BASELINE_CALLS[name] else "FAIL (more than before)")
    finally:
        await app.stop(grace=0)
