"""spec/ledger.md statement by statement over gRPC, on every backend: the
exact reason and metadata of each refusal, and the edges of replays, forks,
paging and caps."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost.v1 import ledger_pb2
from fencepost_server.storage import Storage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import Drained, running


async def _held(c: fencepost.AsyncClient, key: str, holder: str = "A", ttl: float = 60) -> tuple[str, int]:
    sid = (await c.open_session("agent", key)).session_id
    return sid, (await c.acquire_lease(sid, holder, ttl=ttl)).generation


async def _log(c: fencepost.AsyncClient, sid: str, **kw: int) -> list[tuple[int, bytes]]:
    return [(r.seq, r.data) async for r in c.read_log(sid, **kw)]


async def test_lease_held_names_the_holder_generation_and_expiry(client: fencepost.AsyncClient) -> None:
    sid, gen = await _held(client, "held")
    lease = (await client.get_session(sid)).lease
    with pytest.raises(errors.LeaseHeld) as held:
        await client.acquire_lease(sid, "B", ttl=30)
    assert (held.value.code, held.value.reason) == ("FAILED_PRECONDITION", "LEASE_HELD")
    md = held.value.metadata
    assert md["holder"] == "A" and int(md["generation"]) == gen
    expires = datetime.fromisoformat(md["expires_at"].replace("Z", "+00:00")).timestamp()
    assert expires == pytest.approx(lease.expires_at, abs=0.001)
    # refused: nothing changed
    after = (await client.get_session(sid)).lease
    assert (after.holder_id, after.generation, after.live) == ("A", gen, True)


async def test_refusals_of_a_commit_carry_their_metadata_and_write_nothing(client: fencepost.AsyncClient) -> None:
    sid, gen = await _held(client, "refusals")
    kept = (await client.deliver(b"kept", session_id=sid)).inbox_id
    gone = (await client.deliver(b"gone", session_id=sid)).inbox_id
    await client.commit(sid, gen, 0, [b"r1"], consume=[gone])

    with pytest.raises(errors.SequenceMismatch) as mismatch:
        await client.commit(sid, gen, 0, [b"x"])
    assert mismatch.value.code == "FAILED_PRECONDITION"
    assert (mismatch.value.metadata["expected_seq"], mismatch.value.metadata["current_seq"]) == ("0", "1")
    with pytest.raises(errors.SequenceMismatch) as ahead:
        await client.commit(sid, gen, 5, [b"x"])
    assert (ahead.value.metadata["expected_seq"], ahead.value.metadata["current_seq"]) == ("5", "1")

    with pytest.raises(errors.InboxEntryGone) as entry_gone:
        await client.commit(sid, gen, 1, [b"x"], consume=[kept, gone])
    assert entry_gone.value.code == "FAILED_PRECONDITION"
    assert gone in entry_gone.value.metadata["inbox_ids"] and kept not in entry_gone.value.metadata["inbox_ids"]
    # nothing written: the kept event is still pending, the log and head unchanged
    assert [e.inbox_id async for e in client.list_inbox(sid)] == [kept]
    assert await _log(client, sid) == [(1, b"r1")]
    info = await client.get_session(sid)
    assert (info.seq, info.pending) == (1, 1)

    await client.release_lease(sid, gen, force=True)
    new = (await client.acquire_lease(sid, "B", ttl=30)).generation
    with pytest.raises(errors.LeaseFenced) as fenced:
        await client.commit(sid, gen, 1, [b"late"], consume=[kept])
    assert fenced.value.code == "FAILED_PRECONDITION"
    assert fenced.value.metadata["generation"] == str(gen)
    assert fenced.value.metadata["current_generation"] == str(new)
    # fenced wins over a wrong seq (the holder has lost the session: final)
    with pytest.raises(errors.LeaseFenced):
        await client.commit(sid, gen, 0, [b"late"])
    assert await _log(client, sid) == [(1, b"r1")]


async def test_a_replay_returns_the_first_seq_and_pending_after_later_commits(client: fencepost.AsyncClient) -> None:
    sid, gen = await _held(client, "replay")
    a = (await client.deliver(b"a", session_id=sid)).inbox_id
    b = (await client.deliver(b"b", session_id=sid)).inbox_id
    first = await client.commit(sid, gen, 0, [b"1", b"2"], consume=[a], commit_id="turn-1")
    assert (first.seq, first.pending, first.replayed) == (2, 1, False)
    await client.commit(sid, gen, 2, [b"3"], consume=[b], commit_id="turn-2")
    again = await client.commit(sid, gen, 0, [b"1", b"2"], consume=[a], commit_id="turn-1")
    assert (again.seq, again.replayed) == (2, True)
    assert await _log(client, sid) == [(1, b"1"), (2, b"2"), (3, b"3")]

    # the same commit_id with other content is not a replay: refused, nothing written
    for other in (
        dict(expected_seq=0, records=[b"1", b"X"], consume=[a]),
        dict(expected_seq=0, records=[b"1", b"2"], consume=[]),
        dict(expected_seq=3, records=[b"1", b"2"], consume=[a]),
    ):
        with pytest.raises(errors.FencepostError) as reused:
            await client.commit(sid, gen, other["expected_seq"], other["records"],  # type: ignore[arg-type]
                                consume=other["consume"], commit_id="turn-1")  # type: ignore[arg-type]
        assert (reused.value.code, reused.value.reason) == ("INVALID_ARGUMENT", "FIELD_INVALID"), reused.value
    assert await _log(client, sid) == [(1, b"1"), (2, b"2"), (3, b"3")]


async def test_redelivery_and_try_lease_over_the_wire(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "try")).session_id
    granted = await client.deliver(b"e1", session_id=sid, dedupe_key="k1", try_lease="W1", ttl=30)
    assert granted.lease_granted and not granted.duplicate
    assert granted.lease is not None and (granted.lease.holder_id, granted.lease.generation) == ("W1", 1)
    assert granted.lease.live
    held = await client.deliver(b"e2", session_id=sid, dedupe_key="k2", try_lease="W2", ttl=30)
    assert not held.lease_granted and held.lease is not None
    assert (held.lease.holder_id, held.lease.generation) == ("W1", 1)
    # a redelivery parks nothing, also with try_lease, and returns the first id
    dup = await client.deliver(b"e1", session_id=sid, dedupe_key="k1", try_lease="W2", ttl=30)
    assert dup.duplicate and dup.inbox_id == granted.inbox_id and not dup.lease_granted
    assert [e.inbox_id async for e in client.list_inbox(sid)] == [granted.inbox_id, held.inbox_id]
    out = await client.commit(sid, 1, 0, [b"r"], consume=[granted.inbox_id, held.inbox_id])
    assert out.pending == 0
    again = await client.deliver(b"e2", agent="agent", session_key="try", dedupe_key="k2")
    assert again.duplicate and again.inbox_id == held.inbox_id and again.session_id == sid
    assert [e async for e in client.list_inbox(sid)] == []
    assert (await client.get_session(sid)).pending == 0


async def test_a_payload_over_the_inline_limit_round_trips_and_is_gone_after_consumption(
    client: fencepost.AsyncClient,
) -> None:
    sid, gen = await _held(client, "big")
    big = bytes(range(256)) * 400  # 100 KiB, over the 64 KiB inline limit
    limit = b"m" * (256 * 1024)
    d1 = await client.deliver(big, session_id=sid, dedupe_key="big")
    d2 = await client.deliver(limit, session_id=sid)
    assert [(e.inbox_id, e.payload, e.dedupe_key) async for e in client.list_inbox(sid)] == [
        (d1.inbox_id, big, "big"), (d2.inbox_id, limit, "")]
    watched = []
    async for e in client.watch_inbox(sid, gen):
        watched.append((e.inbox_id, e.payload))
        if len(watched) == 2:
            break
    assert watched == [(d1.inbox_id, big), (d2.inbox_id, limit)]
    out = await client.commit(sid, gen, 0, [b"r"], consume=[d1.inbox_id])
    assert out.pending == 1
    assert [e.inbox_id async for e in client.list_inbox(sid)] == [d2.inbox_id]
    dup = await client.deliver(big, session_id=sid, dedupe_key="big")
    assert dup.duplicate and dup.inbox_id == d1.inbox_id
    assert [e.inbox_id async for e in client.list_inbox(sid)] == [d2.inbox_id]
    with pytest.raises(errors.EventTooLarge):
        await client.deliver(limit + b"x", session_id=sid)


async def test_an_open_watch_ends_with_lease_fenced_after_a_takeover(storage: Storage) -> None:
    async with running(storage, ledger_watch_poll_seconds=0.05) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "watch-fenced", ttl=0.3)
        await c.deliver(b"backlog", session_id=sid)
        watch = Drained(c.watch_inbox(sid, gen), lambda e: e.payload)
        await watch.until_seen(1)
        await c.deliver(b"live", session_id=sid)
        await watch.until_seen(2)
        await asyncio.sleep(0.35)  # the lease expires: the takeover is an acquire, no release
        new = (await c.acquire_lease(sid, "B", ttl=30)).generation
        await watch.end()
        assert watch.seen == [b"backlog", b"live"]
        assert len(watch.ended) == 1 and isinstance(watch.ended[0], errors.LeaseFenced)
        assert watch.ended[0].metadata.get("current_generation") == str(new)


async def test_read_log_of_forks_and_its_bounds(client: fencepost.AsyncClient) -> None:
    parent, gen = await _held(client, "p")
    await client.commit(parent, gen, 0, [b"p1", b"p2", b"p3", b"p4"])
    empty = await client.fork(parent, 0, "c0")
    whole = await client.fork(parent, 4, "c4")
    assert (empty.seq, empty.seed_length, empty.parent_session_id) == (0, 0, parent)
    assert (whole.seq, whole.seed_length) == (4, 4)
    assert await _log(client, empty.session_id) == []
    with pytest.raises(errors.FencepostError) as beyond:
        await client.fork(parent, 5, "c5")
    assert (beyond.value.code, beyond.value.reason) == ("INVALID_ARGUMENT", "FIELD_INVALID")
    with pytest.raises(errors.FencepostError) as negative:
        await client.fork(parent, -1, "cm1")
    assert negative.value.code == "INVALID_ARGUMENT"

    child = await client.fork(parent, 2, "c2")
    assert child.lease.generation == 0 and child.pending == 0 and not child.lease.live
    cgen = (await client.acquire_lease(child.session_id, "C", ttl=60)).generation
    with pytest.raises(errors.SequenceMismatch):
        await client.commit(child.session_id, cgen, 0, [b"c3"])
    await client.commit(child.session_id, cgen, 2, [b"c3", b"c4"])
    grand = await client.fork(child.session_id, 3, "g")
    assert (grand.seed_length, grand.parent_session_id) == (3, child.session_id)
    ggen = (await client.acquire_lease(grand.session_id, "G", ttl=60)).generation
    await client.commit(grand.session_id, ggen, 3, [b"g4"])
    await client.commit(parent, gen, 4, [b"p5"])

    g = grand.session_id
    assert await _log(client, g) == [(1, b"p1"), (2, b"p2"), (3, b"c3"), (4, b"g4")]
    assert await _log(client, g, from_seq=0) == await _log(client, g)
    assert await _log(client, g, from_seq=2, limit=2) == [(2, b"p2"), (3, b"c3")]
    assert await _log(client, g, from_seq=3) == [(3, b"c3"), (4, b"g4")]
    assert await _log(client, g, from_seq=4, limit=1) == [(4, b"g4")]
    assert await _log(client, g, from_seq=5) == []
    assert await _log(client, g, from_seq=1, limit=1) == [(1, b"p1")]
    assert await _log(client, g, limit=100) == await _log(client, g)
    assert await _log(client, child.session_id) == [(1, b"p1"), (2, b"p2"), (3, b"c3"), (4, b"c4")]
    assert [d for _, d in await _log(client, parent)] == [b"p1", b"p2", b"p3", b"p4", b"p5"]
    for bad in ({"from_seq": -1}, {"limit": -1}):
        with pytest.raises(errors.FencepostError) as refused:
            await _log(client, g, **bad)
        assert refused.value.code == "INVALID_ARGUMENT", bad


async def test_release_refuses_while_pending_and_force_hands_it_on(client: fencepost.AsyncClient) -> None:
    sid, gen = await _held(client, "release")
    await client.deliver(b"a", session_id=sid)
    await client.deliver(b"b", session_id=sid)
    with pytest.raises(errors.InboxNotEmpty) as refused:
        await client.release_lease(sid, gen)
    assert refused.value.code == "FAILED_PRECONDITION" and refused.value.metadata["pending"] == "2"
    info = await client.get_session(sid)
    assert info.lease.live and not info.lease.released and info.lease.generation == gen
    assert await client.release_lease(sid, gen, force=True) == 2
    info = await client.get_session(sid)
    assert (info.lease.generation, info.lease.released, info.lease.live, info.pending) == (gen, True, False, 2)
    assert await client.release_lease(sid, gen, force=True) == 2  # idempotent
    with pytest.raises(errors.LeaseFenced):
        await client.commit(sid, gen, 0, [b"after release"])
    assert (await client.acquire_lease(sid, "B", ttl=30)).generation == gen + 1


async def test_acquire_renew_and_generation_rules(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "gen")).session_id
    never = (await client.get_session(sid)).lease
    # never leased: free, but nobody released it
    assert (never.holder_id, never.generation, never.live, never.released) == ("", 0, False, False)
    g1 = await client.acquire_lease(sid, "A", ttl=30)
    assert g1.generation == 1
    renewed = await client.acquire_lease(sid, "A", ttl=60, generation=1)
    assert renewed.generation == 1 and renewed.expires_at > g1.expires_at
    again = await client.acquire_lease(sid, "A", ttl=30)  # same holder, no generation: a new incarnation
    assert again.generation == 2
    with pytest.raises(errors.LeaseFenced):
        await client.renew_lease(sid, 1, ttl=30)
    with pytest.raises(errors.LeaseHeld):
        await client.acquire_lease(sid, "B", ttl=30, generation=2)
    # expired and untaken: still renews; expired: acquire by another is granted
    short = await client.acquire_lease(sid, "A", ttl=0.05, generation=2)
    assert short.generation == 2
    await asyncio.sleep(0.1)
    assert not (await client.get_session(sid)).lease.live
    assert (await client.renew_lease(sid, 2, ttl=0.05)).generation == 2
    await asyncio.sleep(0.1)
    assert (await client.acquire_lease(sid, "B", ttl=30)).generation == 3
    for bad in ({"ttl": -1.0}, {"holder_id": ""}):
        with pytest.raises(errors.FencepostError) as refused:
            await client.acquire_lease(sid, bad.get("holder_id", "C"), ttl=bad.get("ttl", 30))  # type: ignore[arg-type]
        assert refused.value.code == "INVALID_ARGUMENT", bad
    assert (await client.get_session(sid)).lease.generation == 3


async def test_get_session_reports_the_head(client: fencepost.AsyncClient) -> None:
    opened = await client.open_session("agent", "head", metadata={"channel": "c1"})
    sid = opened.session_id
    reopened = await client.open_session("agent", "head", metadata={"channel": "other"})
    assert reopened.session_id == sid and reopened.metadata == {"channel": "c1"}
    together = await asyncio.gather(*(client.open_session("agent", "together") for _ in range(8)))
    assert len({s.session_id for s in together}) == 1
    lease = await client.acquire_lease(sid, "A", ttl=30)
    await client.deliver(b"e", session_id=sid)
    await client.commit(sid, lease.generation, 0, [b"1", b"2"])
    info = await client.get_session(sid)
    assert (info.agent, info.session_key, info.seq, info.pending) == ("agent", "head", 2, 1)
    assert (info.lease.holder_id, info.lease.generation, info.lease.live) == ("A", lease.generation, True)
    assert info.lease.expires_at == pytest.approx(lease.expires_at, abs=0.001)
    assert info.create_time <= info.last_activity_time and info.create_time > 0
    assert (info.parent_session_id, info.seed_length, info.metadata) == ("", 0, {"channel": "c1"})
    assert (await client.resolve_session("agent", "head")).session_id == sid


async def test_claim_orphan_waits_and_filters_by_agent(storage: Storage) -> None:
    async with running(
        storage, ledger_janitor_seconds=0.05, ledger_orphan_grace_seconds=0.05
    ) as srv, srv.client(timeout=10) as c:
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await c.claim_orphan("W", ttl=30, wait=1.0) is None
        assert loop.time() - start >= 1.0  # waited for one
        start = loop.time()
        assert await c.claim_orphan("W", ttl=30) is None  # unset wait: at once
        assert loop.time() - start < 1.0
        with pytest.raises(errors.FencepostError) as refused:
            await c.claim_orphan("W", ttl=30, wait=-1.0)
        assert (refused.value.code, refused.value.reason) == ("INVALID_ARGUMENT", "FIELD_INVALID")

        sid = (await c.open_session("other-agent", "o")).session_id
        waiting = asyncio.create_task(c.claim_orphan("W", ttl=30, wait=5, agent="agent"))
        other = asyncio.create_task(c.claim_orphan("V", ttl=30, wait=5, agent="other-agent"))
        await asyncio.sleep(0.1)
        await c.deliver(b"e", session_id=sid)  # never leased: an orphan once the janitor sees it
        got = await asyncio.wait_for(other, 10)
        assert got is not None and got.session_id == sid and got.lease.holder_id == "V" and got.pending == 1
        assert got.lease.generation == 1 and got.lease.live
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting


def _summary_ids(page: list[fencepost.SessionSummary]) -> list[str]:
    return [s.session_id for s in page]


async def test_list_sessions_caps_are_exact(client: fencepost.AsyncClient) -> None:
    sids = []
    sizes = [10, 20, 30, 40, 50]
    for i, size in enumerate(sizes):
        sid, gen = await _held(client, f"s{i}", "A")
        await client.commit(sid, gen, 0, [b"x" * size])
        sids.append(sid)
    newest_first = sids[::-1]
    listed = [s async for s in client.list_sessions("agent")]
    assert _summary_ids(listed) == newest_first
    assert [s.total_bytes for s in listed] == sizes[::-1]
    assert [s.seq for s in listed] == [1] * 5
    times = [s.last_activity_time for s in listed]
    assert times == sorted(times, reverse=True)
    assert _summary_ids([s async for s in client.list_sessions("agent", max_sessions=3, page_size=1)]) == sids[::-1][:3]
    # bytes: 50 + 40 = 90 fits in 90; 91..119 still two; 120 three
    for cap, n in ((49, 0), (50, 1), (89, 1), (90, 2), (119, 2), (120, 3), (150, 5)):
        got = [s async for s in client.list_sessions("agent", max_total_bytes=cap, page_size=2)]
        assert _summary_ids(got) == newest_first[:n], cap
    page, token = await client.list_sessions_page("agent", page_size=2)
    assert _summary_ids(page) == newest_first[:2] and token
    page2, token2 = await client.list_sessions_page("agent", page_size=2, page_token=token)
    assert _summary_ids(page2) == newest_first[2:4]
    page3, token3 = await client.list_sessions_page("agent", page_size=2, page_token=token2)
    assert _summary_ids(page3) == newest_first[4:] and token3 == ""
    with pytest.raises(errors.FencepostError) as other_params:
        await client.list_sessions_page("agent", page_size=2, max_sessions=3, page_token=token)
    assert other_params.value.reason == "PAGE_TOKEN_INVALID"
    for bad in ({"max_sessions": -1}, {"max_total_bytes": -1}, {"max_age": -1.0}, {"page_size": -1}):
        with pytest.raises(errors.FencepostError) as refused:
            await client.list_sessions_page("agent", **bad)  # type: ignore[arg-type]
        assert refused.value.code == "INVALID_ARGUMENT", bad
    assert [s async for s in client.list_sessions("nobody")] == []


async def test_list_sessions_max_age(client: fencepost.AsyncClient) -> None:
    old, gen = await _held(client, "old")
    await client.commit(old, gen, 0, [b"o"])
    await asyncio.sleep(1.0)
    loop = asyncio.get_running_loop()
    opened = loop.time()
    new = (await client.open_session("agent", "new")).session_id
    young = _summary_ids([s async for s in client.list_sessions("agent", max_age=0.8)])
    # the old session is skipped; the new one too only on a machine slower than max_age
    assert young == ([new] if loop.time() - opened < 0.8 else [])
    assert _summary_ids([s async for s in client.list_sessions("agent", max_age=30)]) == [new, old]


async def test_raw_read_log_rejects_nothing_silently(client: fencepost.AsyncClient) -> None:
    """ReadLog with from_seq past the head, or limit past the end, ends cleanly."""
    sid, gen = await _held(client, "raw")
    await client.commit(sid, gen, 0, [b"a"])
    stub = client._ledger
    pages = [p async for p in stub.ReadLog(ledger_pb2.ReadLogRequest(session_id=sid, from_seq=2))]
    assert sum(len(p.records) for p in pages) == 0


async def test_acquire_renewing_a_fenced_generation_is_lease_fenced(client: fencepost.AsyncClient) -> None:
    """AcquireLease with `generation` is a renewal by generation: an older
    incarnation of the holder that renews so after its id was granted anew is
    fenced (final), and must not be granted a generation that fences the
    newer incarnation in the middle of its turn."""
    sid = (await client.open_session("agent", "stale-renew")).session_id
    old = await client.acquire_lease(sid, "A", ttl=30)
    new = await client.acquire_lease(sid, "A", ttl=30)  # the restarted holder reclaims its lease
    assert new.generation == old.generation + 1
    with pytest.raises(errors.LeaseFenced) as fenced:
        await client.acquire_lease(sid, "A", ttl=30, generation=old.generation)
    assert fenced.value.metadata["current_generation"] == str(new.generation)
    assert (await client.get_session(sid)).lease.generation == new.generation
    assert (await client.commit(sid, new.generation, 0, [b"turn"])).seq == 1  # the newer one still holds it
    # the same once the lease is free: the old generation's renewal is over
    await client.release_lease(sid, new.generation)
    with pytest.raises(errors.LeaseFenced):
        await client.acquire_lease(sid, "A", ttl=30, generation=old.generation)
    assert (await client.acquire_lease(sid, "A", ttl=30)).generation == new.generation + 1


async def test_acquire_by_the_holder_with_its_generation_just_after_expiry_is_a_renew(
    client: fencepost.AsyncClient,
) -> None:
    """Re-acquire by the current holder with its own generation is a renew,
    and a renew extends a lease that has just expired while nobody took it:
    the same generation, so the holder's writes in flight are not fenced."""
    sid = (await client.open_session("agent", "expired-renew")).session_id
    lease = await client.acquire_lease(sid, "A", ttl=0.2)
    while (await client.get_session(sid)).lease.live:
        await asyncio.sleep(0.05)
    again = await client.acquire_lease(sid, "A", ttl=30, generation=lease.generation)
    assert again.generation == lease.generation
    assert (await client.commit(sid, lease.generation, 0, [b"turn"])).seq == 1
    # another holder's id with that generation is not a renew: the live lease is held
    with pytest.raises(errors.LeaseHeld):
        await client.acquire_lease(sid, "B", ttl=30, generation=lease.generation)


