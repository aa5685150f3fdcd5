"""A storage wrapper that kills the caller at its Nth backend call.

`KillAt(inner, n, after=False)` raises `Killed` on call number `n` (0-based),
either before the call reaches the backend (`after=False`: the call never
happened) or after it returned (`after=True`: the call happened, its caller
died before seeing the result). That is the two ways a process can die
around one round trip, so running a flush once per (n, after) kills it at
every step. Once killed, every later call raises too (the process is dead:
not even a `finally` block reaches the backend).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fencepost_server.storage import CasResult, Check, CountKeys, Item, Storage, TxnResult, Write

T = TypeVar("T")


class Killed(BaseException):
    """The simulated crash (a BaseException, so no `except Exception` swallows it)."""


class KillAt(Storage):
    def __init__(self, inner: Storage, n: int, *, after: bool = False) -> None:
        self.inner = inner
        self.n = n
        self.after = after
        self.calls: list[str] = []
        self.dead = False

    async def _run(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        index = len(self.calls)
        self.calls.append(name)
        if self.dead or (index == self.n and not self.after):
            self.dead = True
            raise Killed(f"killed before call {index} ({name})")
        result = await call()
        if index == self.n and self.after:
            self.dead = True
            raise Killed(f"killed after call {index} ({name})")
        return result

    async def get(self, key: str) -> Item | None:
        return await self._run("get", lambda: self.inner.get(key))

    async def put(self, key: str, value: bytes) -> str:
        return await self._run("put", lambda: self.inner.put(key, value))

    async def delete(self, key: str) -> bool:
        return await self._run("delete", lambda: self.inner.delete(key))

    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        return await self._run("list", lambda: self.inner.list(prefix, start_after, limit, max_bytes))

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        return await self._run("list_keys", lambda: self.inner.list_keys(prefix, start_after, limit))

    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        return await self._run("put_if_absent", lambda: self.inner.put_if_absent(key, value))

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        return await self._run("put_if_version", lambda: self.inner.put_if_version(key, value, expected))

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        return await self._run("delete_if_version", lambda: self.inner.delete_if_version(key, expected))

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        return await self._run("transact", lambda: self.inner.transact(checks, writes, count))

    async def close(self) -> None:  # the inner backend belongs to the test fixture
        pass
