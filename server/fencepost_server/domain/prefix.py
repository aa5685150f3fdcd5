"""Deleting everything under a prefix, in batches (erasure and retention)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..storage import MAX_TXN_OPS, Delete, Storage

_LIST = 1000  # keys listed per round; deleted in transactions of MAX_TXN_OPS, a few at once
_PARALLEL = 4


async def delete_prefix(
    storage: Storage, prefix: str, max_keys: int | None = None, *, listed_in_time: Callable[[], bool] = lambda: True
) -> int:
    """Delete every key under `prefix` (or stop once `max_keys` went: a
    bounded step); returns how many were listed and deleted. Idempotent, and
    safe to run on several replicas at once (each round lists from the start,
    so a key written meanwhile is found too). `listed_in_time` is asked after
    each list, before its deletes; False stops here: the keys a round
    deletes were all listed before it last said True."""
    removed = 0
    while max_keys is None or removed < max_keys:
        keys = await storage.list_keys(prefix, None, _LIST)
        if not keys:
            return removed
        if not listed_in_time():
            return removed
        batches = [keys[i:i + MAX_TXN_OPS] for i in range(0, len(keys), MAX_TXN_OPS)]
        for i in range(0, len(batches), _PARALLEL):
            await asyncio.gather(*(
                storage.transact((), [Delete(k) for k in batch]) for batch in batches[i:i + _PARALLEL]
            ))
        removed += len(keys)
    return removed
