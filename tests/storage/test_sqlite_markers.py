"""SQLite's single-key writes with a request id (statements.put_marked): the
same answers as the general transaction path, a new row keeping its marker,
an overwrite writing its marker as a row of its own and clearing the one the
row kept (which moves out, so a retry of either request still finds it)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fencepost_server.domain.kv import KvStore
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import BackendUnavailable, Expect, Marker, Put, TxnResult
from fencepost_server.storage.sqlite import SqliteStorage
from fencepost_server.storage.sqlite.statements import (
    apply_transaction, connect, create_schema, put_marked, stored_marker,
)


@pytest.fixture
def twins(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
    """Two stores holding the same items: one answers through put_marked, the other the general path."""
    conns = []
    for name in ("fast", "general"):
        conn = connect(str(tmp_path / f"{name}.db"), "NORMAL")
        create_schema(conn)
        conn.execute("INSERT INTO kv (key, value, version) VALUES (?, x'01', 'v1')", (b"k",))
        conn.execute("INSERT INTO kv (key, value, version, marker_key, marker_value) VALUES (?, x'02', 'v2', ?, x'aa')",
                     (b"kept", b"#/req/1/old"))
        conns.append(conn)
    yield conns[0], conns[1]
    for conn in conns:
        conn.close()


def _general(conn: sqlite3.Connection, put: Put, marker: Marker) -> TxnResult:
    """What SqliteStorage.transact_marked ran for every marked write before put_marked."""
    stored = stored_marker(conn, marker)
    if stored is not None:
        return replace(apply_transaction(conn, _no_version, (), (put,), dry=True), marker=stored)
    return apply_transaction(conn, _no_version, (), (put,), marker=marker)


def _no_version() -> str:
    raise AssertionError("the request log chooses the versions")


def _rows(conn: sqlite3.Connection) -> set[tuple[object, ...]]:
    return set(conn.execute("SELECT key, value, version, marker_key IS NOT NULL FROM kv WHERE CAST(key AS TEXT) NOT LIKE '#/req/%'"))


def _markers(conn: sqlite3.Connection) -> list[tuple[bytes, bytes]]:
    own = conn.execute("SELECT key, value FROM kv WHERE CAST(key AS TEXT) LIKE '#/req/%'").fetchall()
    kept = conn.execute("SELECT marker_key, marker_value FROM kv WHERE marker_key IS NOT NULL").fetchall()
    return sorted((bytes(k), bytes(v)) for k, v in [*own, *kept])  # a marker in two places shows twice


CASES = [
    ("cas applied", Put("k", b"new", Expect(version="v1"), "r1")),
    ("cas stale", Put("k", b"new", Expect(version="v0"), "r1")),
    ("cas on an absent key", Put("nope", b"new", Expect(version="v1"), "r1")),
    ("cas over a kept marker", Put("kept", b"new", Expect(version="v2"), "r1")),
    ("create", Put("fresh", b"new", Expect(exists=False), "r1")),
    ("create over a present key", Put("k", b"new", Expect(exists=False), "r1")),
    ("plain put", Put("k", b"new", None, "r1")),
    ("put if value", Put("k", b"new", Expect(value=b"\x01"), "r1")),
]


@pytest.mark.parametrize(("case", "put"), CASES, ids=[c for c, _ in CASES])
def test_the_marked_path_answers_and_stores_as_the_general_one(
    twins: tuple[sqlite3.Connection, sqlite3.Connection], case: str, put: Put
) -> None:
    fast, general = twins
    marker = Marker("#/req/2/t/x", "#/req/1/t/x", b"outcome", put.key)
    for conn in twins:
        conn.execute("BEGIN IMMEDIATE")
    got = put_marked(fast, _no_version, put, marker)
    want = _general(general, put, marker)
    assert got == want
    # the same items; the same markers findable (as rows of their own or kept with an item)
    assert {r[:3] for r in _rows(fast)} == {r[:3] for r in _rows(general)}
    assert _markers(fast) == _markers(general)
    # replayed: found (if it applied), nothing applied, the condition judged as now
    replay = put_marked(fast, _no_version, put, marker)
    assert replay == _general(general, put, marker)
    assert replay.applied is False and (replay.marker == b"outcome") == got.applied


async def test_an_overwrite_stores_its_marker_apart_and_clears_the_one_the_row_kept(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "m.db", synchronous="NORMAL")
    try:
        kv = KvStore(storage, Limits(), RequestLog(storage))
        first = await kv.put_if_absent("t", "k", b"v1", request_id="a")
        second = await kv.put_if_version("t", "k", b"v2", first.version, request_id="b")
        conn = sqlite3.connect(tmp_path / "m.db")
        kept = conn.execute("SELECT COUNT(*) FROM kv WHERE marker_key IS NOT NULL").fetchone()[0]
        own = conn.execute("SELECT COUNT(*) FROM kv WHERE CAST(key AS TEXT) LIKE '#/req/%'").fetchone()[0]
        conn.close()
        assert (kept, own) == (0, 2)  # a moved out by the overwrite, b a row of its own
        assert await kv.put_if_absent("t", "k", b"v1", request_id="a") == first
        assert await kv.put_if_version("t", "k", b"v2", first.version, request_id="b") == second
        refused = await kv.put_if_version("t", "k", b"v3", first.version, request_id="c")
        assert not refused.applied and refused.version == second.version
    finally:
        await storage.close()


async def test_an_overwrite_whose_marker_cannot_be_stored_changes_nothing(tmp_path: Path) -> None:
    """The item and its marker's row are written together: if the marker
    cannot be stored, the item must not change either (a retry would then be
    refused by the version it wrote, unmarked)."""
    storage = SqliteStorage(tmp_path / "f.db", synchronous="NORMAL")
    try:
        kv = KvStore(storage, Limits(), RequestLog(storage))
        first = await kv.put("t", "k", b"v1")
        conn = sqlite3.connect(tmp_path / "f.db")
        conn.execute("CREATE TRIGGER refuse_markers BEFORE INSERT ON kv WHEN CAST(NEW.key AS TEXT) LIKE '#/req/%' "
                     "BEGIN SELECT RAISE(ABORT, 'no room for markers'); END")
        conn.close()
        with pytest.raises(BackendUnavailable):
            await kv.put_if_version("t", "k", b"v2", first, request_id="a")
        item = await kv.get("t", "k")
        assert item is not None and (item.value, item.version) == (b"v1", first)
    finally:
        await storage.close()


async def test_deletes_of_one_transaction_apply_in_their_order(tmp_path: Path) -> None:
    """Deleting an item that keeps a marker moves the marker out to its own
    row (trigger); a later delete of that marker's key in the same
    transaction removes it, as two transactions in a row would."""
    from fencepost_server.storage import Delete

    store = SqliteStorage(tmp_path / "d.db", synchronous="NORMAL")
    try:
        store._writer._conn.execute(
            "INSERT INTO kv (key, value, version, marker_key, marker_value) VALUES (?, x'01', 'v1', ?, x'aa')",
            (b"item", b"#/req/1/t/r"))
        res = await store.transact((), [Delete("item"), Delete("#/req/1/t/r")])
        assert res.applied
        assert await store.get("item") is None
        assert await store.get("#/req/1/t/r") is None
    finally:
        await store.close()
