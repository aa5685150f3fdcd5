"""The tombstone and the sweep, on every backend, without a server (fake clock)."""

from __future__ import annotations

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.ledger import Ledger, LedgerConfig
from fencepost_server.domain.schedule import Schedule
from fencepost_server.storage import Storage
from tests.domain.test_ledger import FakeClock
from tests.raw_store import raw_keys_naming

T = "tenant"
GONE = {reasons.LEASE_FENCED, reasons.SESSION_NOT_FOUND}


async def _fails(call: object, allowed: set[str]) -> str:
    with pytest.raises(DomainError) as exc:
        await call  # type: ignore[misc]
    assert exc.value.reason in allowed, exc.value.reason
    return exc.value.reason


async def test_from_the_tombstone_on_every_read_and_write_misses(storage: Storage) -> None:
    """Cut the delete short after its first write (as a crash would): the
    session is already gone for every caller; the janitor sweeps the rest."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock, config=LedgerConfig(orphan_grace=10))
    sid = (await ledger.open(T, "agent", "k"))[0].session_id
    lease = await ledger.acquire(T, sid, "A", ttl=30)
    await ledger.commit(T, sid, lease.generation, 0, [b"r1", b"r2"], commit_id="c1")
    await ledger.deliver(T, session_id=sid, payload=b"x" * (70 * 1024))

    done = await ledger.tombstone(T, sid, force=True)  # the point of no return only
    assert done == [sid] and raw_keys_naming(storage, sid)  # not swept yet

    not_found = {reasons.SESSION_NOT_FOUND}
    await _fails(ledger.get(T, sid), not_found)
    await _fails(ledger.read_log(T, sid).__anext__(), not_found)
    await _fails(ledger.list_inbox(T, sid), not_found)
    await _fails(ledger.watch_inbox(T, sid, lease.generation).__anext__(), not_found)
    await _fails(ledger.resolve(T, "agent", "k"), not_found)
    await _fails(ledger.commit(T, sid, lease.generation, 2, [b"late"]), GONE)
    await _fails(ledger.renew(T, sid, lease.generation, 30, "A"), GONE)
    await _fails(ledger.release(T, sid, lease.generation), GONE)
    await _fails(ledger.release(T, sid, lease.generation, force=True), GONE)
    await _fails(ledger.acquire(T, sid, "B", ttl=30), not_found)
    await _fails(ledger.deliver(T, session_id=sid, payload=b"late"), not_found)
    await _fails(ledger.deliver(T, session_id=sid, payload=b"y" * (70 * 1024)), not_found)
    await _fails(ledger.fork(T, sid, 1, "child"), not_found)
    fresh = (await ledger.open(T, "agent", "k"))[0]
    assert fresh.session_id != sid

    clock.now += 5
    await ledger.janitor.scan()
    assert raw_keys_naming(storage, sid), "swept within the grace: its delete may still be running"
    clock.now += 10
    await ledger.janitor.scan()
    assert ledger.janitor.stats.erasures_finished == 1
    assert raw_keys_naming(storage, sid) == []
    assert (await ledger.get(T, fresh.session_id)).seq == 0


async def test_a_fork_never_returns_a_page_read_after_the_delete(storage: Storage) -> None:
    ledger = Ledger(storage, config=LedgerConfig(read_page=2))
    parent = (await ledger.open(T, "agent", "p"))[0].session_id
    lease = await ledger.acquire(T, parent, "A", ttl=30)
    await ledger.commit(T, parent, lease.generation, 0, [b"p%d" % i for i in range(1, 7)])
    child = (await ledger.fork(T, parent, 6, "c")).session_id
    pages = ledger.read_log(T, child)
    assert [seq for seq, _ in await pages.__anext__()] == [1, 2]
    await _fails(ledger.delete_session(T, parent), {reasons.SESSION_HAS_FORKS})
    assert [seq for seq, _ in await pages.__anext__()] == [3, 4]
    assert (await ledger.delete_session(T, parent, descendants=True)).session_ids == (child, parent)
    await _fails(pages.__anext__(), {reasons.SESSION_NOT_FOUND})
    assert raw_keys_naming(storage, parent, child) == []


async def test_a_fork_made_while_the_parent_is_deleted_is_seen(storage: Storage) -> None:
    """The fork proof: a fork landing between the delete's fork check and its
    tombstone moves the parent's forks marker, so the tombstone does not apply."""
    ledger = Ledger(storage)
    parent = (await ledger.open(T, "agent", "p"))[0].session_id
    real_live_forks = ledger.live_forks
    raced: list[str] = []

    async def fork_sneaks_in(sk):  # type: ignore[no-untyped-def]
        live = await real_live_forks(sk)
        if not raced:
            raced.append((await ledger.fork(T, parent, 0, "sneaky")).session_id)
        return live

    ledger.live_forks = fork_sneaks_in  # type: ignore[method-assign]
    await _fails(ledger.delete_session(T, parent), {reasons.SESSION_HAS_FORKS})
    assert (await ledger.get(T, raced[0])).parent == parent


