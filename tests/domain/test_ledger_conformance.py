"""Ledger rules from spec/ledger.md checked at their edges, on every backend:
what a second replica (no caches) sees, empty and boundary values."""

from __future__ import annotations

import asyncio

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.ledger import Ledger, LedgerConfig
from fencepost_server.domain.ledger.layout import BLOB_PREFIX, ERASE_PREFIX
from fencepost_server.storage import BackendUnavailable, Delete, Storage
from fencepost_server.storage.counting import ObservedStorage
from tests.domain.test_ledger import T, FakeClock, _session, reason


async def test_renew_without_holder_on_another_replica_keeps_the_holder(storage: Storage) -> None:
    """RenewLease's holder_id is optional: a renew by generation alone, served
    by a replica that never saw the lease, must not blank the holder (the
    holder's own re-acquire by generation would then be refused as LEASE_HELD
    by "", and LEASE_HELD would name nobody to other callers)."""
    clock = FakeClock()
    first, second = Ledger(storage, clock=clock), Ledger(storage, clock=clock)
    sid = await _session(first)
    lease = await first.acquire(T, sid, "A", ttl=10)
    renewed = await second.renew(T, sid, lease.generation, 20)
    assert (renewed.holder, renewed.generation) == ("A", lease.generation)
    third = Ledger(storage, clock=clock)  # reads the stored lease
    assert (await third.get(T, sid)).lease.holder == "A"
    again = await third.acquire(T, sid, "A", ttl=10, generation=lease.generation)  # a renew
    assert again.generation == lease.generation
    with pytest.raises(DomainError) as held:
        await third.acquire(T, sid, "B", ttl=10)
    assert reason(held) == reasons.LEASE_HELD and held.value.metadata["holder"] == "A"


async def test_claim_orphan_needs_a_holder(storage: Storage) -> None:
    """ClaimOrphan grants a lease like AcquireLease does, so it needs a holder
    id like AcquireLease: a lease granted to "" names nobody (LEASE_HELD by "")
    and the orphan is gone from the offer. FIELD_INVALID, nothing granted."""
    ledger = Ledger(storage)
    sid = await _session(ledger)
    await ledger.deliver(T, session_id=sid, payload=b"e")  # never leased: an orphan at once
    await ledger.janitor.scan()
    with pytest.raises(DomainError) as refused:
        await ledger.janitor.claim(T, "", 10, 0)
    assert reason(refused) == reasons.FIELD_INVALID and refused.value.field == "holder_id"
    claimed = await ledger.janitor.claim(T, "W", 10, 0)  # still on offer
    assert claimed is not None and claimed.lease.holder == "W"


async def test_release_retried_after_an_event_parked_still_succeeds(storage: Storage) -> None:
    """ReleaseLease is idempotent: a retry of a release that applied (its
    response lost) succeeds even when an event was parked since. The event is
    not the caller's to drain any more (its commit would be LEASE_FENCED): the
    session is released, so the janitor hands it on."""
    ledger = Ledger(storage)
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=10)).generation
    assert await ledger.release(T, sid, g) == 0
    await ledger.deliver(T, session_id=sid, payload=b"after the release")
    assert await ledger.release(T, sid, g) == 0  # the retry
    lease = (await ledger.get(T, sid)).lease
    assert (lease.generation, lease.released) == (g, True)


async def test_release_by_a_replaced_holder_is_fenced_not_told_to_drain(storage: Storage) -> None:
    """A holder replaced after its TTL that releases while events wait is
    LEASE_FENCED (final: stop), not INBOX_NOT_EMPTY (which tells it to drain
    the inbox with commits it can no longer make)."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sid = await _session(ledger)
    a = await ledger.acquire(T, sid, "A", ttl=10)
    clock.now += 11
    b = await ledger.acquire(T, sid, "B", ttl=10)
    await ledger.deliver(T, session_id=sid, payload=b"e")
    with pytest.raises(DomainError) as late:
        await ledger.release(T, sid, a.generation)
    assert reason(late) == reasons.LEASE_FENCED
    assert late.value.metadata["current_generation"] == str(b.generation)
    with pytest.raises(DomainError) as pending:  # the live holder is still told to drain
        await ledger.release(T, sid, b.generation)
    assert reason(pending) == reasons.INBOX_NOT_EMPTY


async def test_empty_records_commit_and_read_back_on_every_backend(storage: Storage) -> None:
    ledger = Ledger(storage)
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=10)).generation
    out = await ledger.commit(T, sid, g, 0, [b"", b"x", b""], commit_id="c")
    assert out.seq == 3
    assert [r for p in [p async for p in ledger.read_log(T, sid)] for r in p] == [(1, b""), (2, b"x"), (3, b"")]
    replay = await ledger.commit(T, sid, g, 0, [b"", b"x", b""], commit_id="c")
    assert (replay.seq, replay.replayed) == (3, True)


async def test_inbox_lists_events_in_arrival_order_even_when_the_clock_stalls_or_steps_back(
    storage: Storage,
) -> None:
    """ListInbox is "pending events in arrival order": events parked one after
    the other by one server keep that order when its clock reads the same
    value twice (a coarse clock) or steps backwards (NTP)."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sid = await _session(ledger)
    sent = [f"e{i}".encode() for i in range(12)]
    for i, payload in enumerate(sent):
        if i == 6:
            clock.now -= 5  # the clock steps back
        await ledger.deliver(T, session_id=sid, payload=payload)
    events, _ = await ledger.list_inbox(T, sid)
    assert [e.payload for e in events] == sent


