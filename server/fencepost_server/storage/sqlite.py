"""The embedded default: one SQLite file in WAL mode.

Writes go to one writer thread that group-commits whatever is queued: every
queued operation runs inside its own SAVEPOINT of one transaction, and one
COMMIT (one fsync) acknowledges the whole batch. Reads run on separate
connections in reader threads; WAL lets them proceed while the writer writes.

Version tokens come from a counter stored in the same file and advanced inside
the write transaction, so they are unique across restarts and across several
processes sharing the file (BEGIN IMMEDIATE serialises writers).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .base import (
    BackendUnavailable,
    CasResult,
    Check,
    Delete,
    Item,
    Put,
    Storage,
    TxnResult,
    Write,
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


class _Writer:
    """The single writer thread: batches queued operations into one commit."""

    def __init__(self, path: str, synchronous: str) -> None:
        self._conn = _connect(path, synchronous)
        self._conn.executescript(_SCHEMA)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="fencepost-sqlite-writer", daemon=True)
        self._next_version = 0
        self._last_version = 0
        self._thread.start()

    def submit(self, op: Callable[[sqlite3.Connection, Callable[[], str]], Any]) -> asyncio.Future[Any]:
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
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[Any, asyncio.AbstractEventLoop, asyncio.Future[Any]]]) -> None:
        conn = self._conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            (start,) = conn.execute("SELECT n FROM meta WHERE name = 'version'").fetchone()
            self._next_version = start
            for op, _, _ in batch:
                conn.execute("SAVEPOINT op")
                try:
                    outcomes.append((True, op(conn, self._version)))
                    conn.execute("RELEASE op")
                except Exception as exc:  # one bad op must not sink the batch
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    outcomes.append((False, exc))
            conn.execute("UPDATE meta SET n = ? WHERE name = 'version'", (self._next_version,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.warning("sqlite batch commit failed: %s", exc)
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            err = BackendUnavailable(f"sqlite commit failed: {exc}")
            outcomes = [(False, err)] * len(batch)
        for (_, loop, fut), (ok, value) in zip(batch, outcomes):
            if ok:
                loop.call_soon_threadsafe(_resolve, fut, value, None)
            else:
                if isinstance(value, sqlite3.Error):
                    value = BackendUnavailable(f"sqlite: {value}")
                loop.call_soon_threadsafe(_resolve, fut, None, value)


def _resolve(fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if fut.cancelled():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


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

    def __init__(self, path: str | Path, *, synchronous: str = "FULL", readers: int = 2) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._writer = _Writer(self.path, synchronous)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open sqlite file {self.path}: {exc}") from exc
        self._synchronous = synchronous
        self._local = threading.local()
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="fencepost-sqlite-reader")
        self._reader_conns: list[sqlite3.Connection] = []
        self._closed = False

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"SqliteStorage({self.path!r}) was never closed", ResourceWarning, stacklevel=1)

    # -- plumbing ----------------------------------------------------------
    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path, self._synchronous)
            self._local.conn = conn
            self._reader_conns.append(conn)
        return conn

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self._closed:
            raise BackendUnavailable("sqlite backend is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._readers, lambda: fn(self._reader()))
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"sqlite read failed: {exc}") from exc

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

    async def transact(self, checks: Sequence[Check] = (), writes: Sequence[Write] = ()) -> TxnResult:
        validate_transaction(checks, writes)

        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> TxnResult:
            conditions = [(c.key, c.expect) for c in checks] + [(w.key, w.expect) for w in writes]
            failed = tuple(
                i for i, (key, expect) in enumerate(conditions)
                if expect is not None and not expect.holds(_read_item(conn, key))
            )
            if failed:
                return TxnResult(False, failed=failed)
            versions: list[str | None] = []
            for w in writes:
                if isinstance(w, Put):
                    v = version()
                    _write(conn, w.key, w.value, v)
                    versions.append(v)
                else:
                    assert isinstance(w, Delete)
                    _erase(conn, w.key)
                    versions.append(None)
            return TxnResult(True, tuple(versions))

        return await self._write_op(op)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._writer.stop)
        self._readers.shutdown(wait=True)
        for conn in self._reader_conns:
            conn.close()
