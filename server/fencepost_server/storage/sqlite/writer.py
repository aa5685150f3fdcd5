"""The SQLite writer: one connection, one thread, group commit.

Every write is queued to the writer thread; whatever is queued when it wakes
is one batch: BEGIN IMMEDIATE, each write's statements (a write that needs
more than one statement in a SAVEPOINT of its own), COMMIT, then one wake-up
per event loop answers the whole batch.

What it guarantees:
- group commit: one transaction, one COMMIT, one fsync per batch (at most
  `MAX_BATCH` writes); under a high write rate the writer first lets writes
  gather for up to 2 ms (a commit delay, `_gather`), which at 64 writes in
  flight turns batches of ~3 into batches of ~15 and cut the server's CPU
  per put by ~30% in the measurements of docs/performance.md;
- a write is acknowledged (its future resolved) only after its COMMIT returned;
- one failing write never sinks its batch (its SAVEPOINT, or SQLite's own
  statement rollback, undoes it); an error that rolls back the whole
  transaction (disk full, I/O) fails every write of the batch, none of which
  was applied;
- other processes sharing the file (`serve --workers N`) are serialised by
  SQLite's write lock, waited for in short steps (`_begin`);
- any number of event loops may write through one writer at once (each is
  answered on its own loop).

Why a thread and not the event loop: running a batch's statements on the
loop thread and handing only the COMMIT to a thread was built and measured
(docs/performance.md, "The SQLite write path"): it moved the statements' CPU
from this thread to the loop thread without lowering the total, and it gives
up what a thread offers on a machine with spare cores — sqlite3 releases the
GIL while SQLite works, so the writer's SQL overlaps the loop's work.
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
# Commit delay (as PostgreSQL's commit_delay): once writes arrive at
# GATHER_AT_RATE per second or more, the writer lets them gather while they
# keep coming (steps of _GATHER_STEP, at most GATHER_SECONDS) before it
# commits, so one fsync acknowledges a dozen writes instead of two or three;
# below that rate (a lone or a few writers) it never waits.
GATHER_SECONDS = 0.002
GATHER_AT_RATE = 4000.0
_GATHER_STEP = 0.0005
_RATE_WINDOW = 0.02  # seconds over which the arrival rate is measured

Op = Callable[..., Any]
Queued = tuple[Op, asyncio.AbstractEventLoop, "asyncio.Future[Any]", bool]


class Worker:
    """One connection, one thread, fed by a queue. Whatever is queued when the
    thread wakes is handled as one batch and answered with one wake-up per
    event loop. The writer (`writer=True`) runs each batch as one group
    commit; a reader runs each op on its connection in turn (`op(conn)`)."""

    def __init__(self, path: str, synchronous: str, *, writer: bool, version: Callable[[], str] | None = None) -> None:
        self._conn = connect(path, synchronous)
        self._writer = writer
        self._version = version
        if writer:
            create_schema(self._conn)
            self._conn.execute("PRAGMA busy_timeout=0")  # from now on it waits for the lock itself (`_begin`)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._rate = 0.0  # writes per second submitted, measured over _RATE_WINDOW
        self._since = time.monotonic()
        self._counted = 0
        name = "fencepost-sqlite-writer" if writer else "fencepost-sqlite-reader"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, op: Op, savepoint: bool = True) -> asyncio.Future[Any]:
        """Queue `op`. `savepoint=False` for an op that modifies at most one
        statement's worth (SQLite undoes a failed statement by itself), which
        spares two statements per op in the batch."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.put((op, loop, fut, savepoint))
        return fut

    def stop(self) -> None:
        """Answers everything queued before it, then ends the thread."""
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

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            if self._writer and self._arrival_rate() >= GATHER_AT_RATE:
                self._gather()
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._counted += len(batch)
            outcomes = self._commit(batch) if self._writer else [_call(op, (self._conn,)) for op, *_ in batch]
            _answer(batch, outcomes)
            if stop:
                return

    def _arrival_rate(self) -> float:
        """Writes per second over the last full window (an idle spell counts:
        the first write after one never waits)."""
        elapsed = time.monotonic() - self._since
        if elapsed >= _RATE_WINDOW:
            self._rate = self._counted / elapsed
            self._since += elapsed
            self._counted = 0
        return self._rate

    def _gather(self) -> None:
        """Let writes gather in the queue while they keep arriving, at most
        GATHER_SECONDS: stops after a step that brought none."""
        waited, queued = 0.0, self._queue.qsize()
        while waited < GATHER_SECONDS:
            time.sleep(_GATHER_STEP)
            waited += _GATHER_STEP
            now_queued = self._queue.qsize()
            if now_queued == queued:
                return
            queued = now_queued

    def _commit(self, batch: list[Queued]) -> list[tuple[bool, Any]]:
        conn = self._conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            self._begin()
            for op, _, _, savepoint in batch:
                if savepoint:
                    conn.execute("SAVEPOINT op")
                outcome = _call(op, (conn, self._version))
                if savepoint:
                    conn.execute("RELEASE op" if outcome[0] else "ROLLBACK TO op")
                    if not outcome[0]:
                        conn.execute("RELEASE op")  # one bad op must not sink the batch
                elif not outcome[0] and not conn.in_transaction:
                    # some errors (disk full, I/O) roll the whole transaction back:
                    # nothing of this batch was applied, and the rest must not run unbatched
                    raise sqlite3.OperationalError(f"transaction rolled back: {outcome[1]}")
                outcomes.append(outcome)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.warning("sqlite batch commit failed: %s", exc)
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            outcomes = [(False, BackendUnavailable(f"sqlite commit failed: {exc}"))] * len(batch)
        return outcomes


def _call(op: Op, args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, op(*args)
    except Exception as exc:
        return False, exc


def _answer(batch: list[Queued], outcomes: list[tuple[bool, Any]]) -> None:
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