async def _outcome(coro) -> str:  # type: ignore[no-untyped-def]
    try:
        await coro
        return "ok"
    except DomainError as exc:
        return exc.reason


async def test_two_replicas_acquiring_at_once_grant_one(storage: Storage) -> None:
    """Two replicas (no shared cache) grant one of two racing acquires; the
    loser sees LEASE_HELD naming the winner, and the generation moved once."""
    clock = FakeClock()
    one, two = Ledger(storage, clock=clock), Ledger(storage, clock=clock)
    sid = await _session(one)
    for round_ in range(3):
        outcomes = await asyncio.gather(_outcome(one.acquire(T, sid, "A", ttl=10)),
                                        _outcome(two.acquire(T, sid, "B", ttl=10)))
        assert sorted(outcomes) == ["LEASE_HELD", "ok"]
        lease = (await Ledger(storage, clock=clock).get(T, sid)).lease
        assert lease.generation == round_ + 1 and lease.holder == ("A" if outcomes[0] == "ok" else "B")
        clock.now += 11  # expired: the next round races again


async def test_renew_racing_a_takeover_after_expiry_lets_one_win(storage: Storage) -> None:
    """The holder's renew (after its lease expired) and another replica's
    acquire race: exactly one applies; the other is LEASE_FENCED / LEASE_HELD."""
    clock = FakeClock()
    one, two = Ledger(storage, clock=clock), Ledger(storage, clock=clock)
    sid = await _session(one)
    g = (await one.acquire(T, sid, "A", ttl=10)).generation
    clock.now += 11
    renew, take = await asyncio.gather(_outcome(one.renew(T, sid, g, 10, "A")),
                                       _outcome(two.acquire(T, sid, "B", ttl=10)))
    assert (renew, take) in (("ok", "LEASE_HELD"), ("LEASE_FENCED", "ok"))
    lease = (await one.get(T, sid)).lease
    assert lease.holder == ("A" if renew == "ok" else "B")
    assert lease.generation == (g if renew == "ok" else g + 1)


async def test_deliver_trying_the_lease_its_holder_already_holds_walks_away(storage: Storage) -> None:
    """A worker keeps one holder id for every session it serves; an event for
    a session it is serving right now, delivered through it with
    try_lease=itself, must not fence its own turn in progress (that turn's
    commit would be LEASE_FENCED and the turn run again by the new grant,
    its side effects twice). The lease is held: the caller walks away and the
    serving loop drains the event (its commit reports it pending)."""
    ledger = Ledger(storage)
    sid = await _session(ledger)
    first = await ledger.deliver(T, session_id=sid, payload=b"first", try_lease="pod-7")
    assert first.lease_granted and first.lease is not None
    g = first.lease.generation
    second = await ledger.deliver(T, session_id=sid, payload=b"second", try_lease="pod-7")
    assert not second.lease_granted
    assert second.lease is not None and (second.lease.holder, second.lease.generation) == ("pod-7", g)
    done = await ledger.commit(T, sid, g, 0, [b"did first"], [first.inbox_id], commit_id="t1")
    assert (done.seq, done.pending) == (1, 1)  # the turn in progress lands and sees the event
    # an explicit AcquireLease by the same holder id still takes the lease over
    # (a restarted process reclaiming its lease), as documented
    assert (await ledger.acquire(T, sid, "pod-7", ttl=10)).generation == g + 1


async def test_an_event_and_a_record_exactly_at_the_limit_are_taken_one_byte_more_is_not(storage: Storage) -> None:
    ledger = Ledger(storage)
    limit = ledger.limits.max_value_bytes
    sid = await _session(ledger)
    at = await ledger.deliver(T, session_id=sid, payload=b"e" * limit)
    with pytest.raises(DomainError) as over:
        await ledger.deliver(T, session_id=sid, payload=b"e" * (limit + 1))
    assert reason(over) == reasons.EVENT_TOO_LARGE
    events, _ = await ledger.list_inbox(T, sid)
    assert [len(e.payload) for e in events] == [limit]
    g = (await ledger.acquire(T, sid, "A", ttl=10)).generation
    done = await ledger.commit(T, sid, g, 0, [b"r" * limit], [at.inbox_id], commit_id="c")
    assert (done.seq, done.pending) == (1, 0)
    with pytest.raises(DomainError) as big:
        await ledger.commit(T, sid, g, 1, [b"r" * (limit + 1)], commit_id="c2")
    assert reason(big) == reasons.RECORD_TOO_LARGE
    assert [len(d) for p in [p async for p in ledger.read_log(T, sid)] for _, d in p] == [limit]


