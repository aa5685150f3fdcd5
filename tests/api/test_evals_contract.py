"""EvalService statement by statement (docs/evals.md, proto comments), over
gRPC against a real server on every backend: the history window's prune with
exact counts, A/B sample tables paged in key order, idempotent retries."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import fencepost
from fencepost import errors
from fencepost_server.storage import Storage
from tests.conftest import running

AG = "evals-agent"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


async def test_the_first_page_prunes_exactly_past_the_window(client: fencepost.AsyncClient) -> None:
    for i in range(7):
        await client.put_eval_run(AG, f"run-{i}", {"i": i})
    await client.put_eval_run(AG, "run-0", {"i": 0, "again": True})  # now the newest
    runs, token, pruned = await _first_page(client, history_window=3)
    assert pruned == 4 and token == ""  # 7 runs, 3 kept
    assert [r.run_id for r in runs] == ["run-0", "run-5", "run-6"]  # run-id order
    assert runs[0].snapshot == {"i": 0, "again": True}
    _, _, pruned = await _first_page(client, history_window=3)
    assert pruned == 0
    with pytest.raises(errors.EvalRunNotFound):
        await client.get_eval_run(AG, "run-1")


async def _first_page(client: fencepost.AsyncClient, **kw: int) -> tuple[list, str, int]:  # type: ignore[type-arg]
    from fencepost.v1 import evals_pb2, evals_pb2_grpc

    stub = evals_pb2_grpc.EvalServiceStub(client.channel)
    res = await client._caller.call(stub.ListEvalRuns, evals_pb2.ListEvalRunsRequest(agent=AG, **kw), safe=True)
    return [_Run(r.run_id, dict(r.snapshot)) for r in res.runs], res.next_page_token, res.pruned_count


class _Run:
    def __init__(self, run_id: str, snapshot: dict) -> None:  # type: ignore[type-arg]
        self.run_id, self.snapshot = run_id, snapshot


async def test_runs_page_in_id_order_and_later_pages_never_prune(client: fencepost.AsyncClient) -> None:
    for i in range(5):
        await client.put_eval_run(AG, f"r{i}", {"i": i})
    runs, token, pruned = await _first_page(client, page_size=2, history_window=10)
    assert [r.run_id for r in runs] == ["r0", "r1"] and token and pruned == 0
    ids = [r.run_id for r in runs]
    while token:
        page, token = await client.list_eval_runs_page(AG, page_size=2, page_token=token, history_window=1)
        ids.extend(r.run_id for r in page)
    assert ids == ["r0", "r1", "r2", "r3", "r4"]  # a later page's window prunes nothing
    with pytest.raises(errors.PageSizeInvalid):
        await client.list_eval_runs_page(AG, page_size=-1)
    with pytest.raises(errors.FieldInvalid):
        await client.list_eval_runs_page(AG, history_window=-1)
    _, token = await client.list_eval_runs_page(AG, page_size=2)
    with pytest.raises(errors.PageTokenInvalid):
        await client.list_eval_runs_page("another-agent", page_size=2, page_token=token)


async def test_ab_samples_list_by_session_then_time_and_resend_overwrites(client: fencepost.AsyncClient) -> None:
    plan = [("s-b", 2), ("s-a", 1), ("s-b", 0), ("s-a", 0), ("s-c", 5)]
    for session, ms in plan:
        await client.put_ab_sample(AG, "exp", session, {"ms": ms}, at=T0 + timedelta(milliseconds=ms))
    await client.put_ab_sample(AG, "other-exp", "s-a", {"ms": 99}, at=T0)
    await client.put_ab_sample(AG, "exp", "s-a", {"ms": 1, "resent": True}, at=T0 + timedelta(milliseconds=1))
    got, token = [], ""
    while True:
        page, token = await client.list_ab_samples_page(AG, "exp", page_size=2, page_token=token)
        assert len(page) <= 2
        got.extend(page)
        if not token:
            break
    assert [(s.session_id, s.at - T0) for s in got] == [
        ("s-a", timedelta(0)), ("s-a", timedelta(milliseconds=1)),
        ("s-b", timedelta(0)), ("s-b", timedelta(milliseconds=2)), ("s-c", timedelta(milliseconds=5)),
    ]
    assert got[1].sample == {"ms": 1, "resent": True}
    only = [s async for s in client.list_ab_samples(AG, "exp", session_id="s-b")]
    assert [s.sample["ms"] for s in only] == [0, 2]
    _, token = await client.list_ab_samples_page(AG, "exp", page_size=1)
    for other in ({"experiment": "other-exp"}, {"session_id": "s-a"}):
        with pytest.raises(errors.PageTokenInvalid):
            await client.list_ab_samples_page(AG, other.get("experiment", "exp"),
                                              session_id=other.get("session_id", ""), page_size=1, page_token=token)
    assert [s async for s in client.list_ab_samples(AG, "never")] == []


async def test_sample_at_nanosecond_precision_orders_and_round_trips(client: fencepost.AsyncClient) -> None:
    from fencepost.v1 import evals_pb2, evals_pb2_grpc
    from google.protobuf import timestamp_pb2

    stub = evals_pb2_grpc.EvalServiceStub(client.channel)
    for nanos in (999_999_999, 1, 0, 500):
        req = evals_pb2.PutAbSampleRequest(agent=AG, experiment="ns", session_id="s",
                                           at=timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=nanos))
        req.sample.update({"n": nanos})
        await client._caller.call(stub.PutAbSample, req, safe=True)
    res = await client._caller.call(stub.ListAbSamples, evals_pb2.ListAbSamplesRequest(agent=AG, experiment="ns"),
                                    safe=True)
    assert [(s.at.seconds, s.at.nanos) for s in res.samples] == [
        (1_700_000_000, n) for n in (0, 1, 500, 999_999_999)]
    assert [s.sample["n"] for s in res.samples] == [0, 1, 500, 999_999_999]


async def test_write_retries_with_a_request_id_report_the_first_outcome(client: fencepost.AsyncClient) -> None:
    first = await client.put_eval_run(AG, "r", {"k": 1}, request_id="put-1")
    await client.put_eval_run(AG, "r", {"k": 2})
    retry = await client.put_eval_run(AG, "r", {"k": 1}, request_id="put-1")
    assert retry.update_time == first.update_time and retry.snapshot == {"k": 1}
    assert (await client.get_eval_run(AG, "r")).snapshot == {"k": 2}  # the retry wrote nothing
    with pytest.raises(errors.RequestIdReused):
        await client.put_eval_run(AG, "r", {"k": 3}, request_id="put-1")
    assert await client.delete_eval_run(AG, "r", request_id="del-1") is True
    assert await client.delete_eval_run(AG, "r", request_id="del-1") is True  # the first outcome
    assert await client.delete_eval_run(AG, "r", request_id="del-2") is False
    assert await client.delete_eval_run(AG, "r") is False


async def test_snapshot_round_trips_json_types(client: fencepost.AsyncClient) -> None:
    agg = {"exp": {"a": {"n": 10, "mean": 0.25, "ok": True, "tags": ["x", None]}, "b": {}}}
    await client.put_ab_snapshot(AG, agg)
    got = await client.get_ab_snapshot(AG)
    assert got is not None and got.snapshot == agg
    assert await client.get_ab_snapshot("other") is None


async def test_a_retry_of_a_put_whose_run_was_pruned_since_replays_and_writes_nothing(
        client: fencepost.AsyncClient) -> None:
    first = await client.put_eval_run(AG, "old", {"k": 1}, request_id="put-old")
    for i in range(3):
        await client.put_eval_run(AG, f"new-{i}", {"i": i})
    _, _, pruned = await _first_page(client, history_window=3)
    assert pruned == 1
    retry = await client.put_eval_run(AG, "old", {"k": 1}, request_id="put-old")
    assert retry.update_time == first.update_time
    with pytest.raises(errors.EvalRunNotFound):
        await client.get_eval_run(AG, "old")
    snap = await client.put_ab_snapshot(AG, {"a": 1}, request_id="snap-1")
    await client.put_ab_snapshot(AG, {"a": 2})
    assert await client.put_ab_snapshot(AG, {"a": 1}, request_id="snap-1") == snap
    got = await client.get_ab_snapshot(AG)
    assert got is not None and got.snapshot == {"a": 2}


async def test_sample_page_size_default_clamp_and_refusal(client: fencepost.AsyncClient) -> None:
    for i in range(3):
        await client.put_ab_sample(AG, "caps", "s", {"i": i}, at=T0 + timedelta(seconds=i))
    page, token = await client.list_ab_samples_page(AG, "caps", page_size=5000)
    assert len(page) == 3 and token == ""
    page, token = await client.list_ab_samples_page(AG, "caps")  # 0 = the default (100)
    assert len(page) == 3 and token == ""
    with pytest.raises(errors.PageSizeInvalid):
        await client.list_ab_samples_page(AG, "caps", page_size=-1)
    with pytest.raises(errors.FieldInvalid):
        await client.list_ab_samples_page(AG, "", page_size=1)


async def test_the_configured_window_is_the_default_and_a_request_overrides_it(storage: Storage) -> None:
    async with running(storage, eval_history_window=2) as srv, srv.client(timeout=10.0) as client:
        for i in range(4):
            await client.put_eval_run(AG, f"w{i}", {"i": i})
        runs, _, pruned = await _first_page(client, history_window=3)
        assert pruned == 1 and [r.run_id for r in runs] == ["w1", "w2", "w3"]
        runs, _, pruned = await _first_page(client)
        assert pruned == 1 and [r.run_id for r in runs] == ["w2", "w3"]
