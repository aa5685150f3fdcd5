"""Lists as strongly consistent Queries in key order (never a Scan).

A prefix that pins one partition (layout.partition_of_prefix) is one Query
per page. Any other prefix is a *walk*: its home partition plus every
partition the directory lists under the prefix, merged in key order. A
partition's keys all start with its name, so partitions are opened lazily in
name order, only once the merge reaches their name: a page costs one Query
per partition it actually draws from, plus the directory pages read.

Every partition that ever held an item has a directory entry (written in the
same transaction as the first write that can create an item there), so a
walk never misses data; entries of emptied partitions are merely skipped.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .codec import DIRECTORY_PK, ITEM_PK_PREFIX, encode_rest, key_from
from .table import PARTITION_KEY, SORT_KEY, VALUE, VERSION

Row = dict[str, Any]
#: Sends one Query (keyword arguments without TableName) and returns the response.
QueryFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def _rest_bound(partition: str, prefix: str, start_after: str | None) -> tuple[str, str | None] | None:
    """The (rest prefix, exclusive rest lower bound) to read from `partition`
    for keys under `prefix` after `start_after`; None when none can qualify."""
    rest_prefix = prefix[len(partition):] if len(prefix) > len(partition) else ""
    if start_after is None or start_after < prefix:
        return rest_prefix, None
    if start_after.startswith(partition):
        return rest_prefix, start_after[len(partition):]
    if start_after > partition:
        return None  # every key of the partition sorts before start_after
    return rest_prefix, None


async def query_partition(
    query: QueryFn,
    partition: str,
    prefix: str,
    start_after: str | None,
    page: int,
    *,
    keys_only: bool,
    versions: bool = False,
) -> AsyncIterator[Row]:
    """The partition's rows under `prefix` after `start_after`, in key order,
    fetched `page` at a time (lazily: nothing is sent before the first pull)."""
    bound = _rest_bound(partition, prefix, start_after)
    if bound is None:
        return
    rest_prefix, rest_after = bound
    values: dict[str, Any] = {":pk": {"S": ITEM_PK_PREFIX + partition}}
    condition = f"{PARTITION_KEY} = :pk"
    if rest_after is not None:
        # One key condition only: start after the bound, stop at the prefix's end below.
        condition += f" AND {SORT_KEY} > :after"
        values[":after"] = {"S": encode_rest(rest_after)}
    elif rest_prefix:
        condition += f" AND begins_with({SORT_KEY}, :prefix)"
        values[":prefix"] = {"S": rest_prefix}
    request: dict[str, Any] = {
        "KeyConditionExpression": condition,
        "ExpressionAttributeValues": values,
        "ConsistentRead": True,
        "Limit": page,
    }
    if keys_only:  # with `versions`: the version too (what a conditional delete needs)
        request["ProjectionExpression"] = f"{PARTITION_KEY}, {SORT_KEY}" + (f", {VERSION}" if versions else "")
    while True:
        response = await query(request)
        for row in response.get("Items", []):
            if rest_after is not None and not row[SORT_KEY]["S"].startswith(rest_prefix):
                return  # sorted: nothing further is under the prefix
            yield row
        last = response.get("LastEvaluatedKey")
        if not last:
            return
        request = {**request, "ExclusiveStartKey": last}


async def directory(query: QueryFn, prefix: str, page: int, *, skip: str) -> AsyncIterator[str]:
    """Names of the partitions starting with `prefix`, in order, but `skip`
    (the prefix's home partition, which the walk reads anyway)."""
    values: dict[str, Any] = {":pk": {"S": DIRECTORY_PK}}
    condition = f"{PARTITION_KEY} = :pk"
    if prefix:
        condition += f" AND begins_with({SORT_KEY}, :prefix)"
        values[":prefix"] = {"S": prefix}
    request: dict[str, Any] = {
        "KeyConditionExpression": condition,
        "ExpressionAttributeValues": values,
        "ConsistentRead": True,
        "Limit": page,
    }
    while True:
        response = await query(request)
        for row in response.get("Items", []):
            if row[SORT_KEY]["S"] != skip:
                yield row[SORT_KEY]["S"]
        last = response.get("LastEvaluatedKey")
        if not last:
            return
        request = {**request, "ExclusiveStartKey": last}


async def merged(
    home: AsyncIterator[Row],
    partitions: AsyncIterator[str],
    open_partition: Callable[[str], AsyncIterator[Row]],
    key_of: Callable[[Row], str],
) -> AsyncIterator[Row]:
    """The rows, in key order, of `home` and of each partition named by
    `partitions` (in name order). A partition is opened only when the
    smallest pending key is not below its name, since none of its keys can
    sort before the name; a row is fetched only when the previous one has
    been taken."""
    order = itertools.count()
    heap: list[tuple[str, int, Row, AsyncIterator[Row]]] = []

    async def pull(source: AsyncIterator[Row]) -> None:
        row = await anext(source, None)
        if row is not None:
            heapq.heappush(heap, (key_of(row), next(order), row, source))

    await pull(home)
    next_name = await anext(partitions, None)
    while True:
        while next_name is not None and (not heap or next_name <= heap[0][0]):
            await pull(open_partition(next_name))
            next_name = await anext(partitions, None)
        if not heap:
            return
        _, _, row, source = heapq.heappop(heap)
        yield row
        await pull(source)


async def merge_walk(
    home: AsyncIterator[Row],
    partitions: AsyncIterator[str],
    open_partition: Callable[[str], AsyncIterator[Row]],
    key_of: Callable[[Row], str],
    limit: int,
    max_bytes: int | None = None,
) -> list[Row]:
    """The first rows of `merged(...)`, as `take` ends them."""
    if limit <= 0:
        return []
    async with contextlib.aclosing(merged(home, partitions, open_partition, key_of)) as rows:
        return await take(rows, limit, max_bytes)


async def take(rows: AsyncIterator[Row], limit: int, max_bytes: int | None = None) -> list[Row]:
    """The first `limit` rows, ending with the one that takes their keys and
    values past `max_bytes` (Storage.list): nothing more is fetched."""
    out: list[Row] = []
    if limit <= 0:
        return out
    spent = 0
    async for row in rows:
        out.append(row)
        if len(out) >= limit:
            break
        if max_bytes is not None:
            spent += len(key_from(row).encode()) + len(row.get(VALUE, {}).get("B", b""))
            if spent > max_bytes:
                break
    return out
