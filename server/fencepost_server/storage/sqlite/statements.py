"""The SQL of the SQLite backend: schema, connections, and the statements every
operation runs (plain functions of a connection: the writer thread runs the
writes, the event loop's read connection the reads)."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..base import Check, CountKeys, Delete, Expect, Item, Marker, Put, TxnResult, Write, prefix_end

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


def create_schema(conn: sqlite3.Connection) -> None:
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


def connect(path: str, synchronous: str) -> sqlite3.Connection:
    """A connection in WAL mode that waits up to 30 s for a lock (callers lower that)."""
    # statements are cached per connection; a transaction's reads and puts are
    # one statement per size (up to ~100 each), more than the default 128
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30,
                           cached_statements=512)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def bounds(prefix: str, start_after: str | None) -> tuple[str, list[Any]]:
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


@functools.lru_cache(maxsize=4096)
def _counting(prefix: str) -> tuple[str, tuple[bytes, ...]]:
    """The statement and bounds that count the keys under `prefix` (a
    transaction's CountKeys names the same inbox prefix call after call)."""
    where, args = bounds(prefix, None)
    return f"SELECT COUNT(*) FROM (SELECT 1 FROM kv WHERE {where} LIMIT ?)", tuple(args)


def count_keys(conn: sqlite3.Connection, count: CountKeys) -> int:
    sql, args = _counting(count.prefix)
    (n,) = conn.execute(sql, (*args, count.limit)).fetchone()
    return int(n)


def read_item(conn: sqlite3.Connection, key: str) -> Item | None:
    # fetchall: the statement runs to its end, so no read transaction stays open
    rows = conn.execute("SELECT value, version FROM kv WHERE key = ?", (key.encode(),)).fetchall()
    return Item(key, rows[0][0], rows[0][1]) if rows else None


UPSERT = (
    "INSERT INTO kv (key, value, version, marker_key, marker_value) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version, "
    "marker_key = excluded.marker_key, marker_value = excluded.marker_value"
)
#: for a row the transaction's own conditions found absent: no conflict to handle (and, with the
#: marker triggers on the table, measurably cheaper than the upsert: ~20% of a fenced commit's writes)
INSERT = "INSERT INTO kv (key, value, version, marker_key, marker_value) VALUES (?, ?, ?, ?, ?)"


def write_item(conn: sqlite3.Connection, key: str, value: bytes, version: str, marker: Marker | None = None) -> None:
    kept = (marker.key.encode(), marker.value) if marker else (None, None)
    conn.execute(UPSERT, (key.encode(), value, version, *kept))


@functools.lru_cache(maxsize=128)
def _lookups(n: int) -> str:
    """One statement that reads `n` distinct keys: a UNION ALL of primary-key
    lookups, which SQLite runs ~15% faster than `key IN (...)` over a few
    keys (no ephemeral table to build and sort the list in)."""
    return " UNION ALL ".join(["SELECT key, value, version FROM kv WHERE key = ?"] * n)


def read_items(conn: sqlite3.Connection, keys: list[str]) -> dict[str, Item]:
    """The items present at `keys` (distinct), read with one statement."""
    if len(keys) == 1:
        item = read_item(conn, keys[0])
        return {item.key: item} if item else {}
    found = {}
    for k, v, ver in conn.execute(_lookups(len(keys)), [k.encode() for k in keys]).fetchall():
        key = k.decode()
        found[key] = Item(key, v, ver)
    return found


def apply_transaction(
    conn: sqlite3.Connection, version: Callable[[], str], checks: Sequence[Check], writes: Sequence[Write],
    count: CountKeys | None = None, marker: Marker | None = None, *, dry: bool = False,
) -> TxnResult:
    """One transaction's conditions and writes inside the writer's transaction
    (`dry`: evaluate the conditions only). `marker` goes with its item's Put.
    The conditions are read with one statement and the puts written with one
    multi-row upsert (keys are distinct), whatever their number: fewer calls
    into SQLite; deletes run one by one, in their order."""
    conditions = [(c.key, c.expect) for c in checks] + [(w.key, w.expect) for w in writes]
    conditioned = [key for key, expect in conditions if expect is not None]
    current = read_items(conn, conditioned) if conditioned else {}
    failed = tuple(
        i for i, (key, expect) in enumerate(conditions)
        if expect is not None and not expect.holds(current.get(key))
    )
    if failed or dry:
        return TxnResult(False, failed=failed, found={i: current.get(conditions[i][0]) for i in failed})
    versions: list[str | None] = []
    rows: list[Any] = []
    erased: list[tuple[bytes]] = []
    for w in writes:
        if isinstance(w, Put):
            v = w.version or version()
            kept = marker if marker is not None and w.key == marker.item else None
            rows += (w.key.encode(), w.value, v, *((kept.key.encode(), kept.value) if kept else (None, None)))
            versions.append(v)
        else:
            assert isinstance(w, Delete)
            erased.append((w.key.encode(),))
            versions.append(None)
    # the puts in one statement, whatever their number: each statement is a
    # round of the writer thread through the GIL, which the event loop holds
    # much of the time (a fenced commit waited longer for it than it ran).
    # Deletes run one by one in their order (a commit has one): a delete that
    # moves a kept marker out (trigger) must be followed by a delete of that
    # marker's key, which one `DELETE ... IN` would have collected before.
    if rows:
        conn.execute(_upsert_rows(len(rows) // 5), rows)
    if erased:
        conn.executemany("DELETE FROM kv WHERE key = ?", erased)
    return TxnResult(True, tuple(versions), count=None if count is None else count_keys(conn, count))


@functools.lru_cache(maxsize=128)
def _upsert_rows(n: int) -> str:
    """UPSERT for `n` rows (distinct keys) in one statement."""
    return UPSERT.replace("(?, ?, ?, ?, ?)", ", ".join(["(?, ?, ?, ?, ?)"] * n))


def put_marked(conn: sqlite3.Connection, version: Callable[[], str], put: Put, marker: Marker) -> TxnResult:
    """A single-key write with a request id (marker.item == put.key), in as few
    statements as the kind of write allows, each writing with one statement
    (so the writer needs no savepoint for it):

    - an overwrite of a given version (the SDK's CAS): one read of the marker
      and the item together, then the item and the marker as a row of its
      own in one statement. Keeping the marker with an overwritten item would
      cost more: the item's previous marker has to move out to its own row
      all the same, and the partial index changes with it.
    - a new row (PutIfAbsent): the marker lookup, then the row keeping its marker.
    - anything else: `apply_transaction`."""
    expect = put.expect
    if expect is None or expect.version is None or expect.exists is not None or expect.value is not None:
        stored = stored_marker(conn, marker)
        if stored is not None:  # applied before: apply nothing, say which conditions fail now
            return replace(apply_transaction(conn, version, (), (put,), dry=True), marker=stored)
        if expect != _ABSENT:
            return apply_transaction(conn, version, (), (put,), marker=marker)
        v = put.version or version()
        if conn.execute(INSERT_NEW, (put.key.encode(), put.value, v, marker.key.encode(), marker.value)).rowcount:
            return TxnResult(True, (v,))
        return TxnResult(False, failed=(0,), found={0: read_item(conn, put.key)})
    key, mark, previous = put.key.encode(), marker.key.encode(), marker.previous.encode()
    current, stored = None, None
    for is_item, value, item_version in conn.execute(_MARKER_AND_ITEM, (mark, previous, mark, previous, key)):
        if is_item:
            current = Item(put.key, value, item_version)
        elif stored is None:  # the first found, as stored_marker reports it
            stored = value
    holds = current is not None and current.version == expect.version
    if stored is not None:  # applied before: apply nothing, say whether the condition fails now
        return TxnResult(False, failed=() if holds else (0,), found={} if holds else {0: current}, marker=stored)
    if not holds:
        return TxnResult(False, failed=(0,), found={0: current})
    v = put.version or version()
    conn.execute(_OVERWRITE_WITH_MARKER, (key, put.value, v, mark, marker.value, "m" + v))
    return TxnResult(True, (v,))


_ABSENT = Expect(exists=False)
#: a new row when the key is absent (a present key leaves the statement without a change)
INSERT_NEW = INSERT + " ON CONFLICT(key) DO NOTHING"
#: an overwrite of exactly this version (a CAS): a marker kept with the row moves out (trigger), the columns clear
OVERWRITE_VERSION = (
    "UPDATE kv SET value = ?, version = ?, marker_key = NULL, marker_value = NULL WHERE key = ? AND version = ?"
)
#: a request's marker (its keys in this window and the last) as a row of its own, then kept with an item
_MARKER_ROWS = (
    "SELECT 0, value, NULL FROM kv WHERE key IN (?, ?) "
    "UNION ALL SELECT 0, marker_value, NULL FROM kv WHERE marker_key IN (?, ?)"
)
#: the marker's rows (0) and the item its request writes (1)
_MARKER_AND_ITEM = _MARKER_ROWS + " UNION ALL SELECT 1, value, version FROM kv WHERE key = ?"
#: the item (present: its marker kept, if any, moves out by trigger and the columns clear) and the
#: marker's own new row, in one statement: both or neither
_OVERWRITE_WITH_MARKER = (
    "INSERT INTO kv (key, value, version, marker_key, marker_value) VALUES (?, ?, ?, NULL, NULL), "
    "(?, ?, ?, NULL, NULL) ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version, "
    "marker_key = NULL, marker_value = NULL"
)


def stored_marker(conn: sqlite3.Connection, marker: Marker) -> bytes | None:
    """The value of `marker` if it is stored (either window): as its own row
    or kept with an item."""
    keys = (marker.key.encode(), marker.previous.encode())
    rows = conn.execute(_MARKER_ROWS + " LIMIT 1", keys + keys).fetchall()
    return bytes(rows[0][1]) if rows else None


def erase(conn: sqlite3.Connection, key: str) -> bool:
    return conn.execute("DELETE FROM kv WHERE key = ?", (key.encode(),)).rowcount > 0


