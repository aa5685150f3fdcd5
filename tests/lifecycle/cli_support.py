"""Shared by the lifecycle CLI tests: a store with a few items to back up,
restore or migrate, and everything a store at a URL holds."""

from __future__ import annotations

import asyncio

from fencepost_server.storage import Item, open_backend


def fill(url: str, n: int = 30) -> None:
    """`n` KV items of growing size (the first one empty) in the store at `url`."""

    async def put_all() -> None:
        storage = open_backend(url)
        try:
            for i in range(n):
                await storage.put(f"t/kv/item-{i:03d}", b"v" * i)
        finally:
            await storage.close()

    asyncio.run(put_all())


async def exported(url: str) -> list[Item]:
    """Every item the store at `url` holds, as an export reads them (markers included)."""
    storage = open_backend(url)
    try:
        return [i async for page in storage.export_items() for i in page]
    finally:
        await storage.close()
