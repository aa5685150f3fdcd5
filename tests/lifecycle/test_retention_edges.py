"""Retention at its edges: a tree of idle forks goes leaves first and leaves
nothing, an idle fork of an active parent goes alone, memory (pins included),
KV and evals are never retention's to remove (every backend), and idle
sessions that must wait never hide an erasable one (embedded backends)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fencepost_server.domain.journal import Journal
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.retention import Retention, RetentionConfig
from fencepost_server.storage import Storage
from tests.conftest import BACKENDS, running
from tests.domain.test_ledger import FakeClock
from tests.raw_store import data_only, raw_items, raw_keys_naming

T = "tenant"
HOUR = 3600.0


async def _session(ledger: Ledger, key: str, records: int = 2) -> str:
    sid = (await ledger.open(T, "a", key))[0].session_id
    lease = await ledger.acquire(T, sid, "h", ttl=5)
    await ledger.commit(T, sid, lease.generation, 0, [b"r"] * records, commit_id=f"{key}-c")
    await ledger.release(T, sid, lease.generation)
    return sid


async def test_an_idle_tree_goes_leaves_first_and_leaves_nothing(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    root = await _session(ledger, "root")
    child = (await ledger.fork(T, root, 1, "child")).session_id
    grandchild = (await ledger.fork(T, child, 1, "grandchild")).session_id
    kept = await _session(ledger, "kept")
    clock.now += 3 * HOUR
    lease = await ledger.acquire(T, kept, "h", ttl=5)
    await ledger.commit(T, kept, lease.generation, 2, [b"fresh"])
    before = {k: v for k, v in data_only(raw_items(storage)).items() if kept in k}
    retention = Retention(storage, ledger, Journal(storage, Limits()),
                          RetentionConfig(idle_session_seconds=2 * HOUR), clock=clock)
    erased = 0
    for _ in range(4):  # a parent waits for its forks: one level a pass at worst
        erased += (await retention.sweep_pass()).sessions_erased
    assert erased == 3
    assert raw_keys_naming(storage, root, child, grandchild) == []
    assert {k: v for k, v in data_only(raw_items(storage)).items() if kept in k} == before


async def test_an_idle_fork_of_an_active_parent_goes_alone(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    parent = await _session(ledger, "parent", records=3)
    fork = (await ledger.fork(T, parent, 2, "fork")).session_id
    clock.now += 3 * HOUR
    lease = await ledger.acquire(T, parent, "h", ttl=5)
    await ledger.commit(T, parent, lease.generation, 3, [b"fresh"])
    await ledger.release(T, parent, lease.generation)
    retention = Retention(storage, ledger, Journal(storage, Limits()),
                          RetentionConfig(idle_session_seconds=2 * HOUR), clock=clock)
    counts = await retention.sweep_pass()
    assert counts.sessions_erased == 1 and counts.sessions_waiting == 0
    assert raw_keys_naming(storage, fork) == []
    assert (await ledger.get(T, parent)).seq == 4


async def test_memory_kv_and_evals_are_not_retentions_to_remove(storage: Storage) -> None:
    """All three windows set and past, through the server: the agent's memory
    (a pinned entry), KV and eval items are untouched (no window covers them)."""
    async with running(storage, retain_idle_sessions_seconds=1.0, retain_journal_archives_seconds=1.0,
                       retain_commit_markers_seconds=1.0, retention_seconds=0.2) as srv:
        async with srv.client(timeout=10.0) as c:
            entry = await c.memory_append("a", "a pinned fact", about=["Core"])
            assert (await c.memory_pin("a", entry.id)).pinned
            await c.put("plain", b"v")
            await c.put_eval_run("a", "run-1", {"score": 1})
            before = data_only(raw_items(storage))
            await asyncio.sleep(3.0)  # several passes, every window past
            assert data_only(raw_items(storage)) == before
            assert [p.id for p in (await c.memory_pinned("a")).entries] == [entry.id]


@pytest.fixture(params=["memory", "sqlite"])
async def embedded(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    """The embedded backends only: the test below needs over 1,000 sessions,
    about twenty minutes on the DynamoDB emulator (the code under test is the
    same on every backend)."""
    backend = await BACKENDS[request.param](tmp_path)
    try:
        yield backend
    finally:
        await backend.close()


async def test_sessions_that_wait_do_not_hold_back_older_idle_ones(embedded: Storage) -> None:
    """More idle sessions that must wait (events pending) than one pass looks
    at per agent (1000), all of them newer than an idle one that may go: that
    one is still erased (on a later pass at worst)."""
    storage = embedded
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    old = await _session(ledger, "old")
    await ledger.list_sessions(T, "a")  # the agent's listing index is in use (as once anyone lists)
    clock.now += 60
    for i in range(1001):
        sid = (await ledger.open(T, "a", f"w{i}"))[0].session_id
        await ledger.deliver(T, session_id=sid, payload=b"undelivered")
    clock.now += 3 * HOUR
    retention = Retention(storage, ledger, Journal(storage, Limits()),
                          RetentionConfig(idle_session_seconds=2 * HOUR), clock=clock)
    erased = 0
    for _ in range(4):
        erased += (await retention.sweep_pass()).sessions_erased
    assert erased == 1 and raw_keys_naming(storage, old) == []
