"""`fencepost migrate` sqlite -> DynamoDB next to raw aioboto3 batch writes.

Both sides write the same items into fresh tables of the same local
DynamoDB-compatible server (moto, started here as the tests start it): the
raw side as BatchWriteItem requests of 25 puts, as many in flight as the
migration keeps (storage/dynamodb/bulk.py IN_FLIGHT), from items already in
memory; the migration reads a SQLite snapshot, writes the same requests
plus the partition directory, and checkpoints every page. moto executes one
request at a time, so absolute figures say little: the ratio migrate / raw
(copy phase, items/s) is the figure (target >= 70%). The verification pass
that follows the copy (a second read of both sides) is reported apart.
Each side runs three times, interleaved; the ratio uses each side's better round.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

import aioboto3
from aiobotocore.config import AioConfig

from fencepost_server.lifecycle import migrate
from fencepost_server.storage import Item
from fencepost_server.storage.dynamodb import DynamoStorage
from fencepost_server.storage.dynamodb.bulk import BATCH_WRITE_ITEMS, IN_FLIGHT
from fencepost_server.storage.sqlite import SqliteStorage
from tests.dynamo_support import REGION, backend_url, moto_endpoint, unique_table

from .harness import Reporter

ITEMS = 3000
VALUE_BYTES = 200
TENANTS = 6
ROUNDS = 3


def _items() -> list[Item]:
    # a few tenants' KV spaces and ledger partitions, as a real store spreads out
    out = []
    for i in range(ITEMS):
        tenant = f"tenant{i % TENANTS}"
        key = f"{tenant}/kv/doc-{i:06d}" if i % 2 else f"{tenant}/sys/ledger/s{i % 40:03d}/log/{i:08d}"
        out.append(Item(key, os.urandom(VALUE_BYTES), os.urandom(16).hex()))
    return out


async def _table(endpoint: str) -> str:
    storage = DynamoStorage(unique_table(), endpoint_url=endpoint, region=REGION)
    try:
        await storage.create_table()
    finally:
        await storage.close()
    return storage.table


async def _raw(endpoint: str, items: list[Item]) -> float:
    """items/s of BatchWriteItem straight from one aioboto3 client."""
    table = await _table(endpoint)
    config = AioConfig(max_pool_connections=64, retries={"total_max_attempts": 1})
    storage = DynamoStorage(table)  # only for its key codec: the same attributes as the migration
    rows = []
    for item in items:
        _, key = storage.codec.key_attributes(item.key)
        rows.append({"PutRequest": {"Item": {**key, "val": {"B": item.value}, "ver": {"S": item.version}}}})
    chunks = [rows[i:i + BATCH_WRITE_ITEMS] for i in range(0, len(rows), BATCH_WRITE_ITEMS)]
    gate = asyncio.Semaphore(IN_FLIGHT)
    async with aioboto3.Session().client("dynamodb", region_name=REGION, endpoint_url=endpoint,
                                         config=config) as client:
        async def send(chunk: list[dict[str, object]]) -> None:
            async with gate:
                pending = chunk
                while pending:
                    response = await client.batch_write_item(RequestItems={table: pending})
                    pending = (response.get("UnprocessedItems") or {}).get(table) or []

        started = time.perf_counter()
        await asyncio.gather(*(send(chunk) for chunk in chunks))
        return len(items) / (time.perf_counter() - started)


async def _migrate(endpoint: str, source_url: str, work: Path) -> tuple[float, float, int]:
    target = backend_url(await _table(endpoint))
    with open(os.devnull, "w") as quiet:
        report = await migrate(source_url, target, work_dir=work, stream=quiet)
    assert report.verification.same, report.verification.differences
    return report.rate, report.verify_seconds, report.copied


async def run(report: Reporter) -> None:
    endpoint = moto_endpoint()
    items = _items()
    with tempfile.TemporaryDirectory() as tmp:
        source_url = f"sqlite://{Path(tmp) / 'source.db'}"
        source = SqliteStorage(Path(tmp) / "source.db")
        try:
            for start in range(0, len(items), 500):
                await source.import_items(items[start:start + 500])
        finally:
            await source.close()
        await _raw(endpoint, items[:300])  # warm moto up; not reported
        raw_best = migrate_best = 0.0
        for n in range(ROUNDS):
            raw = await _raw(endpoint, items)
            report(f"raw aioboto3 batch_write_item x{IN_FLIGHT} round {n + 1}", items_per_s=raw)
            rate, verify_seconds, copied = await _migrate(endpoint, source_url, Path(tmp) / f"work{n}")
            report(f"fencepost migrate sqlite->dynamodb round {n + 1}", items_per_s=rate, items=copied,
                   verify_s=verify_seconds)
            raw_best, migrate_best = max(raw_best, raw), max(migrate_best, rate)
        report(f"ratio migrate/raw batch writes ({ITEMS} items)", ratio=migrate_best / raw_best)
