"""The SQLite writer's group commit (storage/sqlite/writer.py): what a batch
guarantees when one of its writes fails, when the whole transaction is rolled
back, when another process holds the write lock, and when the store is used
from several event loops."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from fencepost_server.storage import BackendUnavailable, PersistenceUncertain
from fencepost_server.storage.sqlite import SqliteStorage

Op = Callable[[sqlite3.Connection, Callable[[], str]], Any]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStorage]:
    storage = SqliteStorage(tmp_path / "w.db", synchronous="NORMAL")
    try:
        yield storage
    finally:
        await storage.close()


def _submit(storage: SqliteStorage, op: Op, savepoint: bool) -> asyncio.Future[Any]:
    return storage._writer.submit(op, savepoint)


def _hold_writer(storage: SqliteStorage) -> threading.Event:
    """Keep the writer busy until the returned event is set, so every write
    submitted meanwhile lands in the next batch, together."""
    gate = threading.Event()
    _submit(storage, lambda _conn, _version: gate.wait(10), savepoint=False)
    return gate


def _put(key: str) -> Op:
    def op(conn: sqlite3.Connection, version: Callable[[], str]) -> str:
        v = version()
        conn.execute("INSERT INTO kv (key, value, version) VALUES (?, ?, ?)", (key.encode(), b"v", v))
        return v
    return op


async def test_one_failing_write_leaves_the_rest_of_its_batch_applied(store: SqliteStorage) -> None:
    def half_then_fail(conn: sqlite3.Connection, version: Callable[[], str]) -> None:
        _put("half")(conn, version)
        raise ValueError("refused half way")

    gate = _hold_writer(store)
    first = _submit(store, _put("a"), savepoint=False)
    bad = _submit(store, half_then_fail, savepoint=True)
    last = _submit(store, _put("b"), savepoint=False)
    gate.set()
    results = await asyncio.gather(first, bad, last, return_exceptions=True)

    assert isinstance(results[1], ValueError)
    assert (await store.get("a")) is not None and (await store.get("b")) is not None
    assert await store.get("half") is None  # its savepoint was rolled back


async def test_a_statement_error_without_a_savepoint_fails_only_that_write(store: SqliteStorage) -> None:
    await store.put("taken", b"1")
    gate = _hold_writer(store)
    ok_before = _submit(store, _put("c"), savepoint=False)
    clash = _submit(store, _put("taken"), savepoint=False)  # primary key clash: the statement is undone
    ok_after = _submit(store, _put("d"), savepoint=False)
    gate.set()
    results = await asyncio.gather(ok_before, clash, ok_after, return_exceptions=True)

    assert isinstance(results[1], BackendUnavailable)
    assert isinstance(results[0], str) and isinstance(results[2], str)
    assert (await store.get("c")) is not None and (await store.get("d")) is not None


async def _a_batch_around(store: SqliteStorage, bad: Op) -> None:
    """Batch `bad` between two good writes: the whole batch must fail, each
    write answered BackendUnavailable (retryable), none of it applied, and
    the writer carries on with the next batch."""
    gate = _hold_writer(store)
    batch = [
        _submit(store, _put("x"), savepoint=False),
        _submit(store, bad, savepoint=False),
        _submit(store, _put("y"), savepoint=False),
    ]
    gate.set()
    results = await asyncio.gather(*batch, return_exceptions=True)

    # nothing applied, and known not to be: not PersistenceUncertain
    assert all(isinstance(r, BackendUnavailable) and not isinstance(r, PersistenceUncertain) for r in results)
    assert await store.get("x") is None and await store.get("y") is None
    await store.put("after", b"1")
    assert (await store.get("after")) is not None


async def test_a_write_without_a_savepoint_failing_part_way_fails_the_whole_batch(store: SqliteStorage) -> None:
    """Transactions run without a savepoint (one upsert for all their puts):
    when a later statement fails, SQLite undoes that statement only, and the
    earlier one's rows must not be committed with the rest of the batch."""
    def half_then_clash(conn: sqlite3.Connection, version: Callable[[], str]) -> None:
        _put("half")(conn, version)
        _put("taken")(conn, version)  # primary key clash after a statement that changed a row

    await store.put("taken", b"1")
    await _a_batch_around(store, half_then_clash)
    assert await store.get("half") is None