async def test_commit_precedence_and_input_refusals(client: fencepost.AsyncClient) -> None:
    sid, gen = await _held(client, "precedence")
    e = (await client.deliver(b"e", session_id=sid)).inbox_id
    first = await client.commit(sid, gen, 0, [b"1"], consume=[e], commit_id="c1")
    # a stale seq and a gone entry: the seq is the one named
    with pytest.raises(errors.SequenceMismatch):
        await client.commit(sid, gen, 0, [b"x"], consume=[e])
    # an empty commit at the head consumes without appending
    e2 = (await client.deliver(b"e2", session_id=sid)).inbox_id
    drained = await client.commit(sid, gen, 1, [], consume=[e2])
    assert (drained.seq, drained.pending) == (1, 0)
    for consume in (["not-an-id"], [e2, e2]):
        with pytest.raises(errors.FencepostError) as refused:
            await client.commit(sid, gen, 1, [b"x"], consume=consume)
        assert (refused.value.code, refused.value.reason) == ("INVALID_ARGUMENT", "FIELD_INVALID"), consume
    with pytest.raises(errors.FencepostError) as negative:
        await client.commit(sid, gen, -1, [b"x"])
    assert negative.value.code == "INVALID_ARGUMENT"
    with pytest.raises(errors.CommitTooLarge) as too_many:
        await client.commit(sid, gen, 1, [], consume=[e] * 33)
    assert too_many.value.metadata["limit"] == "32"
    with pytest.raises(errors.RecordTooLarge):
        await client.commit(sid, gen, 1, [b"r" * (256 * 1024 + 1)])
    # the replay of an applied commit answers its first result, also once fenced
    await client.release_lease(sid, gen)
    assert (await client.commit(sid, gen, 0, [b"1"], consume=[e], commit_id="c1")).seq == first.seq
    with pytest.raises(errors.SessionNotFound):
        await client.commit("0" * 32 + "." + sid.split(".")[1], gen, 0, [b"x"])
    assert await _log(client, sid) == [(1, b"1")]


