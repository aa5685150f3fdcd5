"""The reference backend: a sorted in-process dict. For tests and comparisons."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from .base import (
    BackendUnavailable,
    CasResult,
    Check,
    CountKeys,
    Delete,
    Item,
    Put,
    Storage,
    TxnResult,
    Write,
    new_version,
    validate_transaction,
)


class MemoryStorage(Storage):
    scheme = "memory"

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self._keys: list[str] = []  # sorted; str order == UTF-8 byte order
        self._closed = False

    def _open(self) -> None:
        if self._closed:
            raise BackendUnavailable("memory backend is closed")

    def _store(self, key: str, value: bytes, version: str | None = None) -> str:
        version = version or new_version()
        if key not in self._items:
            bisect.insort(self._keys, key)
        self._items[key] = Item(key, bytes(value), version)
        return version

    def _remove(self, key: str) -> bool:
        if self._items.pop(key, None) is None:
            return False
        del self._keys[bisect.bisect_left(self._keys, key)]
        return True

    def _scan(self, prefix: str, start_after: str | None, limit: int) -> list[str]:
        lo = bisect.bisect_left(self._keys, prefix)
        if start_after is not None and start_after >= prefix:
            lo = bisect.bisect_right(self._keys, start_after)
        out: list[str] = []
        for key in itertools.islice(self._keys, lo, None):
            if not key.startswith(prefix) or len(out) >= limit:
                break
            out.append(key)
        return out

    async def get(self, key: str) -> Item | None:
        self._open()
        return self._items.get(key)

    async def put(self, key: str, value: bytes) -> str:
        self._open()
        return self._store(key, value)

    async def delete(self, key: str) -> bool:
        self._open()
        return self._remove(key)

    async def list(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[Item]:
        self._open()
        return [self._items[k] for k in self._scan(prefix, start_after, limit)]

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        self._open()
        return self._scan(prefix, start_after, limit)

    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        self._open()
        current = self._items.get(key)
        if current is not None:
            return CasResult(False, current.version, current)
        return CasResult(True, self._store(key, value))

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        self._open()
        current = self._items.get(key)
        if current is None or current.version != expected:
            return CasResult(False, current.version if current else None, current)
        return CasResult(True, self._store(key, value))

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        self._open()
        current = self._items.get(key)
        if current is None or current.version != expected:
            return CasResult(False, current.version if current else None, current)
        self._remove(key)
        return CasResult(True, None)

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        self._open()
        validate_transaction(checks, writes)
        conditions = [(c.key, c.expect) for c in checks] + [(w.key, w.expect) for w in writes]
        failed = tuple(
            i for i, (key, expect) in enumerate(conditions)
            if expect is not None and not expect.holds(self._items.get(key))
        )
        if failed:
            return TxnResult(False, failed=failed)
        versions: list[str | None] = []
        for w in writes:
            if isinstance(w, Put):
                versions.append(self._store(w.key, w.value, w.version))
            else:
                assert isinstance(w, Delete)
                self._remove(w.key)
                versions.append(None)
        counted = None if count is None else len(self._scan(count.prefix, None, count.limit))
        return TxnResult(True, tuple(versions), count=counted)

    async def close(self) -> None:
        self._closed = True
