"""The partition directory: which partitions exist, what a replica remembers
of it, and how an erasure removes the rows naming an erased scope.

Every partition that ever held an item has a directory row (pk "d:", the
partition's name as sort key), written in the same transaction as the first
write that can create an item there, so a list walking the directory never
misses data (listing.py). A replica remembers the partitions whose row it
has written (`KnownPartitions`) and then writes into them without the row:
one request per write instead of a transaction.

An erasure must also remove the rows naming the erased scope (a partition's
name holds the tenant, and the agent). Removing a row is only safe if no
replica still trusts an old memory of it, or that replica's next write puts
an item without a row and every walk misses it. Hence:

- A remembered row is trusted for `ttl` seconds counted from when the
  request that wrote it was *sent* (so from before the row landed), and a
  write re-checks that, attempt by attempt, just before sending: a write
  relying on an entry is sent before the entry expires.
- The erasure removes the rows (`forget`), waits `ttl` plus the longest a
  sent request can take to be applied (connect + read timeout of one
  attempt: `DynamoStorage.partition_settle_seconds`), then looks into each
  removed partition with a strongly consistent Query and puts the row back
  where an item exists (`settle`). A write racing the erasure, from a replica
  that remembered the row or from one that wrote the row just before it was
  removed, has landed by then and is found; every later write comes from a
  replica whose memory has expired, so it writes the row itself.

Rows are removed only once the erasure has swept every key under the scope,
so a partition found occupied at settle time holds data written after the
erasure began (new data, which an erasure does not promise to stop).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from .codec import DIRECTORY_PK, ITEM_PK_PREFIX
from .listing import QueryFn
from .table import PARTITION_KEY, SORT_KEY

#: default seconds a replica trusts a directory row it wrote (URL parameter `partition_cache_ttl`)
DEFAULT_TTL = 30.0
#: requests one forget / settle keeps in flight
_IN_FLIGHT = 16

T = TypeVar("T")


class KnownPartitions:
    """Partitions whose directory row this process wrote, each trusted until
    `ttl` seconds after the request was sent (an LRU of at most `limit`).
    Losing an entry costs one extra directory write, never correctness."""

    def __init__(self, limit: int, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl < 0:
            raise ValueError("partition_cache_ttl must not be negative")
        self.limit, self.ttl, self.now = limit, ttl, clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def valid_until(self, partition: str) -> float:
        """When this process must stop relying on `partition`'s row (0: now)."""
        if not partition:
            return math.inf  # partition "" is every short prefix's home: always queried, never listed
        until = self._until.get(partition, 0.0)
        if until <= self.now():
            self._until.pop(partition, None)
            return 0.0
        self._until.move_to_end(partition)
        return until

    def needs_row(self, partition: str) -> bool:
        return self.valid_until(partition) == 0.0

    def expired(self, until: float) -> bool:
        return until <= self.now()

    def remember(self, partitions: Iterable[str], sent_at: float) -> None:
        """The rows of `partitions` were written by a request sent at `sent_at`."""
        for partition in partitions:
            self._until[partition] = sent_at + self.ttl
            self._until.move_to_end(partition)
        while len(self._until) > self.limit:
            self._until.popitem(last=False)

    def forget(self, partitions: Iterable[str]) -> None:
        for partition in partitions:
            self._until.pop(partition, None)


async def names_under(query: QueryFn, prefix: str, start_after: str | None, limit: int) -> list[str]:
    """Names of the directory's partitions that start with `prefix` and sort
    after `start_after`, in order, at most `limit`."""
    values: dict[str, Any] = {":pk": {"S": DIRECTORY_PK}}
    condition = f"{PARTITION_KEY} = :pk"
    if start_after is not None and start_after >= prefix:
        condition += f" AND {SORT_KEY} > :after"  # one key condition: the prefix is checked below
        values[":after"] = {"S": start_after}
    elif prefix:
        condition += f" AND begins_with({SORT_KEY}, :prefix)"
        values[":prefix"] = {"S": prefix}
    request: dict[str, Any] = {
        "KeyConditionExpression": condition, "ExpressionAttributeValues": values,
        "ConsistentRead": True, "Limit": limit,
    }
    names: list[str] = []
    while len(names) < limit:
        response = await query(request)
        for row in response.get("Items", []):
            name = row[SORT_KEY]["S"]
            if not name.startswith(prefix):
                return names  # sorted: nothing further is under the prefix
            names.append(name)
        last = response.get("LastEvaluatedKey")
        if not last:
            break
        request = {**request, "ExclusiveStartKey": last, "Limit": limit - len(names)}
    return names[:limit]


def row_key(partition: str) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": DIRECTORY_PK}, SORT_KEY: {"S": partition}}


async def each(partitions: Sequence[str], call: Callable[[str], Awaitable[T]]) -> list[T]:
    """`call` for every partition, a bounded number at once (single-item
    requests: the server's IAM policy needs no batch action for this)."""
    gate = asyncio.Semaphore(_IN_FLIGHT)

    async def one(partition: str) -> T:
        async with gate:
            return await call(partition)

    return list(await asyncio.gather(*(one(p) for p in partitions)))


async def occupied(query: QueryFn, partitions: Sequence[str]) -> list[str]:
    """Those of `partitions` that hold at least one item (strongly consistent)."""

    async def holds_items(partition: str) -> bool:
        response = await query({
            "KeyConditionExpression": f"{PARTITION_KEY} = :pk",
            "ExpressionAttributeValues": {":pk": {"S": ITEM_PK_PREFIX + partition}},
            "ProjectionExpression": f"{PARTITION_KEY}, {SORT_KEY}",
            "ConsistentRead": True, "Limit": 1,
        })
        return bool(response.get("Items"))

    found = await each(partitions, holds_items)
    return [p for p, yes in zip(partitions, found, strict=True) if yes]