async def test_deliver_targets_and_watch_refusals(client: fencepost.AsyncClient) -> None:
    missing = "0" * 32 + "." + "YWdlbnQ"
    with pytest.raises(errors.SessionNotFound) as nf:
        await client.deliver(b"e", session_id=missing)
    assert nf.value.metadata["session_id"] == missing
    by_key = await client.deliver(b"e", agent="agent", session_key="made-by-deliver")
    assert (await client.resolve_session("agent", "made-by-deliver")).session_id == by_key.session_id
    assert (await client.get_session(by_key.session_id)).pending == 1
    sid = by_key.session_id
    for gen in (0, 1, 7):  # never granted
        with pytest.raises(errors.LeaseFenced):
            async for _ in client.watch_inbox(sid, gen):
                pass
    lease = await client.acquire_lease(sid, "A", ttl=30)
    await client.release_lease(sid, lease.generation, force=True)
    with pytest.raises(errors.LeaseFenced):  # released
        async for _ in client.watch_inbox(sid, lease.generation):
            pass
    with pytest.raises(errors.FencepostError) as ttl:
        await client.deliver(b"e", session_id=sid, try_lease="W", ttl=-1)
    assert ttl.value.code == "INVALID_ARGUMENT"
    assert (await client.get_session(sid)).pending == 1  # refused before parking