async def test_a_failing_commit_answers_every_write_of_its_batch_outcome_unknown(store: SqliteStorage) -> None:
    """COMMIT itself failing (an I/O error writing or syncing the WAL) may
    leave the batch on disk for recovery to replay: each write is answered
    PersistenceUncertain, not "nothing applied", and the writer carries on.
    (An authorizer refusing the COMMIT statement stands in for the disk.)"""
    refused = []

    def refuse_commit_once(action: int, arg1: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and arg1 == "COMMIT" and not refused:
            refused.append(arg1)
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def install(conn: sqlite3.Connection, _version: Callable[[], str]) -> None:
        conn.set_authorizer(refuse_commit_once)

    gate = _hold_writer(store)
    batch = [_submit(store, _put("p"), savepoint=False), _submit(store, install, savepoint=False),
             _submit(store, _put("q"), savepoint=False)]
    gate.set()
    results = await asyncio.gather(*batch, return_exceptions=True)
    assert refused and all(isinstance(r, PersistenceUncertain) for r in results), results
    store._writer._conn.set_authorizer(None)  # the writer's thread is idle: no statement runs meanwhile
    await store.put("after", b"1")
    assert await store.get("after") is not None


async def test_a_transaction_applies_all_its_writes_or_none(store: SqliteStorage) -> None:
    """A transaction's puts go in one statement, its deletes after them: a failing delete undoes the puts."""
    from fencepost_server.storage import Delete, Put

    await store.put("old", b"1")
    res = await store.transact((), [Put("new1", b"a"), Put("new2", b"b"), Delete("old")])
    assert res.applied and res.versions[2] is None
    assert [await store.get(k) is not None for k in ("new1", "new2", "old")] == [True, True, False]

    store._writer._conn.execute("CREATE TEMP TRIGGER no_deletes BEFORE DELETE ON main.kv BEGIN "
                                "SELECT RAISE(ABORT, 'deletes refused'); END")
    with pytest.raises(BackendUnavailable):
        await store.transact((), [Put("new3", b"c"), Delete("new1")])
    store._writer._conn.execute("DROP TRIGGER no_deletes")
    assert await store.get("new3") is None and await store.get("new1") is not None


async def test_a_rolled_back_transaction_fails_the_whole_batch(store: SqliteStorage) -> None:
    def lose_the_transaction(conn: sqlite3.Connection, _version: Callable[[], str]) -> None:
        conn.execute("ROLLBACK")  # as SQLite does on disk full or an I/O error
        raise sqlite3.OperationalError("disk I/O error")

    await _a_batch_around(store, lose_the_transaction)


async def test_writes_wait_for_another_writer_without_blocking_the_loop(store: SqliteStorage) -> None:
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # as another `--workers` process's writer would
        pending = asyncio.ensure_future(store.put("k", b"v"))
        for _ in range(20):  # the loop keeps serving reads meanwhile
            await asyncio.sleep(0.005)
            assert await store.get("other") is None
        assert not pending.done()
        other.execute("INSERT INTO kv (key, value, version) VALUES (?, ?, ?)", (b"other", b"o", "v0"))
        other.execute("COMMIT")
        version = await pending
    finally:
        other.close()
    item = await store.get("k")
    assert item is not None and item.version == version
    assert (await store.get("other")) is not None


async def test_close_answers_every_write_submitted_before_it(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "c.db", synchronous="NORMAL")
    writes = [asyncio.ensure_future(storage.put(f"k{i}", b"v")) for i in range(50)]
    await asyncio.sleep(0)  # every put has been submitted
    await storage.close()
    versions = await asyncio.gather(*writes)
    reopened = SqliteStorage(tmp_path / "c.db", synchronous="NORMAL")
    try:
        for i, version in enumerate(versions):
            item = await reopened.get(f"k{i}")
            assert item is not None and item.version == version
    finally:
        await reopened.close()


def test_one_event_loop_after_another_may_write(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "l.db", synchronous="NORMAL")
    first = asyncio.run(storage.put("a", b"1"))
    second = asyncio.run(storage.put("b", b"2"))

    async def read_and_close() -> tuple[Any, Any]:
        try:
            return await storage.get("a"), await storage.get("b")
        finally:
            await storage.close()

    a, b = asyncio.run(read_and_close())
    assert a.version == first and b.version == second


def test_two_running_loops_write_through_one_store_at_once(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "t.db", synchronous="NORMAL")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def writes(prefix: str) -> list[str]:
        return await asyncio.gather(*(storage.put(f"{prefix}{i}", b"v") for i in range(200)))

    try:
        elsewhere = asyncio.run_coroutine_threadsafe(writes("a"), loop)
        here = asyncio.run(writes("b"))
        there = elsewhere.result(10)

        async def check_and_close() -> None:
            try:
                for prefix, versions in (("a", there), ("b", here)):
                    for i, version in enumerate(versions):
                        item = await storage.get(f"{prefix}{i}")
                        assert item is not None and item.version == version
            finally:
                await storage.close()

        asyncio.run(check_and_close())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


async def _contend(store: SqliteStorage) -> None:
    """Make the writer wait for another process's writer once."""
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        pending = asyncio.ensure_future(_submit(store, _put("contended"), savepoint=False))
        await asyncio.sleep(0.02)
        other.execute("COMMIT")
        await pending
    finally:
        other.close()


@pytest.mark.parametrize("case", ["busy", "contended", "waiting", "quiet"])
async def test_the_commit_delay_gathers_writes_only_under_a_high_write_rate(
    store: SqliteStorage, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """At GATHER_AT_RATE (or, after waiting for another process's writer, at
    GATHER_AT_RATE_CONTENDED; or while GATHER_AT_WAITING writes on average
    were queued when it woke) the writer waits while writes keep arriving and
    commits them as one batch; otherwise a write is committed at once. The
    writer's sleep is replaced by one that makes a write arrive (in the real
    writer it is the event loop submitting meanwhile), so nothing here
    depends on timing."""
    from fencepost_server.storage.sqlite import writer as writer_module

    if case == "contended":
        await _contend(store)
    busy = case != "quiet"
    worker = store._writer
    loop = asyncio.get_running_loop()
    late: asyncio.Future[Any] = loop.create_future()
    sleeps: list[float] = []
    batches: list[int] = []

    def arriving_sleep(seconds: float) -> None:
        if not sleeps:  # a write arrives during the first step, none during the second
            worker._queue.put((_put("late"), loop, late, False))
        sleeps.append(seconds)

    real_commit = worker._commit

    def counting_commit(batch: list[Any], wait: bool) -> list[tuple[bool, Any]] | None:
        batches.append(len(batch))
        return real_commit(batch, wait)

    monkeypatch.setattr(writer_module.time, "sleep", arriving_sleep)
    monkeypatch.setattr(worker, "_commit", counting_commit)
    worker.arrivals.rate = {"busy": writer_module.GATHER_AT_RATE, "contended": writer_module.GATHER_AT_RATE_CONTENDED,
                            "waiting": 0.0, "quiet": writer_module.GATHER_AT_RATE_CONTENDED}[case]
    # this batch's lone write pulls the average down by an eighth of the gap
    worker._waiting = 2 * writer_module.GATHER_AT_WAITING if case == "waiting" else 1.0
    monkeypatch.setattr(writer_module, "_RATE_WINDOW", 3600.0)  # the rate set here stands for the test

    await _submit(store, _put("first"), savepoint=False)
    if busy:
        await asyncio.wait_for(late, 10)  # it arrives only while the writer waits
        assert batches == [2]  # one transaction, one fsync for both
        assert len(sleeps) == 2  # the step that brought no write ended the wait
    else:
        assert batches == [1] and sleeps == []  # committed at once, no wait
        late.cancel()
    assert (await store.get("first")) is not None


def _where_it_ran(threads: list[str]) -> Op:
    def op(conn: sqlite3.Connection, version: Callable[[], str]) -> str:
        threads.append(threading.current_thread().name)
        return _put(f"k{len(threads)}")(conn, version)
    return op


async def test_a_lone_write_on_a_quiet_store_commits_on_the_callers_thread(
    store: SqliteStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below LONE_WRITE_RATE calls a second a write the writer is idle for
    commits on the event loop's thread (no hand-off); at or above it, or
    while the writer is busy, it goes to the writer thread."""
    from fencepost_server.storage.sqlite import writer as writer_module

    monkeypatch.setattr(writer_module, "_RATE_WINDOW", 3600.0)  # the rates set here stand for the test
    here = threading.current_thread().name
    threads: list[str] = []

    store._load.meter.rate = writer_module.LONE_WRITE_RATE / 2
    version = await store._write_op(_where_it_ran(threads))
    assert threads == [here]
    assert (item := await store.get("k1")) is not None and item.version == version  # committed, readable

    gate = _hold_writer(store)  # a batch is running: the write queues behind it
    queued = asyncio.ensure_future(store._write_op(_where_it_ran(threads)))
    await asyncio.sleep(0.01)
    assert len(threads) == 1 and not queued.done()
    gate.set()
    await queued
    assert threads[1] == "fencepost-sqlite-writer"

    store._load.meter.rate = writer_module.LONE_WRITE_RATE  # a busy store: every write goes to the thread
    await store._write_op(_where_it_ran(threads))
    assert threads[2] == "fencepost-sqlite-writer"

    monkeypatch.setattr(writer_module, "QUIET_SECONDS", 3600.0)
    store._load.meter.rate = writer_module.LONE_WRITE_RATE / 2  # one quiet window after a busy one is not quiet yet
    await store._write_op(_where_it_ran(threads))
    assert threads[3] == "fencepost-sqlite-writer"


async def test_a_lone_write_fails_as_a_queued_one_would(store: SqliteStorage) -> None:
    """The same answers, committed in place: an SQLite error is the backend's
    (and undone), any other error the op's own."""
    await store.put("taken", b"1")

    def refused(conn: sqlite3.Connection, version: Callable[[], str]) -> None:
        _put("half")(conn, version)
        raise ValueError("refused half way")

    with pytest.raises(BackendUnavailable):
        await store._write_op(_put("taken"))
    with pytest.raises(ValueError):
        await store._write_op(refused, savepoint=True)
    assert await store.get("half") is None  # its savepoint was rolled back
    assert (await store.put("after", b"v")) and (await store.get("after")) is not None


async def test_lone_writes_pause_once_they_hold_their_callers_too_long(
    store: SqliteStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone write holds its caller for its COMMIT; once lone writes take
    more than LONE_WRITE_SHARE of the time (a slow disk), writes go to the
    thread for LONE_WRITE_PAUSE: a caller blocked on every fsync could
    otherwise never reach the rate that hands writes to the thread."""
    from fencepost_server.storage.sqlite import writer as writer_module

    monkeypatch.setattr(writer_module, "_RATE_WINDOW", 3600.0)  # a quiet store throughout
    monkeypatch.setattr(writer_module, "LONE_WRITE_PAUSE", 3600.0)
    store._load.meter.rate = 0.0
    here = threading.current_thread().name
    threads: list[str] = []

    def slow_write(conn: sqlite3.Connection, version: Callable[[], str]) -> str:
        threads.append(threading.current_thread().name)
        time.sleep(5 * writer_module.LONE_WRITE_WINDOW)  # stands for a slow fsync: longer than a window
        return _put("slow")(conn, version)

    await store._write_op(slow_write)
    await store._write_op(_where_it_ran(threads))
    assert threads == [here, "fencepost-sqlite-writer"]


async def test_the_writer_tracks_how_many_writes_wait_for_it(store: SqliteStorage) -> None:
    """Writes queued while a batch commits are counted when the thread wakes
    for the next one (the commit delay's GATHER_AT_WAITING)."""
    worker = store._writer
    for round_ in range(12):
        gate = _hold_writer(store)
        pending = [_submit(store, _put(f"w{round_}-{i}"), savepoint=False) for i in range(6)]
        gate.set()
        await asyncio.gather(*pending)
    assert worker._waiting > 3  # 6 at every wake but the held one's, on a moving average


async def test_a_lone_writer_is_never_counted_as_waiting(
    store: SqliteStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fencepost_server.storage.sqlite import writer as writer_module

    monkeypatch.setattr(writer_module, "_RATE_WINDOW", 3600.0)
    store._load.meter.rate = writer_module.LONE_WRITE_RATE  # every write to the thread, one at a time
    threads: list[str] = []
    for _ in range(20):
        await store._write_op(_where_it_ran(threads))
    assert set(threads) == {"fencepost-sqlite-writer"}
    assert 0 < store._writer._waiting <= 1
