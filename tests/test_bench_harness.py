"""The benchmark harness's own parts: the floor server answers fencepost's
KV messages, interleaved measurement keeps each target's figures apart, and
connections are found per process. (No timing is asserted.)"""

from __future__ import annotations

import asyncio
import os
import socket

import grpc
import pytest

from bench import echo_server
from bench.harness import connections_per_process, free_port, measure_interleaved
from fencepost.v1 import kv_pb2, kv_pb2_grpc


@pytest.fixture
async def floor() -> kv_pb2_grpc.KvServiceStub:
    port = free_port()
    task = asyncio.create_task(echo_server.main(port))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        yield kv_pb2_grpc.KvServiceStub(channel)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_floor_answers_the_ops_the_bench_drives_with_fencepost_shapes(floor) -> None:
    put = await floor.Put(kv_pb2.PutRequest(key="bench/1", value=b"v" * 200))
    assert len(put.version) == 32 and int(put.version, 16) >= 0
    got = await floor.Get(kv_pb2.GetRequest(key="bench/1"))
    assert got.found and got.value == b"v" * 200 and len(got.version) == 32
    first = await floor.PutIfVersion(kv_pb2.PutIfVersionRequest(key="cas/0", value=b"x", expected_version=put.version))
    second = await floor.PutIfVersion(kv_pb2.PutIfVersionRequest(key="cas/0", value=b"x",
                                                                 expected_version=first.version))
    assert first.applied and second.applied and first.version != second.version


async def test_the_floor_stores_nothing_and_serves_nothing_else(floor) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await floor.Delete(kv_pb2.DeleteRequest(key="bench/1"))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_interleaved_targets_keep_their_own_calls_and_cpu() -> None:
    seen: dict[str, list[int]] = {"a": [], "b": []}

    def target(name: str):
        async def call(i: int) -> None:
            seen[name].append(i)
            await asyncio.sleep(0)
        return call

    cpu = {"a": 0.0, "b": 100.0}
    results = await measure_interleaved([(target("a"), lambda: cpu["a"]), (target("b"), None)],
                                        concurrency=4, seconds=0.04, warmup=0.01, slices=3)
    a, b = results
    assert a.calls > 0 and b.calls > 0
    assert a.cpu_us == 0.0 and b.cpu_us is None  # a's CPU reader never moved; b had none
    # each caller slot keeps its residue across turns: i % concurrency is the slot's own
    for name in seen:
        by_slot = {i % 4 for i in seen[name]}
        assert by_slot == {0, 1, 2, 3}


def test_connections_are_counted_per_process() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as one, socket.create_connection(("127.0.0.1", port)):
            accepted = [server.accept()[0] for _ in range(2)]
            try:
                counts = connections_per_process([os.getpid()], port)
                # the two accepted sockets hold local port `port` (the clients' sockets hold it as remote)
                assert counts == {os.getpid(): 2}
                assert one.getpeername()[1] == port
            finally:
                for s in accepted:
                    s.close()


def test_the_workers_ceiling_is_whichever_binds_first_the_workers_cores_or_all_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import kv
    from bench.harness import Result

    one = Result(calls=5000, seconds=1.0, p50_ms=1.0, p99_ms=2.0, cpu_us=200.0, client_us=150.0)
    monkeypatch.setattr(kv, "CORES", 2)
    assert kv._workers_ceiling(one) == pytest.approx(2 / 350e-6 / 5000)  # the cores shared with the client
    monkeypatch.setattr(kv, "CORES", 64)
    assert kv._workers_ceiling(one) == pytest.approx(2 / 200e-6 / 5000)  # each worker's own core
    assert kv._workers_ceiling(Result(calls=0, seconds=1.0, p50_ms=0, p99_ms=0)) == 0.0
