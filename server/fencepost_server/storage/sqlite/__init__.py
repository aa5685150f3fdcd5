"""The embedded default: one SQLite file in WAL mode.

Writes go to one writer thread that group-commits whatever is queued
(`writer.Worker`): every queued write runs inside one BEGIN IMMEDIATE
transaction (some writes in a SAVEPOINT of their own: writer.py), and one COMMIT (one fsync) acknowledges the whole batch. On a
quiet store (`StoreLoad`) a write the writer is idle for commits on the
caller's thread instead, the same way, without the two thread hand-offs
(`Worker.commit_here`). The SQL each operation runs is in `statements`.

Reads run on the calling event loop itself, on a connection of their own: in
WAL mode a read never waits for the writer, and a primary-key lookup costs a
few microseconds, far less than handing it to a thread and waking the loop
again. Every read is its own read transaction, started after the write it may
depend on was acknowledged (a write is acknowledged only after its COMMIT), so
reads see every acknowledged write. In the rare case WAL makes a reader wait
(another process recovering the WAL), the read is handed to a reader thread
instead of stalling the loop.

Version tokens are 128 random bits minted per write (`new_version`), as on
every backend: unique across restarts, processes sharing the file and copies
of it, and they say nothing about how much anyone else writes. Files written
before kept a counter (`meta`); it is still raised past every counter-shaped
version an import brings in and reported as this file's watermark, so those
older tokens stay reserved across a move.
"""

from __future__ import annotations

import asyncio
import sqlite3
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..base import (
    BackendUnavailable,
    CasResult,
    Check,
    Expect,
    EXPORT_PAGE,
    CountKeys,
    Item,
    Marker,
    Put,
    Storage,
    TxnResult,
    Write,
    highest_per_family,
    new_version,
    validate_transaction,
)
from .. import private
from .statements import (
    OVERWRITE_VERSION, UPSERT, apply_transaction, bounds, connect, erase, put_marked, read_item, stored_marker,
    write_item,
)
from .writer import StoreLoad, Worker

#: the counter family of this backend's versions (base.version_family)
_COUNTER_FAMILY = "16"
#: how long a read on the event loop may wait for a lock before it moves to the reader thread
_LOOP_BUSY_MS = 20


def _reserve(conn: sqlite3.Connection, counter: int) -> None:
    """Raise this file's counter watermark past `counter` (inside the batch's transaction)."""
    conn.execute("UPDATE meta SET n = MAX(n, ?) WHERE name = 'version'", (counter,))


