"""The operator paths of the DynamoDB backend: export every item in key
order, import items with their version tokens, keep version watermarks.

None of this runs on a request path (backup, restore and migration only).

Export does not Scan. A Scan is unordered, and the lifecycle tools need key
order (to resume after a key, and to compare both sides of a migration range
by range); it walks the partition directory instead and Queries every
partition (strongly consistent), merged in key order: the walk a list over
the empty prefix does, kept open from page to page, so each partition is
read once.

Import is BatchWriteItem: blind puts, 25 per request, several requests in
flight, the directory entries of new partitions written before any item of
theirs. A blind put written twice leaves the same item, so every failure,
ambiguous or not, is simply retried, and so are the unprocessed items
DynamoDB hands back under throttling.

Watermarks live in one item outside the key space (partition "m:", which no
storage key maps to), as a JSON list of tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from ..base import BackendUnavailable, Item, highest_per_family
from . import listing
from .codec import DIRECTORY_PK, item_from, key_from
from .errors import RetryPolicy, with_retries
from .table import PARTITION_KEY, SORT_KEY, VALUE

Attributes = dict[str, Any]

BATCH_WRITE_ITEMS = 25
#: BatchWriteItem requests one import keeps in flight
IN_FLIGHT = 16
WATERMARKS_KEY: Attributes = {PARTITION_KEY: {"S": "m:"}, SORT_KEY: {"S": "version-watermarks"}}


async def export(query: listing.QueryFn, start_after: str | None, page: int) -> AsyncIterator[list[Item]]:
    """Every item after `start_after`, in key order, `page` at a time."""

    def partition_rows(partition: str) -> AsyncIterator[Attributes]:
        return listing.query_partition(query, partition, "", start_after, page, keys_only=False)

    partitions = listing.directory(query, "", page, skip="")
    batch: list[Item] = []
    async for row in listing.merged(partition_rows(""), partitions, partition_rows, key_from):
        batch.append(item_from(row))
        if len(batch) >= page:
            yield batch
            batch = []
    if batch:
        yield batch


def directory_item(partition: str) -> Attributes:
    return {PARTITION_KEY: {"S": DIRECTORY_PK}, SORT_KEY: {"S": partition}}


async def batch_put(
    client: Any, table: str, items: Sequence[Attributes], retry: RetryPolicy, gate: asyncio.Semaphore
) -> None:
    """Put every item (blind), BATCH_WRITE_ITEMS per request, as many requests
    at once as `gate` lets through (shared by every import of one process)."""

    async def send(chunk: list[Attributes]) -> None:
        requests = [{"PutRequest": {"Item": item}} for item in chunk]
        async with gate:
            for attempt in range(max(retry.attempts, 1) * 4):
                if attempt:
                    await asyncio.sleep(retry.delay(attempt))
                response = await with_retries(
                    retry, lambda _: client.batch_write_item(RequestItems={table: requests}),
                    what="BatchWriteItem", write=False,  # blind puts: resending is harmless
                )
                requests = (response.get("UnprocessedItems") or {}).get(table) or []
                if not requests:
                    return
            raise BackendUnavailable(f"BatchWriteItem: {len(requests)} items still unprocessed after retries")

    chunks = [list(items[i:i + BATCH_WRITE_ITEMS]) for i in range(0, len(items), BATCH_WRITE_ITEMS)]
    await asyncio.gather(*(send(chunk) for chunk in chunks))


async def read_watermarks(client: Any, table: str, retry: RetryPolicy) -> list[str]:
    response = await with_retries(
        retry, lambda _: client.get_item(TableName=table, Key=WATERMARKS_KEY, ConsistentRead=True),
        what="GetItem", write=False,
    )
    item = response.get("Item")
    return list(json.loads(bytes(item[VALUE]["B"]))) if item else []


async def write_watermarks(client: Any, table: str, tokens: Iterable[str], retry: RetryPolicy) -> list[str]:
    """Merge `tokens` into the stored watermarks (highest per family); returns them."""
    stored = await read_watermarks(client, table, retry)
    merged = sorted(token for _, token in highest_per_family([*stored, *tokens]).values())
    if merged != sorted(stored):
        body = {**WATERMARKS_KEY, VALUE: {"B": json.dumps(merged).encode()}}
        await with_retries(
            retry, lambda _: client.put_item(TableName=table, Item=body), what="PutItem", write=False,
        )
    return merged