async def test_inbox_pages_and_a_watch_skips_consumed_events(client: fencepost.AsyncClient) -> None:
    sid, gen = await _held(client, "inbox-pages")
    ids = [(await client.deliver(b"e%d" % i, session_id=sid)).inbox_id for i in range(5)]
    assert [e.inbox_id async for e in client.list_inbox(sid, page_size=2)] == ids
    await client.commit(sid, gen, 0, [b"r"], consume=ids[:3])
    watched: list[str] = []
    async for ev in client.watch_inbox(sid, gen):
        watched.append(ev.inbox_id)
        if len(watched) == 2:
            break
    assert watched == ids[3:]
    with pytest.raises(errors.FencepostError) as bad:
        async for _ in client.list_inbox(sid, page_size=-1):
            pass
    assert bad.value.reason == "PAGE_SIZE_INVALID"


async def test_a_fork_lists_with_its_prefix_bytes(client: fencepost.AsyncClient) -> None:
    parent, gen = await _held(client, "fp")
    await client.commit(parent, gen, 0, [b"x" * 10, b"y" * 20])
    child = await client.fork(parent, 1, "fc")
    listed = {s.session_id: s async for s in client.list_sessions("agent")}
    assert (listed[child.session_id].seq, listed[child.session_id].total_bytes) == (1, 10)
    assert list(listed)[0] == child.session_id  # the newest activity
    cgen = (await client.acquire_lease(child.session_id, "C", ttl=30)).generation
    await client.commit(child.session_id, cgen, 1, [b"z" * 5])
    listed = {s.session_id: s async for s in client.list_sessions("agent")}
    assert (listed[child.session_id].seq, listed[child.session_id].total_bytes) == (2, 15)
    assert (listed[parent].seq, listed[parent].total_bytes) == (2, 30)


