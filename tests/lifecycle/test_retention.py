"""Retention with short settings, on every backend: on the next pass idle
sessions, old archives and expired markers disappear, and nothing else does."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from fencepost import errors, reasons

from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.journal import Journal, JournalConfig
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.retention import Retention, RetentionConfig
from fencepost_server.storage import Storage
from tests.domain.test_journal import extra, fields
from tests.domain.test_ledger import FakeClock
from tests.conftest import running
from tests.raw_store import data_only, raw_items, raw_keys_naming

T = "tenant"
HOUR = 3600.0


async def _rotate(journal: Journal, agent: str, tag: str) -> None:
    for i in range(12):
        await journal.append(T, agent, fields(i), extra(f"{tag}{i}"))
    await journal.flush(T, agent)


async def test_one_pass_sweeps_exactly_what_expired(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    journal = Journal(storage, Limits(), JournalConfig(max_journal_bytes=600), clock=clock)

    async def session(agent: str, key: str, records: int = 2, commit_id: str = "") -> str:
        sid = (await ledger.open(T, agent, key))[0].session_id
        lease = await ledger.acquire(T, sid, "h", ttl=5)
        await ledger.commit(T, sid, lease.generation, 0, [b"r"] * records, commit_id=commit_id or f"{key}-c")
        await ledger.release(T, sid, lease.generation)
        return sid

    # three hours ago: idle sessions, old archives, old commit markers
    idle = await session("a", "idle")
    parent = await session("a", "parent")
    fork = await ledger.fork(T, parent, 1, "fork")
    pending = await session("b", "pending")
    await ledger.deliver(T, session_id=pending, payload=b"undelivered")
    held = await session("b", "held")
    await _rotate(journal, "a", "old")
    await _rotate(journal, "a", "old2")
    clock.now += 3 * HOUR
    # now: fresh sessions, a fresh archive, a fresh marker on an old-but-active session
    fresh = await session("a", "fresh")
    lease = await ledger.acquire(T, held, "h", ttl=60)
    await ledger.commit(T, fork.session_id, (await ledger.acquire(T, fork.session_id, "f", ttl=5)).generation,
                        1, [b"child"], commit_id="fork-new")
    await _rotate(journal, "a", "new")
    archives_before = [a.name for a in (await journal.list_archives(T, "a")).archives]
    before = data_only(raw_items(storage))  # (a sweep may add the directory row of #/ledger/erase/)

    retention = Retention(storage, ledger, journal, RetentionConfig(
        idle_session_seconds=2 * HOUR, archive_seconds=2 * HOUR, commit_marker_seconds=2 * HOUR,
    ), clock=clock)
    counts = await retention.sweep_pass()

    after = data_only(raw_items(storage))
    gone = set(before) - set(after)
    assert set(after) <= set(before) and all(after[k] == before[k] for k in after), "a kept item changed"
    assert counts.sessions_erased == 1 and not [k for k in after if idle in k]
    # waiting: a parent with a live fork, a session with an event pending, a held lease
    assert counts.sessions_waiting == 3
    for kept in (parent, fork.session_id, pending, held, fresh):
        assert (await ledger.get(T, kept)).session_id == kept
    old_markers = {k for k in gone if "/cm/" in k and idle not in k}
    assert len(old_markers) == 3  # parent, pending, held (3 h old); the idle one went with its session
    assert [k for k in after if "/cm/" in k] and all(
        fresh in k or fork.session_id in k for k in after if "/cm/" in k
    )
    archives_after = [a.name for a in (await journal.list_archives(T, "a")).archives]
    assert counts.archives_erased == len(archives_before) - len(archives_after) >= 2
    assert len(archives_after) >= 1
    # nothing but those: every removed key is an idle session's, an old marker, or an old archive's
    of_idle = {k for k in gone if idle in k or idle.encode() in before[k]}
    unexplained = [k for k in gone if k not in of_idle and k not in old_markers and "/journal/" not in k]
    assert unexplained == []
    assert all("/archive/" in k or "/seg/" in k for k in gone if "/journal/" in k)
    assert (await retention.sweep_pass()).sessions_erased == 0  # the next pass finds nothing new
    del lease


async def test_off_by_default(storage: Storage) -> None:
    ledger = Ledger(storage)
    journal = Journal(storage, Limits())
    await ledger.open(T, "a", "k")
    before = raw_items(storage)
    counts = await Retention(storage, ledger, journal, RetentionConfig()).sweep_pass()
    assert counts.agents_visited == 0 and raw_items(storage) == before


async def test_the_server_sweeps_idle_sessions_on_its_own(storage: Storage, caplog: pytest.LogCaptureFixture) -> None:
    """Through the real server, real clock: the retention loop erases the idle
    session on a pass of its own, leaves the fresh one, and says so in the log
    (a pass erased silently: only a metric told the operator)."""
    caplog.set_level(logging.INFO, logger="fencepost.retention")
    async with running(storage, retain_idle_sessions_seconds=2.0, retention_seconds=0.2) as srv:
        async with srv.client(timeout=10.0) as client:
            idle = (await client.open_session("agent", "idle")).session_id
            await asyncio.sleep(2.5)
            fresh = (await client.open_session("agent", "fresh")).session_id
            deadline = time.monotonic() + 60
            while raw_keys_naming(storage, idle):
                assert time.monotonic() < deadline, "the idle session was never swept"
                await asyncio.sleep(0.2)
            with pytest.raises(errors.SessionNotFound):
                await client.get_session(idle)
            assert (await client.get_session(fresh)).session_id == fresh
    assert any(r.getMessage().startswith("retention pass: 1 idle sessions erased") for r in caplog.records)


async def test_a_session_taken_up_during_the_idle_check_is_not_erased(storage: Storage) -> None:
    """A holder that acquires and commits between retention's idle checks and
    its delete keeps its session: the delete conditions on what was checked."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    journal = Journal(storage, Limits())
    sid = (await ledger.open(T, "a", "revived"))[0].session_id
    clock.now += 3 * HOUR
    real_settled = ledger.settled_activity
    revived: list[int] = []

    async def revived_meanwhile(sk):  # type: ignore[no-untyped-def]
        idle = await real_settled(sk)  # what retention decides on: idle
        if not revived:
            lease = await ledger.acquire(T, sid, "h", ttl=60)
            revived.append((await ledger.commit(T, sid, lease.generation, 0, [b"fresh work"])).seq)
        return idle

    ledger.settled_activity = revived_meanwhile  # type: ignore[method-assign]
    retention = Retention(storage, ledger, journal, RetentionConfig(idle_session_seconds=2 * HOUR), clock=clock)
    counts = await retention.sweep_pass()
    assert revived and counts.sessions_erased == 0 and counts.sessions_waiting == 1
    assert (await ledger.get(T, sid)).seq == revived[0]


async def test_an_archive_read_while_retention_deletes_it_is_not_found(storage: Storage) -> None:
    """ReadArchive reads the archive's marker, then its segments: retention
    deleting it in between makes it ARCHIVE_NOT_FOUND, never a part of it."""
    clock = FakeClock()
    journal = Journal(storage, Limits(), JournalConfig(max_journal_bytes=600), clock=clock)
    await _rotate(journal, "a", "old")
    await _rotate(journal, "a", "old2")
    name = (await journal.list_archives(T, "a")).archives[0].name
    real_segments = journal._segments

    async def expired_meanwhile(keys, gen):  # type: ignore[no-untyped-def]
        assert await journal.expire_archives(T, "a", int((clock.now + 1) * 1000)) >= 1
        return await real_segments(keys, gen)

    journal._segments = expired_meanwhile  # type: ignore[method-assign]
    with pytest.raises(DomainError) as exc:
        await journal.read_archive(T, "a", name)
    assert exc.value.reason == reasons.ARCHIVE_NOT_FOUND
