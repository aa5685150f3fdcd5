"""A replica's memory fold meeting an agent erasure mid-write, on every
backend: once the erasure is done, no replica serves what it erased."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fencepost_server.domain.erasure import Eraser
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.memory.store import MemoryStore
from fencepost_server.storage import Storage
from fencepost_server.storage.counting import CountingStorage
from tests.raw_store import raw_keys_naming

T = "tenant"


class _BeforeTheNextAppend(CountingStorage):
    """Runs `before` once, just before the next memory lane write is sent."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.before: Callable[[], Awaitable[None]] | None = None

    async def _first(self, key: str) -> None:
        if self.before is not None and "/memory/lane/" in key:
            before, self.before = self.before, None
            await before()

    async def put_if_absent(self, key, value):  # type: ignore[no-untyped-def,override]
        await self._first(key)
        return await super().put_if_absent(key, value)

    async def transact(self, checks, writes, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        if writes:
            await self._first(writes[0].key)
        return await super().transact(checks, writes, *args, **kwargs)


async def test_a_fold_written_through_while_its_lane_is_erased_serves_none_of_it(storage: Storage) -> None:
    """The replica decided an append on its fold (the erased entries in it),
    the erasure ran to done, then the append landed in the emptied lane: the
    fold's head record is the new one, but the records before it are gone,
    and so must be everything the fold held of them."""
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    wrapped = _BeforeTheNextAppend(storage)
    store = MemoryStore(wrapped)
    await store.append(T, "doomed", "a secret to forget")
    await store.append(T, "doomed", "another one")

    async def erase() -> None:
        await eraser.start(T, "doomed")
        assert await eraser.run_pending() == 1

    wrapped.before = erase
    await store.append(T, "doomed", "written as the erasure finished")
    assert wrapped.before is None, "the erasure ran"

    fresh = [v.entry.content for v in (await MemoryStore(storage).list(T, "doomed")).entries]
    cached = [v.entry.content for v in (await store.list(T, "doomed")).entries]
    assert fresh == ["written as the erasure finished"]
    assert cached == fresh


class _BeforeTheNextUsageBump(CountingStorage):
    """Runs `before` once, just before the next recall statistics write."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.before: Callable[[], Awaitable[None]] | None = None

    async def transact(self, checks, writes, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        if self.before is not None and writes and "/memory/usage/" in writes[0].key:
            before, self.before = self.before, None
            await before()
        return await super().transact(checks, writes, *args, **kwargs)


async def test_a_search_answered_while_its_agent_is_erased_leaves_no_statistics(storage: Storage) -> None:
    """A search counts a recall of each entry it returns, after it folded the
    lane. The erasure finishing in between must not find statistics of the
    erased entries written behind it: they would outlive it, and the agent's
    next entries, minted `mem-1`, `mem-2`, ... again, would inherit them."""
    eraser = Eraser(storage, Ledger(storage))
    wrapped = _BeforeTheNextUsageBump(storage)
    store = MemoryStore(wrapped)
    await store.append(T, "doomed", "the deploy uses postgres")
    assert (await store.search(T, "doomed", "postgres")).entries[0].usage is not None  # counted

    async def erase() -> None:
        await eraser.start(T, "doomed")
        assert await eraser.run_pending() == 1

    wrapped.before = erase
    await store.search(T, "doomed", "postgres")
    assert wrapped.before is None, "the erasure ran"
    assert raw_keys_naming(storage, "/agentkit/v1/doomed/") == []