async def test_a_force_released_session_with_events_is_claimed(storage: Storage) -> None:
    async with running(
        storage, ledger_janitor_seconds=0.05, ledger_orphan_grace_seconds=0.05
    ) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "forced")
        live, _ = await _held(c, "live-holder")
        d = await c.deliver(b"e", session_id=sid)
        await c.deliver(b"e", session_id=live)  # its holder is live: never an orphan
        assert await c.release_lease(sid, gen, force=True) == 1
        claimed = await c.claim_orphan("W", ttl=30, wait=5)
        assert claimed is not None and claimed.session_id == sid
        assert (claimed.lease.generation, claimed.lease.holder_id, claimed.pending) == (gen + 1, "W", 1)
        out = await c.commit(sid, claimed.lease.generation, 0, [b"r"], consume=[d.inbox_id])
        assert out.pending == 0
        assert await c.claim_orphan("V", ttl=30, wait=0.3) is None


async def test_read_log_across_page_and_fork_boundaries(client: fencepost.AsyncClient) -> None:
    """Forks of forks cut inside the inherited prefix, read across backend
    pages (256 records) and across the seams between the sessions' records."""
    root, gen = await _held(client, "deep-root")
    seq = 0
    for _ in range(10):  # 640 records
        seq = (await client.commit(root, gen, seq, [b"r%d" % (seq + i + 1) for i in range(64)])).seq
    child = (await client.fork(root, 300, "deep-child")).session_id
    cgen = (await client.acquire_lease(child, "C", ttl=60)).generation
    cseq = 300
    for _ in range(5):  # 300 own records: 301..600
        cseq = (await client.commit(child, cgen, cseq, [b"c%d" % (cseq + i + 1) for i in range(60)])).seq
    inside = (await client.fork(child, 100, "deep-inside")).session_id  # within the child's prefix
    seam = (await client.fork(child, 300, "deep-seam")).session_id  # exactly the child's seed
    past = (await client.fork(child, 450, "deep-past")).session_id

    def expect(lo: int, hi: int, cut: int) -> list[tuple[int, bytes]]:
        return [(s, (b"r%d" if s <= cut else b"c%d") % s) for s in range(lo, hi + 1)]

    assert await _log(client, inside) == expect(1, 100, 300)
    assert await _log(client, seam) == expect(1, 300, 300)
    assert await _log(client, past) == expect(1, 450, 300)
    assert await _log(client, child, from_seq=250, limit=400) == expect(250, 600, 300)
    assert await _log(client, child, from_seq=255, limit=3) == expect(255, 257, 300)
    assert await _log(client, past, from_seq=299, limit=3) == expect(299, 301, 300)
    assert await _log(client, child, from_seq=512, limit=2) == expect(512, 513, 300)
    assert len(await _log(client, root)) == 640


