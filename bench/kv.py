"""The targets of spec/performance.md, as ratios from one run.

Every server runs in a process of its own (so its CPU time per call can be
read from /proc) next to one client process driving all of them with the same
closed-loop harness and the same generated stubs and messages: a bare
grpc.aio KvService that stores nothing (bench/echo_server.py, the floor; each
op is compared with the same op on it), fencepost over
memory:// and over SQLite through raw stubs, SQLite through the SDK, fenced
ledger commits, and SQLite with `--workers 2` against the same server with one
worker over several client channels. Each round measures the figures a target
compares together (echo, memory, SQLite, SDK for one op), taking turns of
SECONDS / TURNS each, so a ratio is taken at one moment of this shared
machine; a target's value is the median of its per-round ratios (each round's
values are printed too), then backend calls per RPC.

    python -m bench kv     FENCEPOST_BENCH_SECONDS=0.5 FENCEPOST_BENCH_ROUNDS=1 for a quick look
"""

from __future__ import annotations

import os
import statistics
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

from .harness import (
    Reporter,
    Result,
    children,
    connections_per_process,
    cpu_seconds,
    fencepost_server,
    free_port,
    measure_interleaved,
    subprocess_server,
)

VALUE = b"v" * 200
KEYS = 1000
SECONDS = float(os.environ.get("FENCEPOST_BENCH_SECONDS", "1.5"))
WARMUP = 0.3
ROUNDS = int(os.environ.get("FENCEPOST_BENCH_ROUNDS", "5"))
#: turns per figure and round: the figures a target compares take turns of SECONDS / TURNS
TURNS = int(os.environ.get("FENCEPOST_BENCH_TURNS", "5"))
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


class _Targets:
    """Every server's channels (kept open across rounds) and the measurements."""

    def __init__(self, ports: dict[str, int], pids: dict[str, int]) -> None:
        self.pids = pids
        self.ports = ports
        self.channels = {
            "echo": _channels(ports["echo"], 1), "echo 2": _channels(ports["echo2"], 1),
            "memory": _channels(ports["memory"], 1),
            "sqlite": _channels(ports["sqlite"], 1), "sqlite 1 worker": _channels(ports["sqlite"], CHANNELS),
            "sqlite 2 workers": _channels(ports["workers"], CHANNELS),
        }
        self.server = {"echo": "echo", "echo 2": "echo2", "memory": "memory", "sqlite": "sqlite",
                       "sqlite 1 worker": "sqlite", "sqlite 2 workers": "workers", "sqlite sdk": "sqlite",
                       "sqlite ledger": "sqlite"}
        self.sdk = fencepost.AsyncClient(f"127.0.0.1:{ports['sqlite']}")
        self.sessions: list[list[Any]] = []

    async def measure(self, group: list[tuple[str, str, int]]) -> list[Result]:
        """The figures of one group (one concurrency), measured in turns."""
        prepared = [await self._prepare(*key) for key in group]
        return await measure_interleaved(prepared, concurrency=group[0][2], seconds=SECONDS, warmup=WARMUP,
                                         slices=TURNS)

    async def _prepare(self, target: str, op: str, conc: int) -> tuple[Call, Callable[[], float]]:
        if target == "sqlite sdk":
            call = _sdk_ops(self.sdk, conc)[op]
        elif target == "sqlite ledger":
            call = await self._commit_call(conc)
        else:
            call = _raw_ops(self.channels[target], conc)[op]
        seed = getattr(call, "seed", None)
        if seed is not None:
            await seed()
        pid = self.pids[self.server[target]]
        return call, lambda: cpu_seconds(pid)

    async def _commit_call(self, conc: int) -> Call:
        """Fenced commits (one 200-byte record and a commit id: what the SDK
        sends), one session per caller slot, through a raw stub."""
        if not self.sessions:
            tag = uuid.uuid4().hex[:8]
            for s in range(conc):
                sid = (await self.sdk.open_session("bench", f"{tag}-{s}")).session_id
                gen = (await self.sdk.acquire_lease(sid, "bench", ttl=3600)).generation
                self.sessions.append([sid, gen, 0])
        ledger = ledger_pb2_grpc.LedgerServiceStub(self.channels["sqlite"][0])
        slots = self.sessions

        async def commit(i: int) -> None:
            slot = slots[i % conc]
            res = await ledger.Commit(ledger_pb2.CommitRequest(
                session_id=slot[0], generation=slot[1], expected_seq=slot[2], records=[VALUE],
                commit_id=os.urandom(16).hex()))
            slot[2] = res.seq

        return commit

    async def reconnect_workers(self) -> None:
        """New connections for the --workers comparison: the kernel hashes each
        connection to one worker (SO_REUSEPORT), so with 4 connections a round
        may see them split 2:2, 3:1 or 4:0; every round draws again."""
        for target, server in (("sqlite 1 worker", "sqlite"), ("sqlite 2 workers", "workers")):
            await _close(self.channels[target])
            self.channels[target] = _channels(self.ports[server], CHANNELS)

    def worker_split(self) -> str:
        """How the open connections to the --workers server fall on its workers, e.g. "3:1"."""
        counts = connections_per_process(children(self.pids["workers"]), self.ports["workers"])
        return ":".join(str(n) for n in sorted(counts.values(), reverse=True))

    async def close(self) -> None:
        for chs in self.channels.values():
            await _close(chs)
        await self.sdk.close()


