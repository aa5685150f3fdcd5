"""EvalService rules over every backend (no server): upserts, the history
window, A/B samples and the snapshot, key bounds and backend cost."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from fencepost import reasons
from fencepost.keys import encode_segment
from fencepost_server.domain.errors import InvalidArgument, NotFound
from fencepost_server.domain.evals import EvalStore, format_at
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import Storage
from fencepost_server.storage.counting import CountingStorage
from fencepost_server.storage.memory import MemoryStorage

T = "tenant-a"
A = "agent-1"
SEC = 1_000_000_000


def store(storage: Storage, **kwargs: object) -> EvalStore:
    ticks = itertools.count(1_700_000_000 * SEC, SEC)  # a clock that moves one second per write
    return EvalStore(storage, Limits(), RequestLog(storage), clock_ns=lambda: next(ticks), **kwargs)  # type: ignore[arg-type]


async def all_keys(storage: Storage, prefix: str = "") -> list[str]:
    return await storage.list_keys(prefix, None, 10_000)


async def test_upsert_replaces_the_snapshot(storage: Storage) -> None:
    evals = store(storage)
    first = await evals.put_run(T, A, "run-1", {"status": "started", "done": 0})
    second = await evals.put_run(T, A, "run-1", {"status": "finished", "done": 10})
    assert second.updated_ns > first.updated_ns
    got = await evals.get_run(T, A, "run-1")
    assert got.snapshot == {"status": "finished", "done": 10}
    page = await evals.list_runs(T, A, 0, "")
    assert [(r.run_id, r.snapshot["status"]) for r in page.runs] == [("run-1", "finished")]
    assert len(await all_keys(storage, "")) == 1  # one key per run, no history rows


async def test_list_returns_every_run_within_the_window(storage: Storage) -> None:
    evals = store(storage)
    ids = [f"run-{i:02d}" for i in range(30)]
    for run_id in ids:
        await evals.put_run(T, A, run_id, {"n": run_id})
    page = await evals.list_runs(T, A, 0, "")
    assert [r.run_id for r in page.runs] == ids and page.pruned == 0 and page.next_page_token == ""


async def test_list_prunes_past_the_default_window_of_50_newest(storage: Storage) -> None:
    evals = store(storage)
    for i in range(60):
        await evals.put_run(T, A, f"run-{i:02d}", {"i": i})
    await evals.put_run(T, A, "run-00", {"i": "refreshed"})  # the oldest run becomes the newest
    page = await evals.list_runs(T, A, 0, "")
    kept = {r.run_id for r in page.runs}
    assert page.pruned == 10 and len(kept) == 50
    assert kept == {"run-00"} | {f"run-{i:02d}" for i in range(11, 60)}
    # Pruned runs are gone from storage, not just hidden.
    assert len(await all_keys(storage)) == 50
    with pytest.raises(NotFound) as exc:
        await evals.get_run(T, A, "run-05")
    assert exc.value.reason == reasons.EVAL_RUN_NOT_FOUND
    again = await evals.list_runs(T, A, 0, "")
    assert again.pruned == 0 and {r.run_id for r in again.runs} == kept


async def test_history_window_is_configurable(storage: Storage) -> None:
    evals = store(storage, history_window=3)
    for i in range(5):
        await evals.put_run(T, A, f"r{i}", {})
    assert [r.run_id for r in (await evals.list_runs(T, A, 0, "")).runs] == ["r2", "r3", "r4"]
    # A per-request window overrides the configured one.
    assert [r.run_id for r in (await evals.list_runs(T, A, 0, "", history_window=1)).runs] == ["r4"]


async def test_list_runs_pages_every_run(storage: Storage) -> None:
    evals = store(storage)
    for i in range(7):
        await evals.put_run(T, A, f"r{i}", {"i": i})
    seen, token = [], ""
    while True:
        page = await evals.list_runs(T, A, 3, token)
        seen += [r.run_id for r in page.runs]
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"r{i}" for i in range(7)]
    with pytest.raises(InvalidArgument) as exc:  # a token is bound to its agent
        await evals.list_runs(T, "other-agent", 3, (await evals.list_runs(T, A, 3, "")).next_page_token)
    assert exc.value.reason == reasons.PAGE_TOKEN_INVALID


async def test_a_run_the_prune_spared_is_listed_as_it_now_is(storage: Storage) -> None:
    """ListEvalRuns returns every stored run: a run upserted while the first
    page pruned survives the prune, so the page lists it (its new snapshot),
    not only the later pages' keys after it."""
    evals = store(storage, history_window=1)
    await evals.put_run(T, A, "old", {"v": 1})
    await evals.put_run(T, A, "new", {"v": 1})
    real_delete = storage.delete_if_version

    async def racing_delete(key: str, expected: str):  # type: ignore[no-untyped-def]
        await evals.put_run(T, A, "old", {"v": 2})  # another host refreshes the run first
        return await real_delete(key, expected)

    storage.delete_if_version = racing_delete  # type: ignore[method-assign]
    try:
        page = await evals.list_runs(T, A, 0, "")
    finally:
        del storage.delete_if_version
    assert page.pruned == 0
    assert [(r.run_id, r.snapshot) for r in page.runs] == [("new", {"v": 1}), ("old", {"v": 2})]
    assert (await evals.get_run(T, A, "old")).snapshot == {"v": 2}