async def test_a_watch_started_amid_deliveries_pushes_each_event_once_in_order(storage: Storage) -> None:
    async with running(storage, ledger_watch_poll_seconds=0.05) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "watch-race")
        n = 40
        seen: list[str] = []

        async def watch() -> None:
            async for e in c.watch_inbox(sid, gen):
                seen.append(e.inbox_id)
                if len(seen) >= n + 1:  # the one parked before, then n
                    await asyncio.sleep(0.3)  # long enough for a duplicate to show
                    return

        async def deliver() -> list[str]:
            out = []
            for i in range(n):
                out.append((await c.deliver(b"e%d" % i, session_id=sid)).inbox_id)
                if i % 8 == 0:
                    await asyncio.sleep(0.01)
            return out

        first = [(await c.deliver(b"pre", session_id=sid)).inbox_id]
        task = asyncio.create_task(watch())
        delivered = first + await deliver()
        await asyncio.wait_for(task, 20)
        assert seen == delivered


async def test_a_lease_expired_within_the_grace_is_not_an_orphan_yet(storage: Storage) -> None:
    async with running(
        storage, ledger_janitor_seconds=0.05, ledger_orphan_grace_seconds=1.0
    ) as srv, srv.client(timeout=10) as c:
        sid = (await c.open_session("agent", "grace")).session_id
        lease = await c.acquire_lease(sid, "A", ttl=0.05)
        await c.deliver(b"e", session_id=sid)
        assert await c.claim_orphan("W", ttl=30, wait=0.5) is None
        claimed = await c.claim_orphan("W", ttl=30, wait=5)
        assert claimed is not None and claimed.session_id == sid and claimed.lease.generation == lease.generation + 1
        # granted by the server's clock (this host's) no earlier than expiry + grace
        assert claimed.lease.expires_at - 30 >= lease.expires_at + 1.0


