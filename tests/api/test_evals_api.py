"""EvalService over a real server on loopback, on every backend."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import grpc
import pytest
from google.protobuf import struct_pb2, timestamp_pb2

import fencepost
from fencepost import errors
from fencepost.v1 import evals_pb2, evals_pb2_grpc
from fencepost_server.storage import Storage
from fencepost_server.storage.counting import CountingStorage
from tests.conftest import RunningServer, running

AGENT = "support-bot"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


async def test_eval_run_roundtrip(client: fencepost.AsyncClient) -> None:
    put = await client.put_eval_run(AGENT, "batch-1", {"status": "running", "cases": [1, 2], "meta": {"k": "v"}})
    assert put.run_id == "batch-1" and put.update_time.tzinfo is not None
    await client.put_eval_run(AGENT, "batch-1", {"status": "done"})
    got = await client.get_eval_run(AGENT, "batch-1")
    assert got.snapshot == {"status": "done"}
    assert [r.run_id async for r in client.list_eval_runs(AGENT)] == ["batch-1"]
    assert await client.delete_eval_run(AGENT, "batch-1") is True
    with pytest.raises(errors.EvalRunNotFound) as exc:
        await client.get_eval_run(AGENT, "batch-1")
    assert exc.value.code == "NOT_FOUND" and exc.value.metadata["run_id"] == "batch-1"


async def test_list_eval_runs_prunes_past_the_window(client: fencepost.AsyncClient) -> None:
    for i in range(6):
        await client.put_eval_run(AGENT, f"r{i}", {"i": i})
    runs, token = await client.list_eval_runs_page(AGENT, history_window=4)
    assert token == "" and [r.run_id for r in runs] == ["r2", "r3", "r4", "r5"]
    assert len([r async for r in client.list_eval_runs(AGENT, page_size=1)]) == 4


async def test_64_concurrent_put_ab_sample_all_land(client: fencepost.AsyncClient) -> None:
    await asyncio.gather(
        *(
            client.put_ab_sample(AGENT, "exp-a", f"session-{i % 4}", {"turn": i}, at=T0 + timedelta(milliseconds=i))
            for i in range(64)
        )
    )
    samples = [s async for s in client.list_ab_samples(AGENT, "exp-a", page_size=7)]
    assert sorted(int(s.sample["turn"]) for s in samples) == list(range(64))
    one = [s async for s in client.list_ab_samples(AGENT, "exp-a", session_id="session-1")]
    assert len(one) == 16 and [s.at for s in one] == sorted(s.at for s in one)
    assert one[0].at == T0 + timedelta(milliseconds=1)


async def test_ab_snapshot_last_write_wins(client: fencepost.AsyncClient) -> None:
    assert await client.get_ab_snapshot(AGENT) is None
    await client.put_ab_snapshot(AGENT, {"exp-a": {"wins": 1}})
    second = await client.put_ab_snapshot(AGENT, {"exp-a": {"wins": 2}})
    snap = await client.get_ab_snapshot(AGENT)
    assert snap is not None and snap.snapshot == {"exp-a": {"wins": 2}} and snap.update_time == second


async def test_unicode_and_long_ids_roundtrip(client: fencepost.AsyncClient) -> None:
    experiment, session = "実験-" + "é" * 300, "😀" * 200
    await client.put_ab_sample(AGENT, experiment, session, {"x": 1}, at=T0)
    [sample] = [s async for s in client.list_ab_samples(AGENT, experiment)]
    assert (sample.experiment, sample.session_id, sample.at) == (experiment, session, T0)


async def test_typed_errors(client: fencepost.AsyncClient) -> None:
    with pytest.raises(errors.AgentNameInvalid):
        await client.put_eval_run("", "r", {})
    with pytest.raises(errors.FieldInvalid) as exc:
        await client.put_ab_sample(AGENT, "", "s", {})
    assert "experiment" in exc.value.field_violations
    with pytest.raises(errors.PageTokenInvalid):
        await client.list_ab_samples_page(AGENT, "exp", page_token="bogus")


async def test_put_ab_sample_costs_one_backend_write_over_the_wire(storage: Storage) -> None:
    counting = CountingStorage(storage)
    async with running(counting, ledger_janitor=False) as srv, srv.client(timeout=10.0) as client:
        counting.reset()
        await client.put_ab_sample(AGENT, "exp", "s1", {"turn": 1}, at=T0)
        assert dict(counting.calls) == {"put": 1}


def _struct_in_order(obj: dict[str, object]) -> bytes:
    """A Struct's wire bytes with its map entries in the order of `obj`.
    Map order on the wire means nothing (Go randomizes it; Python's upb
    orders it by a per-process hash seed): concatenated one-entry Structs
    are one Struct holding every entry."""
    out = b""
    for k, v in obj.items():
        one = struct_pb2.Struct()
        one.update({k: v})
        out += one.SerializeToString()
    return out


async def test_a_retry_whose_struct_entries_arrive_in_another_order_is_the_same_request(
    server: RunningServer,
) -> None:
    """AIP-155: a retry of PutEvalRun / PutAbSample / PutAbSnapshot from a
    restarted client (or a Go one) carries the same JSON object with its map
    entries in another wire order; it is the same request, not REQUEST_ID_REUSED."""
    snapshot = {f"k{i:02d}": i for i in range(40)}
    orders = [snapshot, dict(reversed(list(snapshot.items())))]
    at = timestamp_pb2.Timestamp(seconds=1_700_000_000)
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = evals_pb2_grpc.EvalServiceStub(channel)
        times = []
        for obj in orders:
            struct = struct_pb2.Struct.FromString(_struct_in_order(obj))
            run = await stub.PutEvalRun(evals_pb2.PutEvalRunRequest(
                agent=AGENT, run_id="r", snapshot=struct, request_id="req-run"))
            times.append(run.run.update_time)
            snap = await stub.PutAbSnapshot(evals_pb2.PutAbSnapshotRequest(
                agent=AGENT, snapshot=struct, request_id="req-snap"))
            times.append(snap.update_time)
            await stub.PutAbSample(evals_pb2.PutAbSampleRequest(
                agent=AGENT, experiment="e", session_id="s", at=at, sample=struct, request_id="req-sample"))
        assert times[0] == times[2] and times[1] == times[3]  # the retries replayed the first attempts