#: the measurements of one round, in order: the figures of a group take turns,
#: so the ratios within a group see the same moment of this shared machine
def _groups() -> list[list[tuple[str, str, int]]]:
    groups: list[list[tuple[str, str, int]]] = []
    for conc in (1, 64):
        for op in ("put", "get", "cas"):
            group = [("echo", op, conc), ("memory", op, conc), ("sqlite", op, conc)]
            if conc == 64 and op == "put":
                group.append(("echo 2", op, conc))  # the control: a second, identical floor server
            if conc == 64:
                group.append(("sqlite sdk", op, conc))
                if op == "put":
                    group.append(("sqlite ledger", "commit", conc))
            groups.append(group)
    for op in ("put", "get"):
        groups.append([("sqlite 1 worker", op, 64), ("sqlite 2 workers", op, 64)])
    return groups


def _channels(port: int, n: int) -> list[grpc.aio.Channel]:
    return [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION) for _ in range(n)]


async def _close(channels: list[grpc.aio.Channel]) -> None:
    for ch in channels:
        await ch.close()


def _median(values: list[float]) -> float:
    return statistics.median(values)


Target = tuple[str, Callable[[Figures], float], str, Callable[[float], bool]]


def _target_list() -> list[Target]:
    """Each target of spec/performance.md: name, its figure from one round, bound, check."""
    def rate(f: Figures, target: str, op: str, conc: int) -> float:
        return f[(target, op, conc)].rate

    def p50(f: Figures, target: str, op: str, conc: int) -> float:
        return f[(target, op, conc)].p50_ms

    out: list[Target] = []
    for op in ("put", "get", "cas"):
        out.append((f"memory {op} / echo, 64 in flight",
                    lambda f, op=op: rate(f, "memory", op, 64) / rate(f, "echo", op, 64), ">= 0.90",
                    lambda v: v >= 0.90))
    for op, bound in (("put", 0.90), ("get", 0.90), ("cas", 0.85)):
        out.append((f"sqlite {op} / memory {op}, 64 in flight",
                    lambda f, op=op: rate(f, "sqlite", op, 64) / rate(f, "memory", op, 64), f">= {bound:.2f}",
                    lambda v, bound=bound: v >= bound))
    out.append(("sqlite put p50 - echo put p50 (ms), 1 in flight",
                lambda f: p50(f, "sqlite", "put", 1) - p50(f, "echo", "put", 1), "<= 0.40", lambda v: v <= 0.40))
    out.append(("sqlite get p50 / memory get p50, 1 in flight",
                lambda f: p50(f, "sqlite", "get", 1) / p50(f, "memory", "get", 1), "<= 1.10", lambda v: v <= 1.10))
    for op in ("put", "get", "cas"):
        out.append((f"sdk {op} / raw stub {op} (sqlite, 64 in flight)",
                    lambda f, op=op: rate(f, "sqlite sdk", op, 64) / rate(f, "sqlite", op, 64), ">= 0.90",
                    lambda v: v >= 0.90))
    out.append(("ledger commit / kv put (sqlite, 64 in flight)",
                lambda f: rate(f, "sqlite ledger", "commit", 64) / rate(f, "sqlite", "put", 64), ">= 0.75",
                lambda v: v >= 0.75))
    for op in ("put", "get"):
        out.append((f"--workers 2 / --workers 1 sqlite {op} ({CHANNELS} channels, 64 in flight)",
                    lambda f, op=op: rate(f, "sqlite 2 workers", op, 64) / rate(f, "sqlite 1 worker", op, 64),
                    ">= 1.30", lambda v: v >= 1.30))
    return out


