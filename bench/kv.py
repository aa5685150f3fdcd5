"""KV Put/Get through fencepost (memory, sqlite) next to a bare grpc.aio echo
server driven by the same harness, and backend calls per RPC."""

from __future__ import annotations

import tempfile
from typing import Any
from pathlib import Path

import grpc

from fencepost.v1 import kv_pb2, kv_pb2_grpc
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage.counting import CountingStorage
from fencepost_server.storage.memory import MemoryStorage

from .harness import Reporter, fencepost_server, free_port, measure, subprocess_server

VALUE = b"v" * 64
TOTALS = {1: 1500, 64: 6000}


ROUNDS = 3  # interleaved rounds; the median rate per configuration is reported


async def _echo_round(port: int) -> dict[tuple[str, int], object]:
    out: dict[tuple[str, int], object] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        echo = ch.unary_unary("/bench.Echo/Echo")
        for conc, total in TOTALS.items():
            out[("echo", conc)] = await measure(lambda i: echo(VALUE), concurrency=conc, total=total)
    return out


async def _fencepost_round(port: int) -> dict[tuple[str, int], object]:
    out: dict[tuple[str, int], object] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        kv = kv_pb2_grpc.KvServiceStub(ch)
        for conc, total in TOTALS.items():
            out[("put", conc)] = await measure(
                lambda i: kv.Put(kv_pb2.PutRequest(key=f"bench/{i % 1000}", value=VALUE)),
                concurrency=conc, total=total,
            )
            out[("get", conc)] = await measure(
                lambda i: kv.Get(kv_pb2.GetRequest(key=f"bench/{i % 1000}")), concurrency=conc, total=total
            )
    return out


def _median(results: list[Any]) -> Any:
    return sorted(results, key=lambda r: r.rate)[len(results) // 2]
async def backend_calls_per_rpc(report: Reporter) -> None:
    counting = CountingStorage(MemoryStorage())
    app = App(Settings(listen="127.0.0.1:0", ledger_janitor=False), storage=counting)
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
            kv = kv_pb2_grpc.KvServiceStub(ch)
            await kv.Put(kv_pb2.PutRequest(key="seed", value=b"x"))
            for i in range(30):
                await kv.Put(kv_pb2.PutRequest(key=f"list/{i:02d}", value=b"x"))
            version = (await kv.Get(kv_pb2.GetRequest(key="seed"))).version
            calls = {
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
            chain = {"version": version, "n": 0}

            async def put_if_version_chained(request_id: bool) -> None:
                chain["n"] += 1
                res = await kv.PutIfVersion(kv_pb2.PutIfVersionRequest(
                    key="chain", value=b"x", expected_version=chain["version"],
                    request_id=f"r{chain['n']}" if request_id else ""))
                chain["version"] = res.version

            chain["version"] = (await kv.Put(kv_pb2.PutRequest(key="chain", value=b"x"))).version
            calls["PutIfVersion (applied)"] = lambda: put_if_version_chained(False)
            calls["PutIfVersion (applied, with request_id)"] = lambda: put_if_version_chained(True)
            for name, call in calls.items():
                counting.reset()
                n = 20
                for _ in range(n):
                    await call()
                report(f"backend calls per RPC: {name}", calls=counting.total() / n,
                       by_op=dict(counting.calls))
    finally:
        await app.stop(grace=0)


async def run(report: Reporter) -> None:
    """Echo, memory and sqlite servers run side by side; each round drives
    all three in turn, so background noise on this shared machine lands on
    every configuration alike. Medians of ROUNDS rounds are reported."""
    runs: dict[str, list[dict[tuple[str, int], Any]]] = {"echo": [], "memory": [], "sqlite": []}
    ports = {name: free_port() for name in runs}
    with tempfile.TemporaryDirectory() as tmp, \
            subprocess_server(["-m", "bench.echo_server", str(ports["echo"])], ports["echo"]), \
            fencepost_server(ports["memory"], "memory://"), \
            fencepost_server(ports["sqlite"], f"sqlite://{Path(tmp) / 'bench.db'}"):
        for _ in range(ROUNDS):
            runs["echo"].append(await _echo_round(ports["echo"]))
            runs["memory"].append(await _fencepost_round(ports["memory"]))
            runs["sqlite"].append(await _fencepost_round(ports["sqlite"]))
    med = {name: {k: _median([r[k] for r in rs]) for k in rs[0]} for name, rs in runs.items()}
    for conc in TOTALS:
        report.result(f"echo (bare grpc.aio) in_flight={conc}", med["echo"][("echo", conc)])
        for name in ("memory", "sqlite"):
            for op in ("put", "get"):
                report.result(f"fencepost {name} {op.capitalize()} in_flight={conc}", med[name][(op, conc)])
    for conc in TOTALS:
        echo = med["echo"][("echo", conc)].rate
        m, s = med["memory"], med["sqlite"]
        report(
            f"ratios in_flight={conc} (medians of {ROUNDS})",
            memory_put_vs_echo=m[("put", conc)].rate / echo,
            memory_get_vs_echo=m[("get", conc)].rate / echo,
            sqlite_put_vs_memory_put=s[("put", conc)].rate / m[("put", conc)].rate,
            sqlite_get_vs_memory_get=s[("get", conc)].rate / m[("get", conc)].rate,
        )
    await backend_calls_per_rpc(report)
