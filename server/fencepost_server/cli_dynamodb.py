"""`fencepost dynamodb ...`: operator commands for the DynamoDB backend."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `dynamodb` command group to the top-level parser."""
    group = subparsers.add_parser("dynamodb", help="DynamoDB backend operations")
    sub = group.add_subparsers(dest="dynamodb_command", required=True)
    create = sub.add_parser(
        "create-table", help="create the table (PAY_PER_REQUEST, TTL on expires_at); idempotent"
    )
    create.add_argument("--table", required=True, help="table name")
    create.add_argument("--endpoint", default=None, help="endpoint URL (default: AWS for the region)")
    create.add_argument("--region", default=None, help="AWS region (default: the AWS configuration's)")
    create.set_defaults(func=_cmd_create_table)


async def _create(table: str, endpoint: str | None, region: str | None) -> bool:
    from .storage.dynamodb import DynamoStorage

    storage = DynamoStorage(table, endpoint_url=endpoint, region=region)
    try:
        return await storage.create_table()
    finally:
        await storage.close()


def _cmd_create_table(args: argparse.Namespace) -> int:
    try:
        created = asyncio.run(_create(args.table, args.endpoint, args.region))
    except Exception as exc:  # report any AWS / connection failure as a CLI error
        from .storage.dynamodb.errors import describe

        print(f"fencepost: cannot create table {args.table}: {describe(exc)}", file=sys.stderr)
        return 1
    print(f"table {args.table} {'created' if created else 'already exists'} (TTL attribute expires_at)")
    return 0


async def ensure_table(storage: object) -> None:
    """`serve --create-table`: create the backend's table when it is DynamoDB;
    StartFailure (exit 3) with the cause when it cannot."""
    from .startup import ConfigError, StartFailure
    from .storage.dynamodb.errors import describe

    create = getattr(storage, "create_table", None)
    if create is None:
        raise ConfigError("argument --create-table: needs a dynamodb:// --backend")
    try:
        created = await create()
    except Exception as exc:  # endpoint, credentials, region, permissions: the environment's
        raise StartFailure(f"argument --create-table: cannot create the DynamoDB table "
                           f"{getattr(storage, 'table', '?')}: {describe(exc)}") from exc
    if created:
        from .cli import say

        say(f"created DynamoDB table {getattr(storage, 'table', '?')}")