async def test_a_watch_sees_another_replicas_deliveries_and_takeover(tmp_path: Path) -> None:
    path = tmp_path / "replicas.db"
    s1, s2 = SqliteStorage(path, synchronous="NORMAL"), SqliteStorage(path, synchronous="NORMAL")
    settings = {"ledger_watch_poll_seconds": 0.05}
    async with running(s1, **settings) as a, running(s2, **settings) as b, \
            a.client(timeout=10) as ca, b.client(timeout=10) as cb:
        sid, gen = await _held(ca, "replicas")
        watch = Drained(ca.watch_inbox(sid, gen), lambda e: e.payload)
        await cb.deliver(b"elsewhere", session_id=sid)
        await watch.until_seen(1)
        await cb.release_lease(sid, gen, force=True)
        new = (await cb.acquire_lease(sid, "B", ttl=30)).generation
        await watch.end()
        assert watch.seen == [b"elsewhere"] and len(watch.ended) == 1
        assert isinstance(watch.ended[0], errors.LeaseFenced)
        assert watch.ended[0].metadata["current_generation"] == str(new)


async def test_a_new_sessions_last_activity_is_its_creation(client: fencepost.AsyncClient) -> None:
    """last_activity_time is "the last commit (or creation)": never before
    create_time, and equal to it until the first commit (compared as the
    Timestamps sent, not as floats)."""
    stub = client._ledger
    for i in range(20):
        opened = (await stub.OpenSession(ledger_pb2.OpenSessionRequest(agent="agent", session_key=f"t{i}"))).session
        got = (await stub.GetSession(ledger_pb2.GetSessionRequest(session_id=opened.session_id))).session
        forked = (await stub.Fork(ledger_pb2.ForkRequest(
            parent_session_id=opened.session_id, at_seq=0, child_session_key=f"f{i}"))).session
        for s in (opened, got, forked):
            assert s.last_activity_time.ToNanoseconds() == s.create_time.ToNanoseconds(), (i, s)
        assert got.create_time == opened.create_time


async def test_an_open_watch_ends_when_its_holder_releases_or_the_session_is_deleted(storage: Storage) -> None:
    async with running(storage, ledger_watch_poll_seconds=0.05) as srv, srv.client(timeout=10) as c:
        for how in ("release", "delete"):
            sid, gen = await _held(c, f"ends-{how}")
            ended: list[BaseException] = []
            started = asyncio.Event()

            async def watch(sid: str = sid, gen: int = gen) -> None:
                try:
                    async for _ in c.watch_inbox(sid, gen):
                        started.set()
                except errors.FencepostError as exc:
                    ended.append(exc)

            await c.deliver(b"e", session_id=sid)
            task = asyncio.create_task(watch())
            await asyncio.wait_for(started.wait(), 10)
            if how == "release":
                await c.release_lease(sid, gen, force=True)
            else:
                await c.delete_session(sid, force=True)
            await asyncio.wait_for(task, 10)
            assert len(ended) == 1
            expected = errors.LeaseFenced if how == "release" else (errors.LeaseFenced, errors.SessionNotFound)
            assert isinstance(ended[0], expected), (how, ended)


async def test_a_commit_moves_its_session_to_the_front_of_the_listing(client: fencepost.AsyncClient) -> None:
    made = []
    for i in range(3):
        sid, gen = await _held(client, f"front{i}")
        made.append((sid, gen))
    fresh = {s.session_id: s async for s in client.list_sessions("agent")}
    for sid, _ in made:
        assert fresh[sid].last_activity_time == (await client.get_session(sid)).last_activity_time
    assert list(fresh) == [sid for sid, _ in made][::-1]
    oldest, gen = made[0]
    await client.commit(oldest, gen, 0, [b"abc"])
    listed = [s async for s in client.list_sessions("agent")]
    assert [s.session_id for s in listed] == [oldest, made[2][0], made[1][0]]
    assert (listed[0].seq, listed[0].total_bytes) == (1, 3)
    info = await client.get_session(oldest)
    assert listed[0].last_activity_time == info.last_activity_time > info.create_time


async def test_racing_retries_apply_once(client: fencepost.AsyncClient) -> None:
    """A commit and its retries in flight at once land once; so do racing
    redeliveries of one dedupe key."""
    sid, gen = await _held(client, "racing-retries")
    deliveries = await asyncio.gather(*(
        client.deliver(b"e", session_id=sid, dedupe_key="same") for _ in range(6)))
    assert len({d.inbox_id for d in deliveries}) == 1
    assert sorted(d.duplicate for d in deliveries) == [False] + [True] * 5
    eid = deliveries[0].inbox_id
    commits = await asyncio.gather(*(
        client.commit(sid, gen, 0, [b"once"], consume=[eid], commit_id="same") for _ in range(6)))
    assert {c.seq for c in commits} == {1}
    assert sorted(c.replayed for c in commits) == [False] + [True] * 5
    assert await _log(client, sid) == [(1, b"once")]
    assert [e async for e in client.list_inbox(sid)] == []


async def test_paged_listing_over_superseded_entries_lists_each_session_once(client: fencepost.AsyncClient) -> None:
    held = [await _held(client, f"busy{i}") for i in range(12)]
    for rnd in range(3):  # every commit supersedes the session's previous index entry
        for i, (sid, gen) in enumerate(held):
            if (i + rnd) % 2 == 0 or rnd == 2:
                head = (await client.get_session(sid)).seq
                await client.commit(sid, gen, head, [b"x" * (i + 1)])
    expected = [sid for sid, _ in held][::-1]  # the last round touched each in order
    for size in (1, 5, 12, 0):
        got = [s async for s in client.list_sessions("agent", page_size=size)]
        assert [s.session_id for s in got] == expected, size
    capped = [s.session_id async for s in client.list_sessions("agent", page_size=5, max_sessions=7)]
    assert capped == expected[:7]


