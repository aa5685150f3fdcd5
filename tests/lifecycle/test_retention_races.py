"""Retention racing the session's holder, on every backend: whatever the
holder does between retention's idle checks and its delete keeps the session."""

from __future__ import annotations

import pytest

from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.journal import Journal
from fencepost_server.domain.kv import KvStore
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.domain.retention import Retention, RetentionConfig
from fencepost_server.storage import Storage
from tests.domain.test_ledger import FakeClock

T = "tenant"
HOUR = 3600.0


async def test_a_lease_renewed_during_the_idle_check_keeps_the_session(storage: Storage) -> None:
    """A holder whose lease expired while it was away renews it (RenewLease
    takes an expired lease nobody took since, with the same generation: the
    generation item does not move) between retention's lease check and its
    delete: the session is held again, so it stays."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    journal = Journal(storage, Limits())
    sid = (await ledger.open(T, "a", "held"))[0].session_id
    lease = await ledger.acquire(T, sid, "h", ttl=5)
    clock.now += 3 * HOUR  # the lease expired long ago; the holder never released it
    real_settled = ledger.settled_activity
    renewed: list[float] = []

    async def renewed_meanwhile(sk):  # type: ignore[no-untyped-def]
        idle = await real_settled(sk)  # what retention decides on: idle, the lease expired
        if not renewed:
            renewed.append((await ledger.renew(T, sid, lease.generation, ttl=600, holder="h")).expires)
        return idle

    ledger.settled_activity = renewed_meanwhile  # type: ignore[method-assign]
    retention = Retention(storage, ledger, journal, RetentionConfig(idle_session_seconds=2 * HOUR), clock=clock)
    counts = await retention.sweep_pass()
    assert renewed and counts.sessions_erased == 0 and counts.sessions_waiting == 1
    view = await ledger.get(T, sid)
    assert view.session_id == sid
    # the holder's lease is live and its writes land
    await ledger.commit(T, sid, lease.generation, 0, [b"work"])
    assert (await ledger.get(T, sid)).seq == 1


async def test_a_kv_key_of_the_highest_code_point_does_not_stall_the_walk(storage: Storage) -> None:
    """A KV key is the caller's own text: one starting with U+10FFFF sorts
    after the walk's "past this subtree" bound, and the walk must still step
    past it to the tenants behind it, whose idle sessions go."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    journal = Journal(storage, Limits())
    kv = KvStore(storage, Limits(), RequestLog(storage))
    await kv.put("a-tenant", "\U0010ffff-and-more", b"v")
    sid = (await ledger.open("b-tenant", "agent", "idle"))[0].session_id
    clock.now += 3 * HOUR
    retention = Retention(storage, ledger, journal, RetentionConfig(idle_session_seconds=2 * HOUR, batch=50),
                          clock=clock)
    erased = 0
    for _ in range(3):
        erased += (await retention.sweep_pass()).sessions_erased
    assert erased == 1
    assert await kv.get("a-tenant", "\U0010ffff-and-more") is not None
    with pytest.raises(DomainError):
        await ledger.get("b-tenant", sid)
