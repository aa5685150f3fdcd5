"""The reference backend: a sorted in-process dict. For tests and comparisons."""

from __future__ import annotations

import bisect
import itertools
import secrets
from collections.abc import Iterable, Sequence

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
    highest_per_family,
    new_version,
    validate_transaction,
    within_budget,
)

_COUNTER_DIGITS = 12


class MemoryStorage(Storage):
    scheme = "memory"

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self._keys: list[str] = []  # sorted; str order == UTF-8 byte order
        # Versions are random (`_next_version`); the epoch only names the counter
        # family this backend once minted, for watermarks reserved from elsewhere.
        self._epoch = secrets.token_hex(4)
        self._minted = 0
        #: family -> (counter, token): the highest token of each family reserved
        self._reserved: dict[str, tuple[int, str]] = {}
        self._closed = False

    def _open(self) -> None:
        if self._closed:
            raise BackendUnavailable("memory backend is closed")

    def _next_version(self) -> str:
        # 128 random bits, never a counter: a tenant's versions say nothing
        # about anyone else's writes, and none can equal an imported token.
        return new_version()

    def _store(self, key: str, value: bytes, version: str | None = None) -> str:
        version = version or self._next_version()
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
        keys = self._keys
        # by index: islice would step through the `lo` keys before the prefix
        for i in range(lo, min(len(keys), lo + limit)):
            key = keys[i]
            if not key.startswith(prefix):
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

    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        self._open()
        items = [self._items[k] for k in self._scan(prefix, start_after, limit)]
        return items if max_bytes is None else within_budget(items, limit, max_bytes)

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
            return TxnResult(False, failed=failed, found={i: self._items.get(conditions[i][0]) for i in failed})
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

    # -- operator tools ----------------------------------------------------
    async def import_items(self, items: Sequence[Item]) -> None:
        self._open()
        for item in items:
            self._store(item.key, item.value, item.version)
        await self.reserve_versions(item.version for item in items)

    async def reserve_versions(self, tokens: Iterable[str]) -> None:
        self._open()
        for family, (counter, token) in highest_per_family(tokens).items():
            if family not in self._reserved or counter > self._reserved[family][0]:
                self._reserved[family] = (counter, token)
        own = self._reserved.get(f"{self._epoch}-{_COUNTER_DIGITS}")
        if own is not None and own[0] > self._minted:
            self._minted = own[0]
            self._counter = itertools.count(own[0] + 1)

    async def version_watermarks(self) -> list[str]:
        self._open()
        tokens = [token for _, token in self._reserved.values()]
        if self._minted:
            tokens.append(f"{self._epoch}-{self._minted:0{_COUNTER_DIGITS}x}")
        return sorted(token for _, token in highest_per_family(tokens).values())

    async def close(self) -> None:
        self._closed = True
