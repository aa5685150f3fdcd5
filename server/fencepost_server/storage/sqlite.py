"""The embedded default: one SQLite file in WAL mode.

Writes go to one writer thread that group-commits whatever is queued: every
queued operation runs inside its own SAVEPOINT of one transaction, and one
COMMIT (one fsync) acknowledges the whole batch.

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
import logging
import queue
import sqlite3
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .base import (
    BackendUnavailable,
    CasResult,
    Check,
    EXPORT_PAGE,
    CountKeys,
    Delete,
    Item,
    Marker,
    Put,
    Storage,
    TxnResult,
    Write,
    highest_per_family,
    new_version,
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

# Request-id markers kept with the item their request wrote (Marker in
# storage/base.py): two nullable columns, a partial index to find a marker by
# its key (a request id reused for another key is still recognised), and
# triggers that move a marker out to its own row (at its key, the version
# derived from the item's unique version) whenever its item is overwritten or
# deleted, on every write path. (Clearing the marker columns alone moves
# nothing: that is how erasure forgets them.)
_MARKER_COLUMNS = ("marker_key", "marker_value")
_MARKER_TRIGGERS = """
CREATE INDEX IF NOT EXISTS kv_marker ON kv (marker_key) WHERE marker_key IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS kv_marker_out_on_write AFTER UPDATE OF value, version ON kv
WHEN OLD.marker_key IS NOT NULL
BEGIN
  INSERT OR IGNORE INTO kv (key, value, version) VALUES (OLD.marker_key, OLD.marker_value, 'm' || OLD.version);
END;
CREATE TRIGGER IF NOT EXISTS kv_marker_out_on_delete AFTER DELETE ON kv WHEN OLD.marker_key IS NOT NULL
BEGIN
  INSERT OR IGNORE INTO kv (key, value, version) VALUES (OLD.marker_key, OLD.marker_value, 'm' || OLD.version);
