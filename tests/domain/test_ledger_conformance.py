"""Ledger rules from spec/ledger.md checked at their edges, on every backend:
what a second replica (no caches) sees, empty and boundary values."""

from __future__ import annotations

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import Storage
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
