"""A wrapper that counts backend round trips by operation (benchmarks, cost tests)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .base import CasResult, Check, Item, Storage, TxnResult, Write


class CountingStorage(Storage):
    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()

    async def get(self, key: str) -> Item | None:
        self.calls["get"] += 1
        return await self.inner.get(key)

    async def get_with_version(self, key: str) -> Item | None:
        self.calls["get_with_version"] += 1
        return await self.inner.get_with_version(key)

    async def put(self, key: str, value: bytes) -> str:
        self.calls["put"] += 1
        return await self.inner.put(key, value)

    async def delete(self, key: str) -> bool:
        self.calls["delete"] += 1
        return await self.inner.delete(key)

    async def list(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[Item]:
        self.calls["list"] += 1
        return await self.inner.list(prefix, start_after, limit)

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        self.calls["list_keys"] += 1
        return await self.inner.list_keys(prefix, start_after, limit)

    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        self.calls["put_if_absent"] += 1
        return await self.inner.put_if_absent(key, value)

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        self.calls["put_if_version"] += 1
        return await self.inner.put_if_version(key, value, expected)

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        self.calls["delete_if_version"] += 1
        return await self.inner.delete_if_version(key, expected)

    async def transact(self, checks: Sequence[Check] = (), writes: Sequence[Write] = ()) -> TxnResult:
        self.calls["transact"] += 1
        return await self.inner.transact(checks, writes)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()
