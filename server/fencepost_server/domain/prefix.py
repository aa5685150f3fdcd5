"""Deleting everything under a prefix, in batches (erasure and retention)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..storage import MAX_TXN_OPS, Delete, Expect, PersistenceUncertain, Storage

_LIST = 1000  # keys listed per round; deleted in transactions of MAX_TXN_OPS, a few at once
_PARALLEL = 4


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
        removed += await _delete_all(storage, [Delete(k) for k in keys], conditional=False)
    return removed


async def erase_prefix(
    storage: Storage, prefix: str, max_keys: int, listed_in_time: Callable[[], bool]
) -> tuple[int, bool]:
    """An erasure's `delete_prefix`: (keys deleted, whether the prefix was
    found empty). `listed_in_time` (the erasure's claim) is asked after each
    list, before its deletes (False stops there), and each key is deleted
    only at the version listed: a round checked in time may still go out
    late (a pause after the check, a backend resending a request after
    timeouts), when another replica may have finished and a writer put the
    same key again (KV and journal names are not random). A batch whose
    condition fails deletes nothing and is listed again by the next round,
    as is one whose outcome is unknown (a resent conditional delete cannot
    tell its own earlier success from a rewrite; counted as not deleted). A
    round that deletes nothing at all (keys rewritten as fast as listed)
    ends the call rather than spinning: the next step lists again."""
    removed = 0
    while removed < max_keys:
        listed = await storage.list_versions(prefix, None, _LIST)
        if not listed:
            return removed, True
        if not listed_in_time():
            return removed, False
        deleted = await _delete_all(storage, [Delete(k, Expect(version=v)) for k, v in listed], conditional=True)
        if not deleted:
            return removed, False
        removed += deleted
    return removed, False


async def _delete_all(storage: Storage, deletes: list[Delete], *, conditional: bool) -> int:
    batches = [deletes[i:i + MAX_TXN_OPS] for i in range(0, len(deletes), MAX_TXN_OPS)]
    removed = 0
    for i in range(0, len(batches), _PARALLEL):
        group = batches[i:i + _PARALLEL]
        removed += sum(await asyncio.gather(*(_send(storage, batch, conditional) for batch in group)))
    return removed


async def _send(storage: Storage, batch: list[Delete], conditional: bool) -> int:
    try:
        res = await storage.transact((), batch)
    except PersistenceUncertain:
        if not conditional:
            raise
        return 0
    return len(batch) if res.applied else 0
