"""KV Put/Get through fencepost (memory, sqlite) next to a bare grpc.aio echo
server driven by the same harness, and backend calls per RPC."""

from __future__ import annotations

import tempfile
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


async def _echo(report: Reporter) -> dict[int, float]:
    port = free_port()
    rates = {}
    with subprocess_server(["-m", "bench.echo_server", str(port)], port):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            echo = ch.unary_unary("/bench.Echo/Echo")
            for conc, total in TOTALS.items():
                res = await measure(lambda i: echo(VALUE), concurrency=conc, total=total)
                report.result(f"echo (bare grpc.aio) in_flight={conc}", res)
                rates[conc] = res.rate
    return rates


async def _fencepost(report: Reporter, label: str, backend: str) -> dict[tuple[str, int], float]:
    port = free_port()
    rates = {}
    with fencepost_server(port, backend):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            kv = kv_pb2_grpc.KvServiceStub(ch)
            for conc, total in TOTALS.items():
                put = await measure(
                    lambda i: kv.Put(kv_pb2.PutRequest(key=f"bench/{i % 1000}", value=VALUE)),
                    concurrency=conc, total=total,
                )
                report.result(f"fencepost {label} Put in_flight={conc}", put)
                get = await measure(
                    lambda i: kv.Get(kv_pb2.GetRequest(key=f"bench/{i % 1000}")), concurrency=conc, total=total
                )
                report.result(f"fencepost {label} Get in_flight={conc}", get)
                rates[("put", conc)], rates[("get", conc)] = put.rate, get.rate
    return rates


async def backend_calls_per_rpc(report: Reporter) -> None:
    counting = CountingStorage(MemoryStorage())
    app = App(Settings(listen="127.0.0.1:0"), storage=counting)
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
    echo = await _echo(report)
    memory = await _fencepost(report, "memory", "memory://")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = await _fencepost(report, "sqlite", f"sqlite://{Path(tmp) / 'bench.db'}")
    for conc in TOTALS:
        report(
            f"ratios in_flight={conc}",
            memory_put_vs_echo=memory[("put", conc)] / echo[conc],
            memory_get_vs_echo=memory[("get", conc)] / echo[conc],
            sqlite_put_vs_memory_put=sqlite[("put", conc)] / memory[("put", conc)],
            sqlite_get_vs_memory_get=sqlite[("get", conc)] / memory[("get", conc)],
        )
    await backend_calls_per_rpc(report)