async def test_delete_run(storage: Storage) -> None:
    evals = store(storage)
    await evals.put_run(T, A, "r", {})
    assert await evals.delete_run(T, A, "r") is True
    assert await evals.delete_run(T, A, "r") is False
    assert (await evals.list_runs(T, A, 0, "")).runs == []


async def test_runs_are_scoped_by_tenant_and_agent(storage: Storage) -> None:
    evals = store(storage)
    await evals.put_run(T, A, "r", {"who": "a"})
    await evals.put_run(T, "agent-2", "r", {"who": "b"})
    await evals.put_run("tenant-b", A, "r", {"who": "c"})
    assert [r.snapshot["who"] for r in (await evals.list_runs(T, A, 0, "")).runs] == ["a"]


async def test_samples_are_one_key_each_and_list_in_time_order(storage: Storage) -> None:
    evals = store(storage)
    for at in (3, 1, 2):
        await evals.put_sample(T, A, "exp", "s1", at * SEC, {"turns": at})
    await evals.put_sample(T, A, "exp", "s0", 5 * SEC, {"turns": 5})
    await evals.put_sample(T, A, "other-exp", "s1", 1 * SEC, {"turns": 9})
    page = await evals.list_samples(T, A, "exp", "", 0, "")
    assert [(s.session_id, s.at_ns // SEC, s.sample["turns"]) for s in page.samples] == [
        ("s0", 5, 5), ("s1", 1, 1), ("s1", 2, 2), ("s1", 3, 3),
    ]
    only_s1 = await evals.list_samples(T, A, "exp", "s1", 0, "")
    assert [s.at_ns // SEC for s in only_s1.samples] == [1, 2, 3]
    # Re-sending a sample (same experiment, session, at) overwrites itself.
    await evals.put_sample(T, A, "exp", "s1", 1 * SEC, {"turns": 1})
    assert len((await evals.list_samples(T, A, "exp", "", 0, "")).samples) == 4


async def test_64_concurrent_samples_for_one_experiment_all_land(storage: Storage) -> None:
    evals = store(storage)
    await asyncio.gather(
        *(evals.put_sample(T, A, "exp", f"session-{i % 8}", 1_700_000_000 * SEC + i, {"i": i}) for i in range(64))
    )
    seen, token = [], ""
    while True:
        page = await evals.list_samples(T, A, "exp", "", 10, token)
        seen += [s.sample["i"] for s in page.samples]
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == list(range(64))


async def test_snapshot_last_write_wins(storage: Storage) -> None:
    evals = store(storage)
    assert await evals.get_snapshot(T, A) is None
    first = await evals.put_snapshot(T, A, {"exp": {"a": 1}})
    second = await evals.put_snapshot(T, A, {"exp": {"a": 2}})
    snap = await evals.get_snapshot(T, A)
    assert snap is not None and snap.snapshot == {"exp": {"a": 2}} and snap.updated_ns == second > first
    assert len(await all_keys(storage)) == 1


@pytest.mark.parametrize(
    ("experiment", "session_id"),
    [
        pytest.param("é" * 5000, "😀" * 5000, id="long-unicode"),
        pytest.param("x" * 100_000, "y/" * 50_000, id="long-ascii-with-slashes"),
        pytest.param("実験/α β", "セッション?#%", id="short-unicode"),
    ],
)
async def test_long_or_unicode_ids_stay_bounded(storage: Storage, experiment: str, session_id: str) -> None:
    evals = store(storage)
    at = 1_700_000_000 * SEC + 123
    await evals.put_sample(T, A, experiment, session_id, at, {"ok": True})
    await evals.put_run(T, A, experiment, {"ok": True})
    keys = await all_keys(storage, encode_segment(T) + "/")
    assert len(keys) == 2
    sample_key = next(k for k in keys if "/ab-samples/" in k)
    exp_seg, sess_seg, at_seg = sample_key.split("/ab-samples/", 1)[1].split("/")
    assert exp_seg == encode_segment(experiment) and sess_seg == encode_segment(session_id)
    assert at_seg == format_at(at)
    for key in keys:
        assert len(key.encode()) <= Limits().max_key_bytes
        assert all(len(seg.encode()) <= 256 for seg in key.split("/"))
    # The caller's own ids come back, whatever the key holds.
    page = await evals.list_samples(T, A, experiment, session_id, 0, "")
    assert [(s.experiment, s.session_id, s.at_ns) for s in page.samples] == [(experiment, session_id, at)]
    assert (await evals.get_run(T, A, experiment)).run_id == experiment


def test_at_segment_is_fixed_width_and_sorts_by_time() -> None:
    instants = [-62_135_596_800 * SEC, -1, 0, 1, SEC, 1_700_000_000 * SEC + 5, 253_402_300_799 * SEC + SEC - 1]
    formatted = [format_at(ns) for ns in instants]
    assert formatted == sorted(formatted) and len({len(f) for f in formatted}) == 1
    assert format_at(1_700_000_000 * SEC + 5) == "20231114T221320.000000005Z"
    assert all(encode_segment(f) == f for f in formatted)


@pytest.mark.parametrize(
    ("call", "reason", "field"),
    [
        (lambda e: e.put_run(T, "", "r", {}), reasons.AGENT_NAME_INVALID, "agent"),
        (lambda e: e.put_run(T, A, "", {}), reasons.FIELD_INVALID, "run_id"),
        (lambda e: e.put_sample(T, A, "", "s", 1, {}), reasons.FIELD_INVALID, "experiment"),
        (lambda e: e.put_sample(T, A, "x", "", 1, {}), reasons.FIELD_INVALID, "session_id"),
        (lambda e: e.put_sample(T, A, "x", "s", None, {}), reasons.FIELD_INVALID, "at"),
        (lambda e: e.put_snapshot(T, A, {"big": "x" * 300_000}), reasons.VALUE_TOO_LARGE, "snapshot"),
        (lambda e: e.list_runs(T, A, -1, ""), reasons.PAGE_SIZE_INVALID, "page_size"),
        (lambda e: e.list_runs(T, A, 0, "", history_window=-1), reasons.FIELD_INVALID, "history_window"),
    ],
)
async def test_invalid_requests_write_nothing(call, reason: str, field: str) -> None:  # type: ignore[no-untyped-def]
    backend = MemoryStorage()
    with pytest.raises(InvalidArgument) as exc:
        await call(store(backend))
    assert (exc.value.reason, exc.value.field) == (reason, field)
    assert await all_keys(backend) == []


async def test_put_ab_sample_costs_one_write_and_no_read(storage: Storage) -> None:
    counting = CountingStorage(storage)
    evals = store(counting)
    await evals.put_sample(T, A, "exp", "s1", 1_700_000_000 * SEC, {"turns": 1})
    assert dict(counting.calls) == {"put": 1}
    counting.reset()
    await evals.put_snapshot(T, A, {"a": 1})
    await evals.put_run(T, A, "r", {"a": 1})
    assert dict(counting.calls) == {"put": 2}


async def test_request_id_makes_a_retry_report_the_first_outcome(storage: Storage) -> None:
    evals = store(storage)
    first = await evals.put_run(T, A, "r", {"a": 1}, request_id="req-1")
    retry = await evals.put_run(T, A, "r", {"a": 1}, request_id="req-1")
    assert retry.updated_ns == first.updated_ns
    stored = json.loads((await storage.list(encode_segment(T) + "/", None, 10))[0].value)
    assert stored["updated_ns"] == first.updated_ns
    with pytest.raises(InvalidArgument) as exc:
        await evals.put_run(T, A, "r", {"a": 2}, request_id="req-1")
    assert exc.value.reason == reasons.REQUEST_ID_REUSED


async def test_a_retry_across_the_upgrade_to_sorted_fingerprints_still_replays(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first attempt served by a build that hashed the snapshot in wire
    order (its marker holds that fingerprint) replays on this build."""
    import fencepost_server.domain.evals as evals_module

    evals = store(storage)
    snapshot = {"b": 1, "a": 2}  # not in sorted order
    dump = evals_module._dump
    monkeypatch.setattr(evals_module, "_dump", lambda record, sort_keys=False: dump(record))
    first = await evals.put_run(T, A, "r", snapshot, request_id="req-up")
    monkeypatch.setattr(evals_module, "_dump", dump)
    retry = await evals.put_run(T, A, "r", snapshot, request_id="req-up")
    assert retry.updated_ns == first.updated_ns
    with pytest.raises(InvalidArgument) as exc:
        await evals.put_run(T, A, "r", {"b": 1, "a": 3}, request_id="req-up")
    assert exc.value.reason == reasons.REQUEST_ID_REUSED


async def test_a_retry_reports_the_first_outcome_after_another_write(storage: Storage) -> None:
    """AIP-155: a retry answers what the first attempt did, even when another
    writer has since replaced the run or the snapshot (nothing is written again)."""
    evals = store(storage)
    first = await evals.put_run(T, A, "r", {"a": 1}, request_id="req-run")
    await evals.put_run(T, A, "r", {"a": 2})  # another writer, later
    retry = await evals.put_run(T, A, "r", {"a": 1}, request_id="req-run")
    assert (retry.snapshot, retry.updated_ns) == ({"a": 1}, first.updated_ns)
    assert (await evals.get_run(T, A, "r")).snapshot == {"a": 2}

    first_ns = await evals.put_snapshot(T, A, {"s": 1}, request_id="req-snap")
    later_ns = await evals.put_snapshot(T, A, {"s": 2})
    assert await evals.put_snapshot(T, A, {"s": 1}, request_id="req-snap") == first_ns != later_ns
    snap = await evals.get_snapshot(T, A)
    assert snap is not None and snap.snapshot == {"s": 2}


async def test_an_agent_name_erase_agent_refuses_is_refused(storage: Storage) -> None:
    """EvalService took an agent name of any length, EraseAgent none over
    65,536 bytes: such an agent's runs could never be erased agent-wide."""
    evals = store(storage)
    big = "a" * 65_537
    before = await all_keys(storage)
    for call in (evals.put_run(T, big, "run-1", {"status": "started"}),
                 evals.put_snapshot(T, big, {"arms": {}})):
        with pytest.raises(InvalidArgument) as err:
            await call
        assert err.value.reason == reasons.AGENT_NAME_INVALID and err.value.field == "agent"
    assert await all_keys(storage) == before
    await evals.put_run(T, "a" * 65_536, "run-1", {"status": "started"})  # at the limit


def test_the_snapshot_key_and_the_runs_prefix_fit_the_key_limit_for_any_tenant_and_agent() -> None:
    """Why GetAbSnapshot, PutAbSnapshot and ListEvalRuns declare no
    KEY_TOO_LONG: the keys they build hold no caller id but the tenant and
    the agent, two segments encoded to at most 256 bytes or a hash."""
    evals = EvalStore(MemoryStorage(), Limits(), RequestLog(MemoryStorage()))
    for tenant, agent in (("t" * 1000, "a" * 65_536), ("t" * 256, "a" * 256), ("%" * 85, "\U0001f600" * 21)):
        for key in (evals._snapshot_key(tenant, agent), evals._runs_prefix(tenant, agent)):
            assert len(key.encode()) <= Limits().max_key_bytes, (tenant[:8], agent[:8], len(key.encode()))
