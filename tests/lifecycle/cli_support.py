"""Shared by the lifecycle CLI tests: a store with a few items to back up,
restore or migrate."""

from __future__ import annotations

import asyncio

from fencepost_server.storage import open_backend


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
