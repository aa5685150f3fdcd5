"""The table's schema, and creating it (CLI `fencepost dynamodb create-table`,
`fencepost serve --create-table`, the tests)."""

from __future__ import annotations

import asyncio
from typing import Any

from botocore.exceptions import ClientError

#: Partition key: "k:" + the key's partition head ("d:" for the directory).
PARTITION_KEY = "pk"
#: Sort key: the rest of the key (the directory: a partition's name).
SORT_KEY = "sk"
VALUE = "val"
VERSION = "ver"
#: Epoch seconds after which DynamoDB may delete the item (not set by the KV
#: contract today; reserved so expiring records need no table change).
TTL_ATTRIBUTE = "expires_at"


def table_definition(table: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "KeySchema": [
            {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
        ],
        "AttributeDefinitions": [
            {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": SORT_KEY, "AttributeType": "S"},
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


async def create_table(client: Any, table: str, *, wait_seconds: float = 300.0) -> bool:
    """Create the table (PAY_PER_REQUEST) and enable TTL on `expires_at`.
    Returns False when it already existed. Idempotent."""
    created = True
    try:
        await client.create_table(**table_definition(table))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise
        created = False
    desc = await _wait_active(client, table, wait_seconds)
    if not created:  # a table of another schema would refuse every request as malformed
        wanted = table_definition(table)
        schema = {(k["AttributeName"], k["KeyType"]) for k in desc.get("KeySchema", [])}
        types = {(a["AttributeName"], a["AttributeType"]) for a in desc.get("AttributeDefinitions", [])}
        if schema != {(k["AttributeName"], k["KeyType"]) for k in wanted["KeySchema"]} or not types >= {
            (a["AttributeName"], a["AttributeType"]) for a in wanted["AttributeDefinitions"]
        }:
            raise ValueError(f"table {table} exists with another key schema ({sorted(schema)}); "
                             f"fencepost needs pk (String, HASH) and sk (String, RANGE)")
    ttl = await client.describe_time_to_live(TableName=table)
    if ttl.get("TimeToLiveDescription", {}).get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
        await client.update_time_to_live(
            TableName=table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )
    return created


async def _wait_active(client: Any, table: str, wait_seconds: float) -> dict[str, Any]:
    """The table's description once it is ACTIVE."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while True:
        desc = await client.describe_table(TableName=table)
        if desc["Table"]["TableStatus"] == "ACTIVE":
            return dict(desc["Table"])
        if loop.time() > deadline:
            raise TimeoutError(f"table {table} is still {desc['Table']['TableStatus']} after {wait_seconds}s")
        await asyncio.sleep(1.0)
