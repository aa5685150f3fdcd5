"""The embedded default: one SQLite file in WAL mode.

Writes go to one writer thread that group-commits whatever is queued: every
queued operation runs inside its own SAVEPOINT of one transaction, and one
COMMIT (one fsync) acknowledges the whole batch. Reads run on a separate
connection in a reader thread, batched the same way; WAL lets them proceed
while the writer writes.

Version tokens come from a counter stored in the same file and advanced inside
the write transaction, so they are unique across restarts and across several
processes sharing the file (BEGIN IMMEDIATE serialises writers). An import
raises the counter past every counter-shaped version it brings in, in the
same transaction, so no imported version is ever minted again.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

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
    prefix_end,
    validate_transaction,
)

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
  key BLOB PRIMARY KEY,
  value BLOB NOT NULL,
  version TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (name, n) VALUES ('version', 0);
"""

_MAX_BATCH = 512
#: the counter family of this backend's versions (base.version_family)
_COUNTER_FAMILY = "16"
_STOP = object()


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _bounds(prefix: str, start_after: str | None) -> tuple[str, list[Any]]:
    """WHERE clause for keys under `prefix` after `start_after` (byte order)."""
    clauses, args = [], []
    low = prefix.encode()
    if start_after is not None and start_after >= prefix:
        clauses.append("key > ?")
        args.append(start_after.encode())
    else:
        clauses.append("key >= ?")
        args.append(low)
    end = prefix_end(prefix)
    if end is not None:
        clauses.append("key < ?")
        args.append(end.encode())
    return " AND ".join(clauses), args


def _count(conn: sqlite3.Connection, count: CountKeys) -> int:
    where, args = _bounds(count.prefix, None)
    (n,) = conn.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM kv WHERE {where} LIMIT ?)", (*args, count.limit)).fetchone()
    return int(n)