async def test_a_fork_of_a_busy_parent_starts_with_no_lease_and_an_empty_inbox(client: fencepost.AsyncClient) -> None:
    parent, gen = await _held(client, "busy-parent")
    await client.deliver(b"e", session_id=parent, dedupe_key="d")
    await client.commit(parent, gen, 0, [b"1"])
    child = await client.fork(parent, 1, "busy-child")
    assert (child.pending, child.lease.generation, child.lease.holder_id, child.lease.live) == (0, 0, "", False)
    assert [e async for e in client.list_inbox(child.session_id)] == []
    # the parent's dedupe keys are not the child's: the same key parks anew there
    again = await client.deliver(b"e", session_id=child.session_id, dedupe_key="d")
    assert not again.duplicate
    assert (await client.get_session(parent)).pending == 1
    # the child's first grant is generation 1, whatever the parent's
    assert (await client.acquire_lease(child.session_id, "C", ttl=30)).generation == 1


async def test_holder_ids_and_durations_are_validated_before_anything_is_written(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "validate")).session_id
    long_holder = "h" * 1025
    attempts = [
        client.acquire_lease(sid, long_holder, ttl=30),
        client.deliver(b"e", session_id=sid, try_lease=long_holder),
        client.claim_orphan(long_holder, ttl=30),
        client.claim_orphan("W", ttl=-1),
        client.claim_orphan("", ttl=30),
        client.renew_lease(sid, 1, ttl=30, holder_id=long_holder),
        client.renew_lease(sid, 1, ttl=-1),
    ]
    for attempt in attempts:
        with pytest.raises(errors.FencepostError) as refused:
            await attempt
        assert (refused.value.code, refused.value.reason) == ("INVALID_ARGUMENT", "FIELD_INVALID"), refused.value
    info = await client.get_session(sid)
    assert (info.pending, info.lease.generation) == (0, 0)
    assert (await client.acquire_lease(sid, "h" * 1024, ttl=30)).holder_id == "h" * 1024


async def test_list_sessions_defaults_to_1000_sessions_in_pages_of_100() -> None:
    """The default caps are the ledger's, not a backend's: checked on memory
    (a thousand and three sessions)."""
    from fencepost_server.storage.memory import MemoryStorage

    async with running(MemoryStorage()) as srv, srv.client(timeout=30) as c:
        for start in range(0, 1003, 50):
            await asyncio.gather(*(c.open_session("agent", f"k{j}") for j in range(start, min(start + 50, 1003))))
        sizes, token = [], ""
        while True:
            page, token = await c.list_sessions_page("agent", page_token=token)
            sizes.append(len(page))
            if not token:
                break
        assert sizes == [100] * 10
        page, token = await c.list_sessions_page("agent", page_size=1000)
        assert (len(page), token) == (1000, "")  # max_sessions binds: the listing is over
        assert len([s async for s in c.list_sessions("agent", max_sessions=2000, page_size=1000)]) == 1003


async def test_racing_acquires_grant_one_and_the_rest_are_told_who_holds_it(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "acquire-race")).session_id

    async def one(i: int) -> fencepost.Lease | errors.FencepostError:
        try:
            return await client.acquire_lease(sid, f"H{i}", ttl=30)
        except errors.FencepostError as exc:
            return exc

    out = await asyncio.gather(*(one(i) for i in range(8)))
    granted = [o for o in out if not isinstance(o, errors.FencepostError)]
    assert len(granted) == 1 and granted[0].generation == 1
    refused = [o for o in out if isinstance(o, errors.FencepostError)]
    assert all(isinstance(r, errors.LeaseHeld) and r.metadata["holder"] == granted[0].holder_id for r in refused)
    assert (await client.get_session(sid)).lease.generation == 1


async def test_every_lease_ttl_takes_zero_as_the_default_and_refuses_past_an_hour(
    client: fencepost.AsyncClient,
) -> None:
    """AcquireLease, RenewLease, Deliver's try_lease and ClaimOrphan read a
    ttl alike: unset or zero is 30 s, 3600 s is served, a microsecond past
    it or a negative one is FIELD_INVALID naming `ttl`, and nothing changes."""
    sid = (await client.open_session("agent", "ttl-bounds")).session_id
    zero = await client.acquire_lease(sid, "A", ttl=0)
    assert zero.expires_at == pytest.approx(time.time() + 30, abs=5)
    gen = zero.generation
    hour = await client.renew_lease(sid, gen, ttl=3600)
    assert hour.expires_at == pytest.approx(time.time() + 3600, abs=5)
    other = (await client.open_session("agent", "ttl-deliver")).session_id
    refusals = {
        "acquire": lambda ttl: client.acquire_lease(sid, "A", ttl=ttl, generation=gen),
        "renew": lambda ttl: client.renew_lease(sid, gen, ttl=ttl),
        "deliver": lambda ttl: client.deliver(b"e", session_id=other, try_lease="W", ttl=ttl),
        "claim": lambda ttl: client.claim_orphan("W", ttl=ttl),
    }
    for name, call in refusals.items():
        for ttl in (3600.000001, -1.0):
            with pytest.raises(errors.FencepostError) as refused:
                await call(ttl)
            assert (refused.value.code, refused.value.reason) == ("INVALID_ARGUMENT", "FIELD_INVALID"), name
            assert list(refused.value.field_violations) == ["ttl"], name
    assert (await client.get_session(sid)).lease.expires_at == pytest.approx(hour.expires_at, abs=0.001)
    assert (await client.get_session(other)).pending == 0