@pytest.mark.parametrize("pending_on", ["parent", "grandchild"])
async def test_a_delete_refused_for_pending_events_erases_no_descendant(storage: Storage, pending_on: str) -> None:
    """delete_descendants without force: an event pending anywhere in the tree
    refuses the whole delete before any session of it is tombstoned."""
    ledger = Ledger(storage)
    parent = (await ledger.open(T, "agent", "p"))[0].session_id
    lease = await ledger.acquire(T, parent, "A", ttl=30)
    await ledger.commit(T, parent, lease.generation, 0, [b"p1", b"p2"])
    child = (await ledger.fork(T, parent, 2, "c")).session_id
    grandchild = (await ledger.fork(T, child, 1, "g")).session_id
    sibling = (await ledger.fork(T, parent, 1, "s")).session_id
    target = parent if pending_on == "parent" else grandchild
    await ledger.deliver(T, session_id=target, payload=b"waiting")

    await _fails(ledger.delete_session(T, parent, descendants=True), {reasons.INBOX_NOT_EMPTY})
    for sid in (parent, child, grandchild, sibling):
        assert (await ledger.get(T, sid)).session_id == sid  # refused: nothing was erased
    deleted = await ledger.delete_session(T, parent, force=True, descendants=True)
    assert set(deleted.session_ids) == {parent, child, grandchild, sibling}
    assert raw_keys_naming(storage, parent, child, grandchild, sibling) == []


async def test_a_reminder_listing_never_returns_a_fold_read_after_the_delete(storage: Storage) -> None:
    """ListReminders folds the session's log: a delete landing while it reads
    makes it SESSION_NOT_FOUND, never a listing read past the tombstone."""
    ledger = Ledger(storage, config=LedgerConfig(read_page=2))
    schedule = Schedule(ledger)
    sid = (await ledger.open(T, "agent", "k"))[0].session_id
    lease = await ledger.acquire(T, sid, "A", ttl=30)
    await ledger.commit(T, sid, lease.generation, 0, [b"r1", b"r2", b"r3"])
    await schedule.create(T, sid, lease.generation, "ping", after_seconds=60)
    real_pages = ledger.log_pages

    async def deleted_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        async for page in real_pages(*args, **kwargs):
            yield page
            await ledger.tombstone(T, sid, force=True)

    ledger.log_pages = deleted_meanwhile  # type: ignore[method-assign]
    await _fails(schedule.list(T, sid), {reasons.SESSION_NOT_FOUND})


async def test_an_inbox_listing_never_returns_a_payload_the_delete_swept(storage: Storage) -> None:
    """ListInbox lists the events, then reads the payloads kept as blobs: a
    delete sweeping in between makes it SESSION_NOT_FOUND, never an event
    with an empty payload."""
    ledger = Ledger(storage)
    sid = (await ledger.open(T, "agent", "k"))[0].session_id
    await ledger.deliver(T, session_id=sid, payload=b"y" * (70 * 1024))
    real_event = ledger._event

    async def swept_meanwhile(sk, item):  # type: ignore[no-untyped-def]
        await ledger.delete_session(T, sid, force=True)
        return await real_event(sk, item)

    ledger._event = swept_meanwhile  # type: ignore[method-assign]
    await _fails(ledger.list_inbox(T, sid), {reasons.SESSION_NOT_FOUND})