class _Worker:
    """One connection, one thread, fed by a queue. Whatever is queued when the
    thread wakes is handled as one batch and answered with one wake-up per
    event loop. A transactional worker (the writer) runs the batch inside one
    BEGIN IMMEDIATE ... COMMIT, each operation in its own SAVEPOINT, so one
    fsync acknowledges the whole batch (group commit)."""

    def __init__(self, path: str, synchronous: str, *, writer: bool) -> None:
        self._conn = _connect(path, synchronous)
        self._writer = writer
        if writer:
            self._conn.executescript(_SCHEMA)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._next_version = 0
        name = "fencepost-sqlite-writer" if writer else "fencepost-sqlite-reader"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, op: Callable[..., Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.put((op, loop, fut))
        return fut

    def stop(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()

    def _version(self) -> str:
        self._next_version += 1
        return f"{self._next_version:016x}"

    def reserve(self, counter: int) -> None:
        """Mint past `counter` from now on (called by an op inside a batch)."""
        self._next_version = max(self._next_version, counter)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < _MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            outcomes = self._commit(batch) if self._writer else [self._call(op, (self._conn,)) for op, _, _ in batch]
            _answer(batch, outcomes)
            if stop:
                return

    @staticmethod
    def _call(op: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
        try:
            return True, op(*args)
        except Exception as exc:
            return False, exc

    def _commit(self, batch: list[tuple[Any, asyncio.AbstractEventLoop, asyncio.Future[Any]]]) -> list[tuple[bool, Any]]:
        conn = self._conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            (start,) = conn.execute("SELECT n FROM meta WHERE name = 'version'").fetchone()
            self._next_version = start
            for op, _, _ in batch:
                conn.execute("SAVEPOINT op")
                outcome = self._call(op, (conn, self._version))
                conn.execute("RELEASE op" if outcome[0] else "ROLLBACK TO op")
                if not outcome[0]:
                    conn.execute("RELEASE op")  # one bad op must not sink the batch
                outcomes.append(outcome)
            conn.execute("UPDATE meta SET n = ? WHERE name = 'version'", (self._next_version,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.warning("sqlite batch commit failed: %s", exc)
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            outcomes = [(False, BackendUnavailable(f"sqlite commit failed: {exc}"))] * len(batch)
        return outcomes


def _answer(
    batch: list[tuple[Any, asyncio.AbstractEventLoop, asyncio.Future[Any]]], outcomes: list[tuple[bool, Any]]
) -> None:
    """Hand results back: one wake-up per event loop per batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for (_, loop, fut), (ok, value) in zip(batch, outcomes):
        if not ok and isinstance(value, sqlite3.Error):
            value = BackendUnavailable(f"sqlite: {value}")
        by_loop.setdefault(loop, []).append((fut, ok, value))
    for loop, results in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_all, results)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def _resolve_all(results: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in results:
        if fut.cancelled():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _read_item(conn: sqlite3.Connection, key: str) -> Item | None:
    row = conn.execute("SELECT value, version FROM kv WHERE key = ?", (key.encode(),)).fetchone()
    return Item(key, row[0], row[1]) if row else None


def _write(conn: sqlite3.Connection, key: str, value: bytes, version: str) -> None:
    conn.execute(
        "INSERT INTO kv (key, value, version) VALUES (?, ?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version",
        (key.encode(), value, version),
    )


def _erase(conn: sqlite3.Connection, key: str) -> bool:
    return conn.execute("DELETE FROM kv WHERE key = ?", (key.encode(),)).rowcount > 0


class SqliteStorage(Storage):
    scheme = "sqlite"

    def __init__(self, path: str | Path, *, synchronous: str = "FULL") -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._writer = _Worker(self.path, synchronous, writer=True)
            self._reader = _Worker(self.path, synchronous, writer=False)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open sqlite file {self.path}: {exc}") from exc
        self._closed = False

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"SqliteStorage({self.path!r}) was never closed", ResourceWarning, stacklevel=1)

    # -- plumbing ----------------------------------------------------------
    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self._closed:
            raise BackendUnavailable("sqlite backend is closed")
        return await self._reader.submit(fn)

    async def _write_op(self, fn: Callable[[sqlite3.Connection, Callable[[], str]], Any]) -> Any:
        if self._closed:
            raise BackendUnavailable("sqlite backend is closed")
        return await self._writer.submit(fn)

    # -- KV core -----------------------------------------------------------
    async def get(self, key: str) -> Item | None:
        return await self._read(lambda c: _read_item(c, key))

    async def put(self, key: str, value: bytes) -> str:
        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> str:
            v = version()
            _write(conn, key, value, v)
            return v

        return await self._write_op(op)

    async def delete(self, key: str) -> bool:
        return await self._write_op(lambda conn, _v: _erase(conn, key))

    async def list(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[Item]:
        where, args = _bounds(prefix, start_after)

        def read(conn: sqlite3.Connection) -> list[Item]:
            rows = conn.execute(
                f"SELECT key, value, version FROM kv WHERE {where} ORDER BY key LIMIT ?", (*args, limit)
            ).fetchall()
            return [Item(k.decode(), v, ver) for k, v, ver in rows]

        return await self._read(read)

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        where, args = _bounds(prefix, start_after)

        def read(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(f"SELECT key FROM kv WHERE {where} ORDER BY key LIMIT ?", (*args, limit))
            return [k.decode() for (k,) in rows]

        return await self._read(read)

    # -- CAS group ---------------------------------------------------------
    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> CasResult:
            current = _read_item(conn, key)
            if current is not None:
                return CasResult(False, current.version, current)
            v = version()
            _write(conn, key, value, v)
            return CasResult(True, v)

        return await self._write_op(op)

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> CasResult:
            current = _read_item(conn, key)
            if current is None or current.version != expected:
                return CasResult(False, current.version if current else None, current)
            v = version()
            _write(conn, key, value, v)
            return CasResult(True, v)

        return await self._write_op(op)

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        def op(conn: sqlite3.Connection, _version: Callable[[], str]) -> CasResult:
            current = _read_item(conn, key)
            if current is None or current.version != expected:
                return CasResult(False, current.version if current else None, current)
            _erase(conn, key)
            return CasResult(True, None)

        return await self._write_op(op)

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        validate_transaction(checks, writes)

        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> TxnResult:
            conditions = [(c.key, c.expect) for c in checks] + [(w.key, w.expect) for w in writes]
            current = [_read_item(conn, key) if expect is not None else None for key, expect in conditions]
            failed = tuple(
                i for i, (_, expect) in enumerate(conditions)
                if expect is not None and not expect.holds(current[i])
            )
            if failed:
                return TxnResult(False, failed=failed, found={i: current[i] for i in failed})
            versions: list[str | None] = []
            for w in writes:
                if isinstance(w, Put):
                    v = w.version or version()
                    _write(conn, w.key, w.value, v)
                    versions.append(v)
                else:
                    assert isinstance(w, Delete)
                    _erase(conn, w.key)
                    versions.append(None)
            return TxnResult(True, tuple(versions), count=None if count is None else _count(conn, count))

        return await self._write_op(op)

    # -- operator tools ----------------------------------------------------
    async def import_items(self, items: Sequence[Item]) -> None:
        rows = [(item.key.encode(), item.value, item.version) for item in items]
        highest = highest_per_family(item.version for item in items).get(_COUNTER_FAMILY)

        def op(conn: sqlite3.Connection, _version: Callable[[], str]) -> None:
            conn.executemany(
                "INSERT INTO kv (key, value, version) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version",
                rows,
            )
            if highest is not None:
                self._writer.reserve(highest[0])

        await self._write_op(op)

    async def reserve_versions(self, tokens: Iterable[str]) -> None:
        # Only this backend's own family can ever be minted here; others are
        # never equal to a minted token (another width or an epoch prefix).
        highest = highest_per_family(tokens).get(_COUNTER_FAMILY)
        if highest is not None:
            await self._write_op(lambda _conn, _version: self._writer.reserve(highest[0]))

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
            source = _connect(self.path, "NORMAL")
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
