"""Random operation sequences give the same results on sqlite and on DynamoDB
(the local emulator) as on the memory reference (hypothesis). Versions are
compared by identity pattern: each distinct token is renamed by first
appearance."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencepost_server.storage import Check, Delete, Expect, Put, Storage
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.dynamo_support import new_dynamo_storage

#: `make reliability` (FENCEPOST_RELIABILITY=long) draws many more sequences on DynamoDB
DYNAMO_EXAMPLES = 300 if os.environ.get("FENCEPOST_RELIABILITY", "short") == "long" else 5

KEYS = st.sampled_from(["a", "b", "ab", "é", "z/1"])
VALUES = st.binary(max_size=4)
VERSION_REF = st.integers(min_value=0, max_value=6)  # index into versions seen so far

OPS = st.one_of(
    st.tuples(st.just("put"), KEYS, VALUES),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("put_if_absent"), KEYS, VALUES),
    st.tuples(st.just("put_if_version"), KEYS, VALUES, VERSION_REF),
    st.tuples(st.just("delete_if_version"), KEYS, VERSION_REF),
    st.tuples(st.just("list"), st.sampled_from(["", "a", "z/"]), st.integers(1, 3)),
    st.tuples(st.just("txn"), KEYS, KEYS, st.booleans(), VALUES),
)

#: keys where DynamoDB's layout has edges: a key ending at its partition head
#: ("a/", stored under a NUL sort key), partitions of their own per pattern
#: (`{tenant}/kv/`, `{tenant}/sys/{subsystem}/`, `#/{index}/{shard}/`), the
#: highest code points, a key that is a prefix of its partition's name
EDGE_KEYS = st.sampled_from([
    "a", "a/", "a/b", "a/\U0010ffff", "ab", "t/kv/x", "t/kv/x/y", "t/kv/\U0010ffff", "t/kv", "t/sys/j/1",
    "t/sys/j", "#/p/0/s", "#/p/1/s", "\U0010ffff", "\U0010ffff/", "é",
])
EDGE_PREFIXES = st.sampled_from(["", "a", "a/", "t/", "t/kv/", "t/kv/x", "t/sys/", "#/", "#/p/", "\U0010ffff", "é"])
EDGE_OPS = st.one_of(
    st.tuples(st.just("put"), EDGE_KEYS, VALUES),
    st.tuples(st.just("get"), EDGE_KEYS),
    st.tuples(st.just("delete"), EDGE_KEYS),
    st.tuples(st.just("put_if_absent"), EDGE_KEYS, VALUES),
    st.tuples(st.just("put_if_version"), EDGE_KEYS, VALUES, VERSION_REF),
    st.tuples(st.just("delete_if_version"), EDGE_KEYS, VERSION_REF),
    st.tuples(st.just("list"), EDGE_PREFIXES, st.integers(1, 3)),
    st.tuples(st.just("list_after"), EDGE_PREFIXES, EDGE_KEYS, st.integers(1, 3)),
    st.tuples(st.just("txn"), EDGE_KEYS, EDGE_KEYS, st.booleans(), VALUES),
)


async def run_sequence(storage: Storage, ops: list[tuple[Any, ...]]) -> list[Any]:
    seen: list[str] = []
    names: dict[str, int] = {}

    def name(v: str | None) -> int | None:
        if v is None:
            return None
        if v not in names:
            names[v] = len(names)
            seen.append(v)
        return names[v]

    def ref(i: int) -> str:
        return seen[i] if i < len(seen) else "never-issued"

    out: list[Any] = []
    for op in ops:
        kind = op[0]
        if kind == "put":
            out.append(name(await storage.put(op[1], op[2])))
        elif kind == "get":
            item = await storage.get(op[1])
            out.append(None if item is None else (item.value, name(item.version)))
        elif kind == "delete":
            out.append(await storage.delete(op[1]))
        elif kind == "put_if_absent":
            r = await storage.put_if_absent(op[1], op[2])
            out.append((r.applied, name(r.version)))
        elif kind == "put_if_version":
            r = await storage.put_if_version(op[1], op[2], ref(op[3]))
            out.append((r.applied, name(r.version)))
        elif kind == "delete_if_version":
            r = await storage.delete_if_version(op[1], ref(op[2]))
            out.append((r.applied, name(r.version)))
        elif kind == "list":
            items = await storage.list(op[1], None, op[2])
            out.append([(i.key, i.value, name(i.version)) for i in items])
        elif kind == "list_after":
            items = await storage.list(op[1], op[2], op[3])
            out.append([(i.key, i.value, name(i.version)) for i in items])
            out.append(await storage.list_keys(op[1], op[2], op[3]))
        elif kind == "txn":
            _, guard, target, want, value = op
            if guard == target:
                res = await storage.transact([], [Put(target, value, Expect(exists=want))])
            else:
                res = await storage.transact([Check(guard, Expect(exists=want))], [Put(target, value), ])
            out.append((res.applied, res.failed, tuple(name(v) for v in res.versions)))
            if res.applied and guard != target and not want:
                out.append(await storage.transact([], [Delete(target, Expect(exists=True))]))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=25))
def test_sqlite_matches_memory_reference(ops: list[tuple[Any, ...]]) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        memory = MemoryStorage()
        with tempfile.TemporaryDirectory() as tmp:
            sqlite = SqliteStorage(Path(tmp) / f"{uuid.uuid4().hex}.db", synchronous="OFF")
            try:
                return await run_sequence(memory, ops), await run_sequence(sqlite, ops)
            finally:
                await sqlite.close()

    expected, actual = asyncio.run(both())
    assert actual == expected


@pytest.mark.backend("dynamodb")
@settings(max_examples=DYNAMO_EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EDGE_OPS, min_size=15, max_size=30))
def test_dynamodb_matches_memory_reference(ops: list[tuple[Any, ...]]) -> None:
    """Kept small in `make test` (the emulator serves a few hundred requests
    a second): about 100 operations over the keys where the table layout has
    edges, a few seconds."""
    async def both() -> tuple[list[Any], list[Any]]:
        dynamo = await new_dynamo_storage()
        try:
            return await run_sequence(MemoryStorage(), ops), await run_sequence(dynamo, ops)
        finally:
            await dynamo.close()

    expected, actual = asyncio.run(both())
    assert actual == expected
