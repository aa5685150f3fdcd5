"""The SQLite statements a transaction runs (storage/sqlite/statements.py):
its conditions read with one statement answer exactly what one lookup per
key answers, and its pending count, built once per prefix, counts the keys
as they are at each call."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencepost_server.storage import MAX_TXN_OPS, CountKeys
from fencepost_server.storage.sqlite.statements import (
    connect, count_keys, create_schema, erase, read_item, read_items, write_item,
)

_STORED = [f"k/{i:03d}" for i in range(0, MAX_TXN_OPS * 2, 2)] + ["k/é", "k/\U0001f600", "k/"]


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    path: Path = tmp_path_factory.mktemp("statements") / "s.db"
    c = connect(str(path), "OFF")
    create_schema(c)
    for i, key in enumerate(_STORED):
        write_item(c, key, f"value {i}".encode(), f"v{i}")
    try:
        yield c
    finally:
        c.close()


_candidates = st.sampled_from(_STORED + [f"k/{i:03d}" for i in range(1, 40, 2)] + ["k/è", "absent"])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(_candidates, min_size=1, max_size=MAX_TXN_OPS, unique=True))
def test_conditions_read_together_equal_one_lookup_per_key(conn: sqlite3.Connection, keys: list[str]) -> None:
    one_by_one = {k: item for k in keys if (item := read_item(conn, k)) is not None}
    assert read_items(conn, keys) == one_by_one


def test_the_largest_transaction_reads_its_conditions_in_one_statement(conn: sqlite3.Connection) -> None:
    keys = [f"k/{i:03d}" for i in range(MAX_TXN_OPS)]  # every other one stored
    found = read_items(conn, keys)
    assert sorted(found) == [k for k in keys if k in _STORED]
    assert found["k/000"].value == b"value 0" and found["k/000"].version == "v0"


def test_a_count_follows_the_keys_from_call_to_call(tmp_path: Path) -> None:
    c = connect(str(tmp_path / "c.db"), "OFF")
    create_schema(c)
    try:
        inbox = CountKeys("s/1/in/", 3)
        assert count_keys(c, inbox) == 0
        for i in range(2):
            write_item(c, f"s/1/in/{i}", b"", "v")
        write_item(c, "s/1/in", b"", "v")  # beside the prefix, not under it
        write_item(c, "s/10/in/0", b"", "v")
        assert count_keys(c, inbox) == 2
        for i in range(2, 5):
            write_item(c, f"s/1/in/{i}", b"", "v")
        assert count_keys(c, inbox) == 3  # capped at the limit
        assert count_keys(c, CountKeys("s/1/in/", 10)) == 5
        for i in range(5):
            erase(c, f"s/1/in/{i}")
        assert count_keys(c, inbox) == 0
    finally:
        c.close()
