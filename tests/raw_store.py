"""Every item a backend holds, read beneath the storage contract (tests only).

The proof of an erasure: after it completes, nothing the backend stores
names the erased scope. Read the way an auditor would, not through the code
under test: the memory backend's own dict, SQLite by SELECT on the file,
DynamoDB by a Scan of the table through boto3 (the server never scans).
"""

from __future__ import annotations

import sqlite3

import boto3

from fencepost_server.storage import Storage
from fencepost_server.storage.dynamodb import DynamoStorage
from fencepost_server.storage.dynamodb.codec import DIRECTORY_PK, ITEM_PK_PREFIX, key_from
from fencepost_server.storage.dynamodb.table import VALUE
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.storage.sqlite import SqliteStorage

#: How a row of DynamoDB's partition directory is reported: it holds no value,
#: but its sort key is a partition's name (a tenant, an agent, ...), which an
#: erasure must not leave behind either.
DIRECTORY_ROW = "[partition directory] "


def raw_items(storage: Storage) -> dict[str, bytes]:
    """key -> value of every stored item. On DynamoDB every row of the table
    counts: item rows by their key, and the partition directory's rows as
    `DIRECTORY_ROW + partition name` with an empty value."""
    if isinstance(storage, MemoryStorage):
        return {k: it.value for k, it in storage._items.items()}  # noqa: SLF001 - reading beneath on purpose
    if isinstance(storage, SqliteStorage):
        with sqlite3.connect(storage.path) as conn:  # a reader of its own on the WAL file
            rows = conn.execute("SELECT key, value FROM kv").fetchall()
            # every column holding data counts: a request-id marker kept in its item's row
            # is reported at its own key, where the other backends keep it
            rows += conn.execute("SELECT marker_key, marker_value FROM kv WHERE marker_key IS NOT NULL").fetchall()
        out: dict[str, bytes] = {}
        for k, v in rows:
            out.setdefault(k.decode() if isinstance(k, bytes) else k, bytes(v))
        return out
    if isinstance(storage, DynamoStorage):
        client = boto3.client("dynamodb", endpoint_url=storage.endpoint_url, region_name=storage.region)
        out: dict[str, bytes] = {}
        for page in client.get_paginator("scan").paginate(TableName=storage.table, ConsistentRead=True):
            for row in page["Items"]:
                pk = row["pk"]["S"]
                if pk.startswith(ITEM_PK_PREFIX):
                    out[key_from(row)] = bytes(row.get(VALUE, {}).get("B", b""))
                elif pk == DIRECTORY_PK:
                    out[DIRECTORY_ROW + row["sk"]["S"]] = b""
        return out
    raise TypeError(f"no raw reader for {type(storage).__name__}")


def data_only(items: dict[str, bytes]) -> dict[str, bytes]:
    """`items` without the partition directory's rows: for comparing the data
    outside an erased scope before and after (an erasure may add a row for a
    shared bookkeeping partition such as `#/ledger/erase/`, naming no one)."""
    return {k: v for k, v in items.items() if not k.startswith(DIRECTORY_ROW)}


def raw_keys_naming(storage: Storage, *needles: str) -> list[str]:
    """Stored keys (or values) that contain any of `needles`."""
    found = []
    for key, value in raw_items(storage).items():
        if any(n in key or n.encode() in value for n in needles):
            found.append(key)
    return sorted(found)
