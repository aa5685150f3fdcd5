"""Group commit driven from the event loop, and the threads it leans on.

Why on the loop: Python's sqlite3 drops the GIL around every statement it
prepares and steps. A writer *thread* running a batch's statements hands the
GIL over (and back) for every statement of every write while the loop thread
is busy serving gRPC; each hand-over is a context switch. So the statements
of a batch run on the loop thread, and only the parts that *wait* go to a
thread: the COMMIT (its fsync; the loop serves meanwhile, and whatever is
written meanwhile forms the next batch) and a BEGIN IMMEDIATE that finds
another process's writer holding the lock. Per batch that is one hand-over
to the commit thread and one wake-up of the loop, whatever the batch holds.
(Committing on the loop too was measured and rejected: the loop then stalls
for every fsync, batches shrink to what one loop iteration submits, and
throughput at 64 in flight fell by half.)

What it guarantees, as the writer thread did before:
- group commit: the writes submitted within one loop iteration, or while
  the previous batch was committing, join one transaction, one COMMIT, one
  fsync; at most `MAX_BATCH` writes per transaction;
- a write is acknowledged (its future resolved) only after its COMMIT returned;
- each write that modifies with more than one statement runs in a SAVEPOINT,
  so one failing write never sinks the batch; an error that rolls back the
  whole transaction (disk full, I/O) fails every write of the batch, none of
  which was applied;
- one transaction at a time on the writer connection, begun with BEGIN
  IMMEDIATE: other processes sharing the file (`serve --workers N`) are
  serialised by SQLite's write lock, waited for in short steps off the loop.

One writer serves one event loop at a time: the first loop that writes owns
it; another loop may take it over once the owner is closed or has nothing in
flight (tests run one loop after another on one store). Writing from two
running loops at once is refused (BackendUnavailable).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from ..base import BackendUnavailable
from .statements import connect, create_schema

log = logging.getLogger(__name__)

MAX_BATCH = 512
_BUSY_SECONDS = 30.0  # how long the writer waits for another process's writer
_BUSY_STEP = 0.0002
_STOP = object()

Op = Callable[[sqlite3.Connection, Callable[[], str]], Any]


class WaitingThread:
    """One daemon thread that runs callables handed to it from an event loop
    and reports each outcome back on that loop (`done(ok, value)`). For the
    calls that may wait (an fsync, a lock held by another process) so the
    loop does not."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop,
            done: Callable[[bool, Any], None], orphaned: Callable[[], None] | None = None) -> None:
        """`orphaned` runs in the thread instead of `done` if `loop` closed meanwhile."""
        self._queue.put((fn, loop, done, orphaned))

    def stop(self) -> None:
        self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, loop, done, orphaned = item
            try:
                outcome: tuple[bool, Any] = (True, fn())
            except Exception as exc:
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(done, *outcome)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                if orphaned is not None:
                    orphaned()


def resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        if isinstance(value, sqlite3.Error):
            value = BackendUnavailable(f"sqlite: {value}")
        fut.set_exception(value)