class SqliteStorage(Storage):
    scheme = "sqlite"

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            try:
                private.make_dirs(Path(self.path).parent)
                private.create_file(self.path)  # SQLite gives its -wal / -shm files the same mode
            except OSError as exc:
                raise BackendUnavailable(f"cannot open sqlite file {self.path}: {exc}") from exc
        try:
            self._writer = Worker(self.path, synchronous, writer=True, version=new_version)
            self._reader = Worker(self.path, synchronous, writer=False)
            # opened with the long wait (another process may be creating the file or
            # recovering its WAL at start-up: `serve --workers`), then reads wait briefly
            self._loop_conn = connect(self.path, synchronous)
            self._loop_conn.execute(f"PRAGMA busy_timeout={_LOOP_BUSY_MS}")
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open sqlite file {self.path}: {exc}") from exc
        self._closed = False
        self._load = StoreLoad()  # reads and writes per second: whether a lone write may commit in place

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"SqliteStorage({self.path!r}) was never closed", ResourceWarning, stacklevel=1)

    # -- plumbing ----------------------------------------------------------
    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self._closed:
            raise BackendUnavailable("sqlite backend is closed")
        self._load.count()
        try:
            return fn(self._loop_conn)
        except sqlite3.Error as exc:
            if not (isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)):
                raise BackendUnavailable(f"sqlite: {exc}") from exc
        return await self._reader.submit(fn)  # waits for the lock off the event loop

    async def _write_op(self, fn: Callable[[sqlite3.Connection, Callable[[], str]], Any],
                        savepoint: bool = False) -> Any:
        """`savepoint`: undo `fn` alone if it fails part-way (without one,
        a failure after one of its statements changed rows fails the whole
        batch: writer.py). On a
        quiet store a write the writer is idle for commits right here
        (writer.py, `commit_here`)."""
        if self._closed:
            raise BackendUnavailable("sqlite backend is closed")
        if self._load.quiet():
            done = self._writer.commit_here(fn, savepoint)
            if done is not None:
                if done[0]:
                    return done[1]
                raise done[1]
        return await self._writer.submit(fn, savepoint)

    # -- KV core -----------------------------------------------------------
    async def get(self, key: str) -> Item | None:
        return await self._read(lambda c: read_item(c, key))

    async def put(self, key: str, value: bytes) -> str:
        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> str:
            v = version()
            write_item(conn, key, value, v)
            return v

        return await self._write_op(op)

    async def delete(self, key: str) -> bool:
        return await self._write_op(lambda conn, _v: erase(conn, key))

    # LIMIT is clamped at 0: SQLite reads a negative LIMIT as "no limit", and
    # the contract's limit is "at most" (memory and DynamoDB list nothing).
    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        where, args = bounds(prefix, start_after)
        if max_bytes is None:
            sql, params = f"SELECT key, value, version FROM kv WHERE {where} ORDER BY key LIMIT ?", (*args, max(limit, 0))
        else:
            # the rows before each one hold at most max_bytes: SQLite streams the
            # window in key order, so only the rows returned reach Python
            sql = (f"SELECT key, value, version FROM (SELECT key, value, version, SUM(length(key) + length(value)) "
                   f"OVER (ORDER BY key ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM kv "
                   f"WHERE {where} ORDER BY key LIMIT ?) WHERE before IS NULL OR before <= ?")
            params = (*args, max(limit, 0), max_bytes)

        def read(conn: sqlite3.Connection) -> list[Item]:
            rows = conn.execute(sql, params).fetchall()
            return [Item(k.decode(), v, ver) for k, v, ver in rows]

        return await self._read(read)

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        where, args = bounds(prefix, start_after)

        def read(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(f"SELECT key FROM kv WHERE {where} ORDER BY key LIMIT ?", (*args, max(limit, 0)))
            return [k.decode() for (k,) in rows]

        return await self._read(read)

    async def list_versions(
        self, prefix: str, start_after: str | None = None, limit: int = 100
    ) -> list[tuple[str, str]]:
        where, args = bounds(prefix, start_after)

        def read(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = conn.execute(
                f"SELECT key, version FROM kv WHERE {where} ORDER BY key LIMIT ?", (*args, max(limit, 0)))
            return [(k.decode(), v) for (k, v) in rows]

        return await self._read(read)

    # -- CAS group ---------------------------------------------------------
    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> CasResult:
            current = read_item(conn, key)
            if current is not None:
                return CasResult(False, current.version, current)
            v = version()
            write_item(conn, key, value, v)
            return CasResult(True, v)

        return await self._write_op(op)

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> CasResult:
            v = version()
            if conn.execute(OVERWRITE_VERSION, (value, v, key.encode(), expected)).rowcount:
                return CasResult(True, v)
            current = read_item(conn, key)  # refused: by what, in the same transaction
            return CasResult(False, current.version if current else None, current)

        return await self._write_op(op)

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        def op(conn: sqlite3.Connection, _version: Callable[[], str]) -> CasResult:
            if conn.execute("DELETE FROM kv WHERE key = ? AND version = ?", (key.encode(), expected)).rowcount:
                return CasResult(True, None)
            current = read_item(conn, key)  # refused: by what, in the same transaction
            return CasResult(False, current.version if current else None, current)

        return await self._write_op(op)

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        validate_transaction(checks, writes)

        # no savepoint: a write that fails part-way fails its batch (writer.py)
        return await self._write_op(lambda conn, version: apply_transaction(conn, version, checks, writes, count))

    keeps_markers_with_items = True

    async def transact_marked(self, checks: Sequence[Check], writes: Sequence[Write], marker: Marker) -> TxnResult:
        """The marker is looked up where SQLite may keep it (a row of its own
        or with an item, either window) in the transaction that applies the
        request: a request id a single-key write kept with its item is
        recognised by every other request too."""
        kept = marker.item is not None and any(isinstance(w, Put) and w.key == marker.item for w in writes)
        if kept and not checks and len(writes) == 1:
            validate_transaction(checks, writes)
            put = writes[0]
            assert isinstance(put, Put)
            return await self._write_op(lambda conn, version: put_marked(conn, version, put, marker))
        own_row = [] if kept else [Put(marker.key, marker.value)]  # its absence is checked just before
        # limits count the marker as the other backends store it: a check and a write
        validate_transaction([*checks, Check(marker.previous, Expect(exists=False))], [*writes, *own_row])

        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> TxnResult:
            stored = stored_marker(conn, marker)
            if stored is not None:  # applied before: apply nothing, say which conditions fail now
                return replace(apply_transaction(conn, version, checks, writes, dry=True), marker=stored)
            if kept:
                return apply_transaction(conn, version, checks, writes, marker=marker)
            result = apply_transaction(conn, version, checks, [*writes, *own_row])
            return replace(result, versions=result.versions[:-1]) if result.applied else result

        return await self._write_op(op)

    async def forget_markers(self, prefix: str) -> None:
        where, args = bounds(prefix, None)
        await self._write_op(lambda conn, _v: conn.execute(
            f"UPDATE kv SET marker_key = NULL, marker_value = NULL WHERE marker_key IS NOT NULL AND {where}", args))

    async def forget_markers_before(self, bound: str, limit: int) -> int:
        # the partial index on marker_key finds them; clearing the columns moves nothing out (statements.py)
        return int(await self._write_op(lambda conn, _v: conn.execute(
            "UPDATE kv SET marker_key = NULL, marker_value = NULL WHERE key IN "
            "(SELECT key FROM kv WHERE marker_key IS NOT NULL AND marker_key < ? LIMIT ?)",
            (bound.encode(), limit)).rowcount))

    # -- operator tools ----------------------------------------------------
    async def export_items(self, start_after: str | None = None, page: int = EXPORT_PAGE) -> AsyncIterator[list[Item]]:
        """As every backend, plus the request-id markers kept with their item:
        each is exported as the row it becomes when its item changes (its own
        key, version `m` + the item's), so an import anywhere keeps it."""
        after = (start_after or "").encode()
        while True:
            def read(conn: sqlite3.Connection, after: bytes = after) -> list[tuple[bytes, bytes, str]]:
                rows = conn.execute(
                    "SELECT key, value, version FROM kv WHERE key > ? ORDER BY key LIMIT ?", (after, page)
                ).fetchall()
                rows += conn.execute(
                    "SELECT marker_key, marker_value, 'm' || version FROM kv "
                    "WHERE marker_key IS NOT NULL AND marker_key > ? ORDER BY marker_key LIMIT ?", (after, page)
                ).fetchall()
                return rows

            merged: dict[bytes, tuple[bytes, str]] = {}
            for key, value, version in await self._read(read):
                merged.setdefault(key, (value, version))  # a row of its own wins over a kept copy
            keys = sorted(merged)[:page]
            if keys:
                yield [Item(k.decode(), *merged[k]) for k in keys]
            if len(keys) < page:
                return
            after = keys[-1]

    async def import_items(self, items: Sequence[Item]) -> None:
        rows = [(item.key.encode(), item.value, item.version, None, None) for item in items]
        highest = highest_per_family(item.version for item in items).get(_COUNTER_FAMILY)

        def op(conn: sqlite3.Connection, _version: Callable[[], str]) -> None:
            conn.executemany(UPSERT, rows)  # an imported item carries no request-id marker
            if highest is not None:
                _reserve(conn, highest[0])

        await self._write_op(op, savepoint=True)

    async def reserve_versions(self, tokens: Iterable[str]) -> None:
        # Only this backend's own family can ever be minted here; others are
        # never equal to a minted token (another width or an epoch prefix).
        highest = highest_per_family(tokens).get(_COUNTER_FAMILY)
        if highest is not None:
            await self._write_op(lambda conn, _version: _reserve(conn, highest[0]))

    async def version_watermarks(self) -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            (n,) = conn.execute("SELECT n FROM meta WHERE name = 'version'").fetchone()
            return [f"{n:016x}"] if n else []

        return await self._read(read)

    async def snapshot(self, path: str | Path) -> None:
        """An online, point-in-time copy of the whole file at `path`: sqlite3's
        backup API in one step, i.e. inside one read transaction, so under WAL
        writers carry on while it copies and the copy holds exactly the
        transactions committed before it began."""
        if self._closed:
            raise BackendUnavailable("sqlite backend is closed")

        def copy() -> None:
            source = connect(self.path, "NORMAL")
            private.create_file(path)
            target = sqlite3.connect(str(path))
            try:
                source.backup(target)
            finally:
                target.close()
                source.close()

        try:
            await asyncio.to_thread(copy)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"sqlite snapshot of {self.path} failed: {exc}") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._writer.stop)
        await loop.run_in_executor(None, self._reader.stop)
        self._loop_conn.close()
