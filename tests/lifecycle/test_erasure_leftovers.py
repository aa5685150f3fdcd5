"""What a DeleteSession cut short leaves behind, on every backend: an agent
erasure, or the retried delete, finishes it, so nothing of those sessions is
left when it says done (or returns)."""

from __future__ import annotations

from fencepost_server.domain.erasure import Eraser
from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import Storage
from tests.domain.test_ledger import FakeClock
from tests.raw_store import raw_keys_naming

T = "tenant"


async def test_an_agent_erasure_finishes_a_delete_cut_short_after_the_sessions_keys(storage: Storage) -> None:
    """DeleteSession's sweep removes the session's own keys, then its payload
    blobs and its to-do entry (under `#/ledger/`): cut short in between (a
    crash, a deadline), nothing of the session is left under the agent, but
    its payloads are. The agent's erasure must not say done with them there."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sid = (await ledger.open(T, "doomed", "k"))[0].session_id
    await ledger.deliver(T, session_id=sid, payload=b"P" * (70 * 1024))  # over the inline limit: a blob
    kept = (await ledger.open(T, "kept", "k"))[0].session_id
    await ledger.deliver(T, session_id=kept, payload=b"Q" * (70 * 1024))
    assert [k for k in raw_keys_naming(storage, sid) if k.startswith("#/ledger/blob/")]

    assert await ledger.tombstone(T, sid, force=True) == [sid]
    await ledger.delete_prefix(ledger.keys(T, sid).base)  # the sweep, cut short here

    eraser = Eraser(storage, ledger, clock=clock)
    op = await eraser.start(T, "doomed")
    assert await eraser.run_pending() == 1
    assert (await eraser.get(T, op.name)).done
    assert raw_keys_naming(storage, sid) == []
    assert [k for k in raw_keys_naming(storage, kept) if k.startswith("#/ledger/blob/")]  # another agent's stay


class Cut(Exception):
    pass


async def test_a_retried_delete_with_descendants_finishes_the_forks_it_tombstoned(storage: Storage) -> None:
    """DeleteSession with delete_descendants tombstones the forks, then the
    parent, then sweeps each, forks first. Cut short while a fork's sweep
    runs, the retry finds the parent tombstoned: when it returns, the forks'
    items must be gone too, not left to the janitor."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    parent = (await ledger.open(T, "agent", "parent"))[0].session_id
    lease = await ledger.acquire(T, parent, "h", ttl=30)
    await ledger.commit(T, parent, lease.generation, 0, [b"r1", b"r2"])
    child = (await ledger.fork(T, parent, 1, "child")).session_id
    grandchild = (await ledger.fork(T, child, 1, "grandchild")).session_id
    await ledger.deliver(T, session_id=grandchild, payload=b"P" * (70 * 1024))

    real_sweep = ledger.sweep_session

    async def cut_in_the_first_sweep(tenant: str, sid: str) -> int:
        await ledger.delete_prefix(ledger.keys(tenant, sid).log)  # part of it, then the cut
        raise Cut

    ledger.sweep_session = cut_in_the_first_sweep  # type: ignore[method-assign]
    try:
        await ledger.delete_session(T, parent, force=True, descendants=True)
    except Cut:
        pass
    ledger.sweep_session = real_sweep  # type: ignore[method-assign]

    retried = await ledger.delete_session(T, parent, force=True, descendants=True)
    assert parent in retried.session_ids
    assert raw_keys_naming(storage, parent, child, grandchild) == []