class _StalledDelivery(ObservedStorage):
    """A Deliver that stalls between writing its payload blob and parking its
    inbox entry, and a janitor that pauses between finding the entry absent
    and deleting the blob: the delivery parks (and is acked) in that pause."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, lambda *_: None)
        self.blob_written = asyncio.Event()
        self.janitor_looked = asyncio.Event()
        self.parked = asyncio.Event()

    async def put(self, key, value, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = await self.inner.put(key, value, *args, **kwargs)
        if key.startswith(BLOB_PREFIX) and not self.blob_written.is_set():
            self.blob_written.set()
            await self.janitor_looked.wait()  # the Deliver stalls past the grace
        return result

    async def _pause(self) -> None:
        if self.blob_written.is_set() and not self.janitor_looked.is_set():
            self.janitor_looked.set()
            await self.parked.wait()

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        item = await self.inner.get(key)
        if "/in/" in key:
            await self._pause()  # the janitor pauses after a look at the inbox entry
        return item

    async def transact(self, checks, writes, count=None):  # type: ignore[no-untyped-def]
        if any(w.key.startswith(BLOB_PREFIX) for w in writes if type(w) is Delete):
            await self._pause()  # ... or just before a delete of the blob
        return await self.inner.transact(checks, writes, count)


async def test_janitor_never_sweeps_the_blob_of_an_event_parked_after_its_look(storage: Storage) -> None:
    """The blob sweep deletes a payload blob only if its inbox entry is still
    absent at the delete (one conditional write): a delivery stalled past the
    grace that parks between the janitor's look and its delete keeps its
    payload, instead of an acked event that ListInbox no longer shows (and
    that blocks ReleaseLease forever)."""
    clock = FakeClock()
    stalled = _StalledDelivery(storage)
    config = LedgerConfig(inline_event_bytes=16, orphan_grace=5)
    ledger = Ledger(stalled, config=config, clock=clock)
    sid = await _session(ledger)
    delivery = asyncio.ensure_future(ledger.deliver(T, session_id=sid, payload=b"x" * 1000))
    await stalled.blob_written.wait()
    clock.now += 10  # past the grace: the blob looks orphaned
    sweep = asyncio.ensure_future(ledger.janitor.scan())
    acked = await asyncio.wait_for(delivery, 60)  # parked while the janitor paused (the bound only ends a hang)
    stalled.parked.set()
    await sweep
    events, _ = await ledger.list_inbox(T, sid)
    assert [(e.inbox_id, e.payload) for e in events] == [(acked.inbox_id, b"x" * 1000)]
    assert await storage.get(ledger.keys(T, sid).blob_key(acked.inbox_id)) is not None


class _StalledErasures(ObservedStorage):
    """The janitor's look at unfinished erasures hangs until `go` is set, or
    fails when `broken`: a slow or failing sweep of another session."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, lambda *_: None)
        self.go = asyncio.Event()
        self.broken = False

    async def list(self, prefix, start_after=None, limit=100, max_bytes=None):  # type: ignore[no-untyped-def]
        if prefix.startswith(ERASE_PREFIX):
            if self.broken:
                raise BackendUnavailable("erase prefix unreadable")
            await self.go.wait()
        return await self.inner.list(prefix, start_after, limit, max_bytes)


async def test_orphans_are_offered_while_the_janitor_still_sweeps_and_when_a_sweep_fails(storage: Storage) -> None:
    """An orphan is offered to ClaimOrphan as soon as the janitor has found
    it: neither a slow sweep of leftovers (blobs, unfinished erasures of other
    sessions) in the same pass nor a failing one holds it back, so a session
    whose holder died is claimed within the janitor interval + grace."""
    stalled = _StalledErasures(storage)
    ledger = Ledger(stalled)
    sid = await _session(ledger)
    await ledger.deliver(T, session_id=sid, payload=b"e")  # never leased: an orphan at once
    scan = asyncio.ensure_future(ledger.janitor.scan())
    try:
        claimed = await ledger.janitor.claim(T, "W", 10, 2)
    finally:
        stalled.go.set()
        await scan
    assert claimed is not None and claimed.session_id == sid and claimed.lease.holder == "W"
    other = await _session(ledger, "other")
    await ledger.deliver(T, session_id=other, payload=b"e")
    stalled.broken = True
    with pytest.raises(BackendUnavailable):
        await ledger.janitor.scan()
    claimed = await ledger.janitor.claim(T, "W", 10, 0)
    assert claimed is not None and claimed.session_id == other


