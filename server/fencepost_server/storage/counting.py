"""Wrappers that observe every backend round trip: `ObservedStorage` calls a
hook with (operation, seconds, error) after each call, and records a child
span of the RPC's span when tracing is on; `CountingStorage` counts calls by
operation (benchmarks and cost tests)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from .. import tracing
from .base import EXPORT_PAGE, CasResult, Check, CountKeys, Item, Marker, Storage, TxnResult, Write

T = TypeVar("T")
Hook = Callable[[str, float, BaseException | None], None]


class ObservedStorage(Storage):
    def __init__(self, inner: Storage, hook: Hook) -> None:
        self.inner = inner
        self._hook = hook

    async def _observe(self, op: str, call: Awaitable[T]) -> T:
        span = None if tracing.TRACER is None else tracing.start_backend_span(op)
        started = time.perf_counter()
        try:
            result = await call
        except BaseException as exc:
            self._hook(op, time.perf_counter() - started, exc)
            if span is not None:
                tracing.end_backend_span(span, exc)
            raise
        self._hook(op, time.perf_counter() - started, None)
        if span is not None:
            tracing.end_backend_span(span, None)
        return result

    async def get(self, key: str) -> Item | None:
        return await self._observe("get", self.inner.get(key))

    async def get_with_version(self, key: str) -> Item | None:
        return await self._observe("get_with_version", self.inner.get_with_version(key))

    async def put(self, key: str, value: bytes) -> str:
        return await self._observe("put", self.inner.put(key, value))

    async def delete(self, key: str) -> bool:
        return await self._observe("delete", self.inner.delete(key))

    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        return await self._observe("list", self.inner.list(prefix, start_after, limit, max_bytes))

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        return await self._observe("list_keys", self.inner.list_keys(prefix, start_after, limit))

    async def list_versions(
        self, prefix: str, start_after: str | None = None, limit: int = 100
    ) -> list[tuple[str, str]]:
        return await self._observe("list_versions", self.inner.list_versions(prefix, start_after, limit))

    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        return await self._observe("put_if_absent", self.inner.put_if_absent(key, value))

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        return await self._observe("put_if_version", self.inner.put_if_version(key, value, expected))

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        return await self._observe("delete_if_version", self.inner.delete_if_version(key, expected))

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        return await self._observe("transact", self.inner.transact(checks, writes, count))

    @property
    def keeps_markers_with_items(self) -> bool:  # type: ignore[override]
        return self.inner.keeps_markers_with_items

    async def transact_marked(self, checks: Sequence[Check], writes: Sequence[Write], marker: Marker) -> TxnResult:
        if not self.inner.keeps_markers_with_items:
            # the default is made of transact + get: observe those calls one by one
            return await super().transact_marked(checks, writes, marker)
        return await self._observe("transact", self.inner.transact_marked(checks, writes, marker))

    async def forget_markers(self, prefix: str) -> None:
        await self.inner.forget_markers(prefix)

    async def forget_markers_before(self, bound: str, limit: int) -> int:
        return await self._observe("forget_markers_before", self.inner.forget_markers_before(bound, limit))

    @property
    def partition_settle_seconds(self) -> float:  # type: ignore[override]
        return self.inner.partition_settle_seconds

    async def partitions_under(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> list[str]:
        return await self._observe("partitions_under", self.inner.partitions_under(prefix, start_after, limit))

    async def forget_partitions(self, names: Sequence[str]) -> None:
        await self._observe("forget_partitions", self.inner.forget_partitions(names))

    async def settle_partitions(self, names: Sequence[str]) -> int:
        return await self._observe("settle_partitions", self.inner.settle_partitions(names))

    async def export_items(self, start_after: str | None = None, page: int = EXPORT_PAGE) -> AsyncIterator[list[Item]]:
        async for items in self.inner.export_items(start_after, page):
            yield items

    async def import_items(self, items: Sequence[Item]) -> None:
        await self._observe("import_items", self.inner.import_items(items))

    async def reserve_versions(self, tokens: Iterable[str]) -> None:
        await self.inner.reserve_versions(tokens)

    async def version_watermarks(self) -> list[str]:
        return await self.inner.version_watermarks()

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:  # backend-specific extras (e.g. table names)
        return getattr(self.inner, name)


class CountingStorage(ObservedStorage):
    """Counts backend calls by operation: `calls["put"]`, `total()`, `reset()`."""

    def __init__(self, inner: Storage) -> None:
        self.calls: Counter[str] = Counter()
        super().__init__(inner, self._count)

    def _count(self, op: str, _seconds: float, _error: BaseException | None) -> None:
        self.calls[op] += 1

    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()