CORES = os.cpu_count() or 1


def _workers_ceiling(one: Result) -> float:
    """The most `--workers 2` can reach against this `--workers 1` figure
    when the load generator runs on the same cores: each worker is bounded by
    its core (2 / server CPU per call) and all of them together with the
    client by every core (CORES / (server + client CPU per call)), at the
    single worker's costs per call (two workers cost a little more each)."""
    server, client = (one.cpu_us or 0.0) * 1e-6, (one.client_us or 0.0) * 1e-6
    if not server or not one.rate:
        return 0.0
    return min(2 / server, CORES / (server + client)) / one.rate


async def run(report: Reporter) -> None:
    """Rounds of back-to-back groups; each figure and each target's ratio is
    the median over the rounds of its per-round value."""
    runs: list[Figures] = []
    splits: list[str] = []  # per round: the 4 connections over the 2 workers
    ports = {name: free_port() for name in ("echo", "echo2", "memory", "sqlite", "workers")}
    with tempfile.TemporaryDirectory() as tmp, \
            subprocess_server(["-m", "bench.echo_server", str(ports["echo"])], ports["echo"]) as echo, \
            subprocess_server(["-m", "bench.echo_server", str(ports["echo2"])], ports["echo2"]) as echo2, \
            fencepost_server(ports["memory"], "memory://") as memory, \
            fencepost_server(ports["sqlite"], f"sqlite://{Path(tmp) / 'bench.db'}") as sqlite, \
            fencepost_server(ports["workers"], f"sqlite://{Path(tmp) / 'workers.db'}", workers=2) as workers:
        targets = _Targets(ports, {"echo": echo.pid, "echo2": echo2.pid, "memory": memory.pid,
                                   "sqlite": sqlite.pid, "workers": workers.pid})
        try:
            for _ in range(ROUNDS):
                figures: Figures = {}
                await targets.reconnect_workers()
                for group in _groups():
                    figures.update(zip(group, await targets.measure(group)))
                runs.append(figures)
                splits.append(targets.worker_split())
        finally:
            await targets.close()
    for key in runs[0]:
        results = [r[key] for r in runs]
        target, op, conc = key
        report(f"{target} {op} in_flight={conc}", calls_per_s=_median([r.rate for r in results]),
               p50_ms=_median([r.p50_ms for r in results]), p99_ms=_median([r.p99_ms for r in results]),
               srv_us_per_call=round(_median([r.cpu_us or 0.0 for r in results])),
               client_us_per_call=round(_median([r.client_us or 0.0 for r in results])))
    for name, figure, bound, check in _target_list():
        values = [figure(r) for r in runs]
        value = _median(values)
        report(f"target: {name}", value=round(value, 3), bound=bound, result="PASS" if check(value) else "FAIL",
               rounds=" ".join(f"{v:.2f}" for v in values))
    control = [r[("echo 2", "put", 64)].rate / r[("echo", "put", 64)].rate for r in runs]
    report("control: a second floor server / the floor, put 64 in flight (1.00 but for noise)",
           value=round(_median(control), 3), rounds=" ".join(f"{v:.2f}" for v in control))
    report(f"--workers 2: {CHANNELS} connections over the workers", rounds=" ".join(splits))
    for op in ("put", "get"):
        ceilings = [_workers_ceiling(r[("sqlite 1 worker", op, 64)]) for r in runs]
        report(f"ceiling of --workers 2 / --workers 1 sqlite {op} on {CORES} cores shared with this client",
               value=round(_median(ceilings), 3), rounds=" ".join(f"{v:.2f}" for v in ceilings))
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
            # steady state: the first page token of a process fetches the deployment's token key once
            await kv.List(kv_pb2.ListRequest(prefix="list/", page_size=10))
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