class GroupCommit:
    """The writer connection and its batches, driven by callbacks on the
    owning event loop (no task: nothing to cancel half-way through a
    transaction)."""

    def __init__(self, path: str, synchronous: str, *, version: Callable[[], str]) -> None:
        self._conn = connect(path, synchronous)
        create_schema(self._conn)
        self._conn.execute("PRAGMA busy_timeout=0")  # it waits for the lock itself (`_wait_for_lock`)
        self._version = version
        self._thread = WaitingThread("fencepost-sqlite-commit")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bind_lock = threading.Lock()
        self._pending: list[tuple[Op, asyncio.Future[Any], bool]] = []
        self._busy = False  # a batch is scheduled or between BEGIN and its answer
        self._idle_waiters: list[asyncio.Future[None]] = []

    # -- submitting ------------------------------------------------------------
    def submit(self, op: Op, savepoint: bool) -> asyncio.Future[Any]:
        """Queue `op` for the next batch. `savepoint=False` for an op that
        modifies with at most one statement (SQLite undoes a failed statement
        by itself), which spares two statements per op."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind(loop)
        fut = loop.create_future()
        self._pending.append((op, fut, savepoint))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._start)  # the rest of this loop iteration's writes join the batch
        return fut

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._bind_lock:
            old = self._loop
            if old is not None and self._busy:
                if not old.is_closed():
                    raise BackendUnavailable("this SQLite store is writing for another event loop")
                self._abandon()
            self._loop = loop

    def _abandon(self) -> None:
        """The owning loop closed with a batch in flight: its callers are gone.
        Runs where no other code touches the connection (the owner is closed)."""
        self._pending.clear()
        self._busy = False
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    async def wait_idle(self) -> None:
        """Until every submitted write is answered (for close)."""
        if self._loop is not asyncio.get_running_loop():
            if self._loop is not None and not self._loop.is_closed() and self._busy:
                raise BackendUnavailable("this SQLite store is writing for another event loop")
            return
        while self._busy:
            waiter = self._loop.create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def close(self) -> None:
        """After `wait_idle` (or once the owning loop is closed)."""
        self._thread.stop()
        if self._busy:
            self._abandon()
        self._conn.close()

    # -- one batch: BEGIN, ops, COMMIT, answers ----------------------------------
    def _start(self) -> None:
        if not self._pending:
            self._idle()
            return
        batch = self._pending[:MAX_BATCH]
        del self._pending[:MAX_BATCH]
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                self._failed(batch, exc)
                return
            # another process's writer holds the lock: wait for it off the loop
            assert self._loop is not None
            self._thread.run(self._wait_for_lock, self._loop,
                             lambda ok, value: self._run(batch) if ok else self._failed(batch, value),
                             orphaned=self._abandon)
            return
        self._run(batch)

    def _wait_for_lock(self) -> None:
        """BEGIN IMMEDIATE, retried in short steps: SQLite's own busy handler
        backs off to sleeps of 10-25 ms, far longer than another process's
        writer holds the lock (one group commit)."""
        deadline = time.monotonic() + _BUSY_SECONDS
        while True:
            time.sleep(_BUSY_STEP)
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise

    def _run(self, batch: list[tuple[Op, asyncio.Future[Any], bool]]) -> None:
        conn = self._conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            for op, _, savepoint in batch:
                if savepoint:
                    conn.execute("SAVEPOINT op")
                try:
                    outcome: tuple[bool, Any] = (True, op(conn, self._version))
                except Exception as exc:
                    outcome = (False, exc)
                if savepoint:
                    conn.execute("RELEASE op" if outcome[0] else "ROLLBACK TO op")
                    if not outcome[0]:
                        conn.execute("RELEASE op")  # one bad op must not sink the batch
                elif not outcome[0] and not conn.in_transaction:
                    # some errors (disk full, I/O) roll the whole transaction back:
                    # nothing of this batch was applied, and the rest must not run unbatched
                    raise sqlite3.OperationalError(f"transaction rolled back: {outcome[1]}")
                outcomes.append(outcome)
        except sqlite3.Error as exc:
            self._failed(batch, exc)
            return
        assert self._loop is not None
        self._thread.run(self._commit, self._loop,
                         lambda ok, value: self._committed(batch, outcomes, ok, value), orphaned=self._abandon)

    def _committed(self, batch: list[tuple[Op, asyncio.Future[Any], bool]], outcomes: list[tuple[bool, Any]],
                   ok: bool, value: Any) -> None:
        if ok:
            self._answer(batch, outcomes)
        else:
            self._failed(batch, value)

    def _commit(self) -> None:
        self._conn.execute("COMMIT")

    def _failed(self, batch: list[tuple[Op, asyncio.Future[Any], bool]], exc: BaseException) -> None:
        log.warning("sqlite batch commit failed: %s", exc)
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        failure = BackendUnavailable(f"sqlite commit failed: {exc}")
        self._answer(batch, [(False, failure)] * len(batch))

    def _answer(self, batch: list[tuple[Op, asyncio.Future[Any], bool]], outcomes: list[tuple[bool, Any]]) -> None:
        for (_, fut, _), (ok, value) in zip(batch, outcomes):
            resolve(fut, ok, value)
        if self._pending:  # written while this batch committed: the next batch, now
            self._start()
        else:
            self._idle()

    def _idle(self) -> None:
        self._busy = False
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text
