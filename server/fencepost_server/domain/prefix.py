"""Deleting everything under a prefix, in batches (erasure and retention)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..storage import MAX_TXN_OPS, Delete, Expect, PersistenceUncertain, Storage

_LIST = 1000  # keys listed per round; deleted in transactions of MAX_TXN_OPS, a few at once
_PARALLEL = 4

T = TypeVar("T")


async def delete_prefix(storage: Storage, prefix: str, max_keys: int | None = None) -> int:
    """Delete every key under `prefix` (or stop once `max_keys` went: a
    bounded step); returns how many were listed and deleted. Idempotent, and
    safe to run on several replicas at once (each round lists from the start,
    so a key written meanwhile is found too)."""
    removed = 0
    while max_keys is None or removed < max_keys:
        keys = await storage.list_keys(prefix, None, _LIST)
        if not keys:
            return removed
        removed += await _in_batches(keys, lambda batch: _delete_keys(storage, batch))
    return removed


async def erase_prefix(
    storage: Storage, prefix: str, after: str | None, max_keys: int, listed_in_time: Callable[[], bool]
) -> tuple[int, str | None, bool]:
    """An erasure's pass over `prefix`, from the key `after` on: (keys
    deleted, the key to go on after, whether the pass reached the end).
    `listed_in_time` (the erasure's claim) is asked after each list, before
    its deletes (False stops there), and each key is deleted only at the
    version listed: a round checked in time may still go out late (a pause
    after the check, a backend resending a request after timeouts), when
    another replica may have finished and a writer put the same key again
    (KV and journal names are not random).

    A key whose delete fails was rewritten or deleted after it was listed,
    that is after the erasure began: what it held then is gone, and what it
    holds now was written later, like a key created behind the pass. So the
    pass moves on past it, and a writer that keeps rewriting a key cannot
    hold the erasure back (the caller passes over the prefix again from the
    start a few times, so in a quiet store it ends found empty)."""
    removed = seen = 0
    while seen < max_keys:
        listed = await storage.list_versions(prefix, after, _LIST)
        if not listed:
            return removed, after, True
        if not listed_in_time():
            return removed, after, False
        removed += await _in_batches(listed, lambda batch: _delete_listed(storage, batch))
        seen += len(listed)
        after = listed[-1][0]
    return removed, after, False


async def _in_batches(items: Sequence[T], send: Callable[[Sequence[T]], Awaitable[int]]) -> int:
    """`send` the items in transactions of MAX_TXN_OPS, a few at once; the sum of what they return."""
    batches = [items[i:i + MAX_TXN_OPS] for i in range(0, len(items), MAX_TXN_OPS)]
    removed = 0
    for i in range(0, len(batches), _PARALLEL):
        removed += sum(await asyncio.gather(*(send(batch) for batch in batches[i:i + _PARALLEL])))
    return removed


async def _delete_listed(storage: Storage, batch: Sequence[tuple[str, str]]) -> int:
    """Delete each listed key at its listed version: in one transaction, or,
    when that fails (one of its keys changed), key by key. A key whose outcome
    stays unknown raises: the pass is taken up again from where it was last
    recorded."""
    try:
        if (await storage.transact((), [Delete(k, Expect(version=v)) for k, v in batch])).applied:
            return len(batch)
    except PersistenceUncertain:
        pass  # each key's own delete below tells which are still there at their listed version
    removed = 0
    for key, version in batch:
        if (await storage.transact((), [Delete(key, Expect(version=version))])).applied:
            removed += 1
    return removed


async def _delete_keys(storage: Storage, keys: Sequence[str]) -> int:
    res = await storage.transact((), [Delete(k) for k in keys])
    return len(keys) if res.applied else 0
