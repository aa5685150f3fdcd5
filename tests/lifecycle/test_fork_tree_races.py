"""DeleteSession of a fork tree racing another delete inside the tree."""

from __future__ import annotations

from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import Storage

T = "tenant"


async def test_a_fork_deleted_meanwhile_does_not_fail_its_parents_delete(storage: Storage) -> None:
    """The parent's delete lists the fork live, then the fork's own delete
    erases it whole before the parent's reaches it: the fork is gone, as
    asked, and the parent goes too (not SESSION_NOT_FOUND for the fork)."""
    ledger = Ledger(storage)
    view, _ = await ledger.open(T, "agent", "p")
    parent = view.session_id
    g = (await ledger.acquire(T, parent, "A", ttl=60)).generation
    await ledger.commit(T, parent, g, 0, [b"p1"])
    child = (await ledger.fork(T, parent, 1, "c")).session_id
    child_meta = ledger.keys(T, child).meta
    inner_get, armed = storage.get, [True]

    async def get(key: str):  # type: ignore[no-untyped-def]
        if key == child_meta and armed[0]:
            armed[0] = False
            await ledger.delete_session(T, child)
        return await inner_get(key)

    storage.get = get  # type: ignore[method-assign]
    out = await ledger.delete_session(T, parent, descendants=True)
    assert not armed[0]
    assert out.session_ids[-1] == parent
    assert await storage.list_keys(ledger.keys(T, parent).base) == []
