"""DeleteSession through a real server on every backend, proven on the raw store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import fencepost
from fencepost import errors
from fencepost_server.storage import Storage
from tests.conftest import RunningServer, running
from tests.raw_store import data_only, raw_items, raw_keys_naming

BIG = b"B" * (70 * 1024)  # over the inline limit: stored as a blob


def without(items: dict[str, bytes], *needles: str) -> dict[str, bytes]:
    return {k: v for k, v in items.items() if not any(n in k or n.encode() in v for n in needles)}


async def _busy_session(client: fencepost.AsyncClient, key: str, records: int = 5) -> str:
    """A session with every kind of item: log, commit markers, dedupe markers,
    a pending event with a blob, a reminder (a schedule record), a size cache."""
    sid = (await client.open_session("agent", key, metadata={"m": "1"})).session_id
    lease = await client.acquire_lease(sid, "holder", ttl=30)
    d = await client.deliver(b"small", session_id=sid, dedupe_key=f"{key}-d1")
    seq = (await client.commit(sid, lease.generation, 0, [b"r%d" % i for i in range(records)],
                               consume=[d.inbox_id], commit_id=f"{key}-c1")).seq
    await client.create_reminder(sid, lease.generation, "ping", after_seconds=3600)
    await client.deliver(BIG, session_id=sid, dedupe_key=f"{key}-d2")
    [s async for s in client.list_sessions("agent")]  # fills the size cache
    assert (await client.get_session(sid)).seq > seq
    return sid


async def test_delete_leaves_nothing_and_touches_nothing_else(
    storage: Storage, server: RunningServer, client: fencepost.AsyncClient
) -> None:
    keep = await _busy_session(client, "keep")
    doomed = await _busy_session(client, "doomed")
    before = raw_items(storage)
    assert raw_keys_naming(storage, doomed), "the session's items are visible to the raw reader"

    with pytest.raises(errors.InboxNotEmpty):
        await client.delete_session(doomed)
    deletion = await client.delete_session(doomed, force=True)
    assert deletion.session_ids == [doomed] and deletion.erased_items > 10

    assert raw_keys_naming(storage, doomed) == []
    metrics = server.app.metrics.registry.get_sample_value
    assert metrics("fencepost_lifecycle_total", {"kind": "ledger.sessions_deleted"}) == 1
    assert metrics("fencepost_lifecycle_total", {"kind": "ledger.erased_items"}) == deletion.erased_items
    after = raw_items(storage)
    assert data_only(after) == data_only(without(before, doomed)), "another session's items changed"
    for read in (client.get_session(doomed), client.read_log(doomed).__anext__()):
        with pytest.raises(errors.SessionNotFound):
            await read
    with pytest.raises(errors.SessionNotFound):
        await client.delete_session(doomed)
    assert doomed not in [s.session_id async for s in client.list_sessions("agent")]
    again = await client.open_session("agent", "doomed")
    assert again.session_id != doomed and again.seq == 0
    assert (await client.get_session(keep)).seq == 6


async def test_a_replica_that_cached_the_identity_opens_a_new_session(storage: Storage) -> None:
    async with running(storage) as one, running(storage) as two:
        async with one.client() as a, two.client() as b:
            sid = (await a.open_session("agent", "shared")).session_id
            assert (await b.open_session("agent", "shared")).session_id == sid  # b caches the identity
            await a.delete_session(sid)
            fresh = await b.open_session("agent", "shared")
            assert fresh.session_id != sid
            assert (await b.resolve_session("agent", "shared")).session_id == fresh.session_id
            d = await b.deliver(b"e", agent="agent", session_key="shared")
            assert d.session_id == fresh.session_id


async def test_forks_refuse_then_go_with_their_descendants(
    storage: Storage, client: fencepost.AsyncClient
) -> None:
    parent = (await client.open_session("agent", "p")).session_id
    lease = await client.acquire_lease(parent, "h", ttl=30)
    await client.commit(parent, lease.generation, 0, [b"p1", b"p2", b"p3"])
    child = (await client.fork(parent, 2, "c")).session_id
    grandchild = (await client.fork(child, 2, "g")).session_id
    with pytest.raises(errors.SessionHasForks) as refused:
        await client.delete_session(parent)
    assert refused.value.metadata["forks"] == "1"
    assert [r.data async for r in client.read_log(grandchild)] == [b"p1", b"p2"]
    # a fork deleted first no longer holds its parent back
    other = (await client.fork(parent, 1, "other")).session_id
    assert (await client.delete_session(other)).session_ids == [other]
    deleted = (await client.delete_session(parent, delete_descendants=True)).session_ids
    assert deleted == [grandchild, child, parent]
    assert raw_keys_naming(storage, parent, child, grandchild, other) == []
    for sid in deleted:
        with pytest.raises(errors.SessionNotFound):
            [r async for r in client.read_log(sid)]
    with pytest.raises(errors.SessionNotFound):
        await client.fork(parent, 1, "late")


async def test_paused_holder_never_lands_a_write_after_delete(
    storage: Storage, client: fencepost.AsyncClient, scaled: Callable[[int, int], int]
) -> None:
    """A holder pauses across DeleteSession (200 races; 60 on the emulator in
    `make test`, 200 with FENCEPOST_FULL_SCALE=1): its racing write either
    lands before the tombstone (then it is erased with the rest) or fails;
    every write after the delete returns fails."""
    rounds, doomed = scaled(200, 60), []
    raced = {"landed_first": 0, "refused": 0}
    for i in range(rounds):
        sid = (await client.open_session("agent", f"race-{i}")).session_id
        lease = await client.acquire_lease(sid, "A", ttl=30)
        await client.commit(sid, lease.generation, 0, [b"before"])

        async def paused_commit() -> bool:
            try:
                await client.commit(sid, lease.generation, 1, [b"racing"])
                return True
            except (errors.LeaseFenced, errors.SessionNotFound):
                return False

        landed, _ = await asyncio.gather(paused_commit(), client.delete_session(sid))
        raced["landed_first" if landed else "refused"] += 1
        for late in (
            client.commit(sid, lease.generation, 2 if landed else 1, [b"after"]),
            client.renew_lease(sid, lease.generation, ttl=30),
            client.release_lease(sid, lease.generation),
            client.acquire_lease(sid, "A", ttl=30),
        ):
            with pytest.raises((errors.LeaseFenced, errors.SessionNotFound)):
                await late
        doomed.append(sid)
    assert raw_keys_naming(storage, *doomed) == []
    assert sum(raced.values()) == rounds


async def test_deliver_racing_delete_never_leaves_an_event(
    storage: Storage, client: fencepost.AsyncClient, scaled: Callable[[int, int], int]
) -> None:
    """200 races (60 on the emulator in `make test`, 200 at full scale)."""
    rounds, doomed = scaled(200, 60), []
    outcomes = {"parked_then_refused": 0, "deleted_first": 0}
    for i in range(rounds):
        sid = (await client.open_session("agent", f"deliver-race-{i}")).session_id
        payload = BIG if i % 4 == 0 else b"e%d" % i

        async def deliver() -> bool:
            try:
                await client.deliver(payload, session_id=sid, dedupe_key=f"k{i}")
                return True
            except errors.SessionNotFound:
                return False

        async def delete() -> bool:
            try:
                await client.delete_session(sid)
                return True
            except errors.InboxNotEmpty:
                return False

        acked, deleted = await asyncio.gather(deliver(), delete())
        # an acked event is never erased by a delete that was not forced
        assert not (acked and deleted), "a delivered event was erased by an unforced delete"
        if not deleted:
            outcomes["parked_then_refused"] += 1
            await client.delete_session(sid, force=True)
        else:
            outcomes["deleted_first"] += 1
        doomed.append(sid)
    assert raw_keys_naming(storage, *doomed) == []
    assert sum(outcomes.values()) == rounds