class _StalledGrant(ObservedStorage):
    """A transaction writing `lease_key` waits for `go` (once), `reached` set
    when it starts waiting."""

    def __init__(self, inner: Storage, lease_key: str) -> None:
        super().__init__(inner, lambda *_: None)
        self.lease_key = lease_key
        self.reached, self.go = asyncio.Event(), asyncio.Event()

    async def transact(self, checks, writes, count=None):  # type: ignore[no-untyped-def]
        if not self.reached.is_set() and any(w.key == self.lease_key for w in writes):
            self.reached.set()
            await self.go.wait()
        return await self.inner.transact(checks, writes, count)


async def test_an_orphan_offered_while_a_claim_tries_a_stale_one_is_not_missed(storage: Storage) -> None:
    """A claim whose grant of one offered orphan fails (taken meanwhile) still
    sees an orphan the janitor offered while that grant was under way, rather
    than sleeping through the janitor's wake-up until its wait runs out."""
    plain = Ledger(storage)
    stale, fresh = await _session(plain, "stale"), await _session(plain, "fresh")
    stalled = _StalledGrant(storage, plain.keys(T, stale).lease)
    ledger = Ledger(stalled)
    await ledger.deliver(T, session_id=stale, payload=b"e")  # never leased: an orphan at once
    await ledger.janitor.scan()  # offers `stale`
    claim = asyncio.ensure_future(ledger.janitor.claim(T, "W", 10, 30))
    await stalled.reached.wait()  # the claim is granting `stale` ...
    await Ledger(storage).acquire(T, stale, "other", ttl=60)  # ... which another worker takes first
    await ledger.deliver(T, session_id=fresh, payload=b"e")
    await ledger.janitor.scan()  # offers `fresh`, waking claims
    stalled.go.set()
    done, _ = await asyncio.wait([claim], timeout=2)  # not at the end of its 30 s wait
    if not done:
        claim.cancel()
    assert done, "the claim slept through the offer"
    claimed = claim.result()
    assert claimed is not None and claimed.session_id == fresh


async def test_acquire_by_generation_decides_on_the_stored_lease_not_a_remembered_one(storage: Storage) -> None:
    """AcquireLease decides on the lease as stored, whatever the replica
    remembers: a holder that released through another replica and acquires
    again passing its generation is granted a new one (the lease is free), as
    a replica that never saw the lease grants it, not fenced because this
    replica still remembers the lease as held."""
    clock = FakeClock()
    one, two = Ledger(storage, clock=clock), Ledger(storage, clock=clock)
    sid = await _session(one)
    g = (await one.acquire(T, sid, "A", ttl=10)).generation  # `one` remembers A holding g
    assert await two.release(T, sid, g) == 0
    again = await one.acquire(T, sid, "A", ttl=10, generation=g)
    assert (again.holder, again.generation) == ("A", g + 1)


class _MetaUnreadable(ObservedStorage):
    """Reads of `meta_key` fail while `failing` (the backend became unavailable)."""

    def __init__(self, inner: Storage, meta_key: str) -> None:
        super().__init__(inner, lambda *_: None)
        self.meta_key, self.failing = meta_key, False

    async def get(self, key):  # type: ignore[no-untyped-def]
        if self.failing and key == self.meta_key:
            raise BackendUnavailable("injected: the read after the grant fails")
        return await self.inner.get(key)


async def test_a_claim_answered_with_an_error_leaves_its_holder_no_lease(storage: Storage) -> None:
    """ClaimOrphan grants the lease, then reads the session back for its
    answer. When that read fails the caller gets an error and never learns
    the session id: the lease it was granted is given back (the events stay
    pending), so the session is offered again at the next scan instead of
    sitting held by a worker that does not know it for a whole ttl."""
    plain = Ledger(storage)
    sid = await _session(plain, "orphan")
    flaky = _MetaUnreadable(storage, plain.keys(T, sid).meta)
    ledger = Ledger(flaky)
    await ledger.deliver(T, session_id=sid, payload=b"e")  # never leased: an orphan at once
    await ledger.janitor.scan()
    flaky.failing = True
    with pytest.raises(BackendUnavailable):
        await ledger.janitor.claim(T, "W", 600, 0)
    flaky.failing = False
    lease = (await Ledger(storage).get(T, sid)).lease
    assert lease.released, lease  # not held by "W" for 600 s
    await ledger.janitor.scan()
    claimed = await ledger.janitor.claim(T, "W2", 10, 0)  # offered again, event still pending
    assert claimed is not None and claimed.session_id == sid and claimed.pending == 1