END;
"""


def _create_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(_SCHEMA)
    present = {row[1] for row in conn.execute("PRAGMA table_info(kv)")}
    for column in _MARKER_COLUMNS:
        if column not in present:
            try:
                conn.execute(f"ALTER TABLE kv ADD COLUMN {column} BLOB")
            except sqlite3.OperationalError as exc:  # another process added it first
                if "duplicate column" not in str(exc):
                    raise
    conn.executescript(_MARKER_TRIGGERS)


_MAX_BATCH = 512
_BUSY_SECONDS = 30.0  # how long the writer waits for another process's writer
_BUSY_STEP = 0.0002
#: the counter family of this backend's versions (base.version_family)
_COUNTER_FAMILY = "16"
_STOP = object()


#: how long a read on the event loop may wait for a lock before it moves to the reader thread
_LOOP_BUSY_MS = 20


def _connect(path: str, synchronous: str, busy_ms: int = 30000) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_ms / 1000)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(f"PRAGMA busy_timeout={busy_ms}")
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
            _create_schema(self._conn)
            self._conn.execute("PRAGMA busy_timeout=0")  # from now on it waits for the lock itself (`_begin`)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._next_version = 0
        name = "fencepost-sqlite-writer" if writer else "fencepost-sqlite-reader"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, op: Callable[..., Any], savepoint: bool = True) -> asyncio.Future[Any]:
        """Queue `op`. `savepoint=False` for an op that modifies at most one
        statement's worth (SQLite undoes a failed statement by itself), which
        spares two statements per op in the batch."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.put((op, loop, fut, savepoint))
        return fut

    def stop(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()
        self._conn.close()

    def _begin(self) -> None:
        """BEGIN IMMEDIATE, waiting for another process's writer (`serve
        --workers`) in short steps: SQLite's own busy handler backs off to
        sleeps of 10-25 ms, far longer than the other writer holds the lock
        (one group commit), which would cap the writes of several workers."""
        deadline = time.monotonic() + _BUSY_SECONDS
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(_BUSY_STEP)

    @staticmethod
    def _version() -> str:
        return new_version()

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
            outcomes = self._commit(batch) if self._writer else [self._call(op, (self._conn,)) for op, *_ in batch]
            _answer(batch, outcomes)
            if stop:
                return

    @staticmethod
    def _call(op: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
        try:
            return True, op(*args)
        except Exception as exc:
            return False, exc

    def _commit(self, batch: list[tuple[Any, asyncio.AbstractEventLoop, asyncio.Future[Any], bool]]
                ) -> list[tuple[bool, Any]]:
        conn = self._conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            self._begin()
            (start,) = conn.execute("SELECT n FROM meta WHERE name = 'version'").fetchall()[0]
            self._next_version = start
            for op, _, _, savepoint in batch:
                if savepoint:
                    conn.execute("SAVEPOINT op")
                outcome = self._call(op, (conn, self._version))
                if savepoint:
                    conn.execute("RELEASE op" if outcome[0] else "ROLLBACK TO op")
                    if not outcome[0]:
                        conn.execute("RELEASE op")  # one bad op must not sink the batch
                elif not outcome[0] and not conn.in_transaction:
                    # some errors (disk full, I/O) roll the whole transaction back:
                    # nothing of this batch was applied, and the rest must not run unbatched
                    raise sqlite3.OperationalError(f"transaction rolled back: {outcome[1]}")
                outcomes.append(outcome)
            if self._next_version != start:  # an import reserved older counter tokens
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
    batch: list[tuple[Any, asyncio.AbstractEventLoop, asyncio.Future[Any], bool]], outcomes: list[tuple[bool, Any]]
) -> None:
    """Hand results back: one wake-up per event loop per batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for (_, loop, fut, _), (ok, value) in zip(batch, outcomes):
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
    # fetchall: the statement runs to its end, so no read transaction stays open
    rows = conn.execute("SELECT value, version FROM kv WHERE key = ?", (key.encode(),)).fetchall()
    return Item(key, rows[0][0], rows[0][1]) if rows else None


_UPSERT = (
    "INSERT INTO kv (key, value, version, marker_key, marker_value) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version, "
    "marker_key = excluded.marker_key, marker_value = excluded.marker_value"
)


def _write(conn: sqlite3.Connection, key: str, value: bytes, version: str, marker: Marker | None = None) -> None:
    kept = (marker.key.encode(), marker.value) if marker else (None, None)
    conn.execute(_UPSERT, (key.encode(), value, version, *kept))


def _read_items(conn: sqlite3.Connection, keys: list[str]) -> dict[str, Item]:
    """The items present at `keys`, read with one statement."""
    if len(keys) == 1:
        item = _read_item(conn, keys[0])
        return {item.key: item} if item else {}
    marks = ", ".join("?" * len(keys))
    rows = conn.execute(f"SELECT key, value, version FROM kv WHERE key IN ({marks})", [k.encode() for k in keys])
    return {k.decode(): Item(k.decode(), v, ver) for k, v, ver in rows.fetchall()}


def _apply(
    conn: sqlite3.Connection, version: Callable[[], str], checks: Sequence[Check], writes: Sequence[Write],
    count: CountKeys | None = None, marker: Marker | None = None, *, dry: bool = False,
) -> TxnResult:
    """One transaction's conditions and writes inside the writer's transaction
    (`dry`: evaluate the conditions only). `marker` goes with its item's Put.
    The conditions are read with one statement and the writes made with one
    per kind (keys are distinct), whatever their number: fewer round trips
    into SQLite, each of which hands the GIL over."""
    conditions = [(c.key, c.expect) for c in checks] + [(w.key, w.expect) for w in writes]
    conditioned = [key for key, expect in conditions if expect is not None]
    current = _read_items(conn, conditioned) if conditioned else {}
    failed = tuple(
        i for i, (key, expect) in enumerate(conditions)
        if expect is not None and not expect.holds(current.get(key))
    )
    if failed or dry:
        return TxnResult(False, failed=failed, found={i: current.get(conditions[i][0]) for i in failed})
    versions: list[str | None] = []
    rows: list[tuple[Any, ...]] = []
    erased: list[tuple[bytes]] = []
    for w in writes:
        if isinstance(w, Put):
            v = w.version or version()
            kept = marker if marker is not None and w.key == marker.item else None
            rows.append((w.key.encode(), w.value, v, *((kept.key.encode(), kept.value) if kept else (None, None))))
            versions.append(v)
        else:
            assert isinstance(w, Delete)
            erased.append((w.key.encode(),))
            versions.append(None)
    if rows:
        conn.executemany(_UPSERT, rows)
    if erased:
        conn.executemany("DELETE FROM kv WHERE key = ?", erased)
    return TxnResult(True, tuple(versions), count=None if count is None else _count(conn, count))


def _stored_marker(conn: sqlite3.Connection, marker: Marker) -> bytes | None:
    """The value of `marker` if it is stored (either window): as its own row
    or kept with an item."""
    keys = (marker.key.encode(), marker.previous.encode())
    rows = conn.execute(
        "SELECT value FROM kv WHERE key IN (?, ?) "
        "UNION ALL SELECT marker_value FROM kv WHERE marker_key IN (?, ?) LIMIT 1", keys + keys,
    ).fetchall()
    return bytes(rows[0][0]) if rows else None


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
            self._loop_conn = _connect(self.path, synchronous, busy_ms=_LOOP_BUSY_MS)
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
        try:
            return fn(self._loop_conn)
        except sqlite3.Error as exc:
            if not (isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)):
                raise BackendUnavailable(f"sqlite: {exc}") from exc
        return await self._reader.submit(fn)  # waits for the lock off the event loop

    async def _write_op(self, fn: Callable[[sqlite3.Connection, Callable[[], str]], Any],
                        savepoint: bool = False) -> Any:
        """`savepoint`: `fn` may modify with more than one statement."""
        if self._closed:
            raise BackendUnavailable("sqlite backend is closed")
        return await self._writer.submit(fn, savepoint)

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

        return await self._write_op(lambda conn, version: _apply(conn, version, checks, writes, count),
                                    savepoint=len(writes) > 1 or count is not None)

    keeps_markers_with_items = True

    async def transact_marked(self, checks: Sequence[Check], writes: Sequence[Write], marker: Marker) -> TxnResult:
        if marker.item is None or not any(isinstance(w, Put) and w.key == marker.item for w in writes):
            return await super().transact_marked(checks, writes, marker)
        validate_transaction(checks, writes)

        def op(conn: sqlite3.Connection, version: Callable[[], str]) -> TxnResult:
            stored = _stored_marker(conn, marker)
            if stored is not None:  # applied before: apply nothing, say which conditions fail now
                return replace(_apply(conn, version, checks, writes, dry=True), marker=stored)
            return _apply(conn, version, checks, writes, marker=marker)

        return await self._write_op(op, savepoint=len(writes) > 1)

    async def forget_markers(self, prefix: str) -> None:
        where, args = _bounds(prefix, None)
        await self._write_op(lambda conn, _v: conn.execute(
            f"UPDATE kv SET marker_key = NULL, marker_value = NULL WHERE marker_key IS NOT NULL AND {where}", args))

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
            conn.executemany(_UPSERT, rows)  # an imported item carries no request-id marker
            if highest is not None:
                self._writer.reserve(highest[0])

        await self._write_op(op, savepoint=True)

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
        self._loop_conn.close()
