"""A fault-injecting backend wrapper (ledger tests, reliability suite).

`FaultyStorage(inner, seed, fail=..., timeout=..., lose=...)` decides per call,
from a seeded RNG, to
- fail before the call: `BackendUnavailable`, nothing applied;
- time out: the call is applied or not (a coin flip), then `PersistenceUncertain`;
- apply but lose the response: the call is applied, then `PersistenceUncertain`.
Reads only ever fail before the call. `armed = False` turns faults off (e.g.
to check the final state); `injected` counts what was injected by kind,
`injected_by_call` by (kind, call name), `calls` every call by name.

`schedule={step: kind}` injects `kind` ("fail" / "timeout" / "lose") at the
chosen 0-based call step (counted over every call, armed or not), on top of
(or, with the rates at 0, instead of) the random faults. A scheduled
"timeout" or "lose" on a read drops the response after the call.
`cover_each=n` faults the first n armed calls of every call name (cycling
fail, timeout, lose; reads fail), so even a rarely made call gets each kind.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fencepost_server.storage import BackendUnavailable, PersistenceUncertain, Storage
from fencepost_server.storage.base import CasResult, Check, CountKeys, Item, Marker, TxnResult, Write

T = TypeVar("T")


class FaultyStorage(Storage):
    def __init__(
        self,
        inner: Storage,
        seed: int,
        *,
        fail: float = 0.1,
        timeout: float = 0.05,
        lose: float = 0.05,
        only: set[str] | None = None,
        schedule: dict[int, str] | None = None,
        cover_each: int = 0,
    ) -> None:
        self.inner = inner
        self.rng = random.Random(seed)
        self.fail, self.timeout, self.lose = fail, timeout, lose
        self.only = only
        self.armed = True
        self.injected: Counter[str] = Counter()
        self.injected_by_call: Counter[tuple[str, str]] = Counter()
        self.calls: Counter[str] = Counter()
        self.schedule = dict(schedule or {})
        self.step = 0
        self.cover_each = cover_each
        self.armed_calls: Counter[str] = Counter()

    def _count(self, kind: str, name: str) -> None:
        self.injected[kind] += 1
        self.injected_by_call[(kind, name)] += 1

    def _scheduled(self, name: str) -> str | None:
        """The fault chosen for this call step, if any (counts the step)."""
        step, self.step = self.step, self.step + 1
        self.calls[name] += 1
        if not self.armed:
            return None
        nth = self.armed_calls[name]
        self.armed_calls[name] += 1
        if nth < self.cover_each:
            return ("fail", "timeout", "lose")[nth % 3]
        return self.schedule.get(step)

    async def _read(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        chosen = self._scheduled(name)
        if chosen == "fail" or (
            chosen is None and self.armed and (self.only is None or name in self.only) and self.rng.random() < self.fail
        ):
            self._count("fail", name)
            raise BackendUnavailable(f"injected failure before {name}")
        if chosen in ("timeout", "lose"):
            self._count(chosen, name)
            await call()
            raise BackendUnavailable(f"injected {chosen} after {name}")
        return await call()

    async def _write(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        chosen = self._scheduled(name)
        if chosen is None:
            if not self.armed or (self.only is not None and name not in self.only):
                return await call()
            chosen = self._roll()
        if chosen == "fail":
            self._count("fail", name)
            raise BackendUnavailable(f"injected failure before {name}")
        if chosen == "timeout":
            self._count("timeout", name)
            if self.rng.random() < 0.5:
                await call()
            raise PersistenceUncertain(f"injected timeout in {name}")
        if chosen == "lose":
            self._count("lose", name)
            await call()
            raise PersistenceUncertain(f"injected lost response of {name}")
        return await call()

    def _roll(self) -> str | None:
        roll = self.rng.random()
        for kind, rate in (("fail", self.fail), ("timeout", self.timeout), ("lose", self.lose)):
            if roll < rate:
                return kind
            roll -= rate
        return None

    async def get(self, key: str) -> Item | None:
        return await self._read("get", lambda: self.inner.get(key))

    async def get_with_version(self, key: str) -> Item | None:
        return await self._read("get_with_version", lambda: self.inner.get_with_version(key))

    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        return await self._read("list", lambda: self.inner.list(prefix, start_after, limit, max_bytes))

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        return await self._read("list_keys", lambda: self.inner.list_keys(prefix, start_after, limit))

    async def put(self, key: str, value: bytes) -> str:
        return await self._write("put", lambda: self.inner.put(key, value))

    async def delete(self, key: str) -> bool:
        return await self._write("delete", lambda: self.inner.delete(key))

    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        return await self._write("put_if_absent", lambda: self.inner.put_if_absent(key, value))

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        return await self._write("put_if_version", lambda: self.inner.put_if_version(key, value, expected))

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        return await self._write("delete_if_version", lambda: self.inner.delete_if_version(key, expected))

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        return await self._write("transact", lambda: self.inner.transact(checks, writes, count))

    @property
    def keeps_markers_with_items(self) -> bool:  # type: ignore[override]
        return self.inner.keeps_markers_with_items

    async def transact_marked(self, checks: Sequence[Check], writes: Sequence[Write], marker: Marker) -> TxnResult:
        if not self.inner.keeps_markers_with_items:
            return await super().transact_marked(checks, writes, marker)  # faults at its transact + get
        return await self._write("transact_marked", lambda: self.inner.transact_marked(checks, writes, marker))

    async def forget_markers(self, prefix: str) -> None:
        await self.inner.forget_markers(prefix)

    @property
    def partition_settle_seconds(self) -> float:  # type: ignore[override]
        return self.inner.partition_settle_seconds

    async def partitions_under(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> list[str]:
        return await self.inner.partitions_under(prefix, start_after, limit)

    async def forget_partitions(self, names: Sequence[str]) -> None:
        await self.inner.forget_partitions(names)

    async def settle_partitions(self, names: Sequence[str]) -> int:
        return await self.inner.settle_partitions(names)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


def unwrap(storage: Any) -> Storage:
    while isinstance(storage, FaultyStorage):
        storage = storage.inner
    return storage  # type: ignore[no-any-return]
