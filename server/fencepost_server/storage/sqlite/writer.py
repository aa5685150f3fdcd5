"""The SQLite writer: one connection, one thread, group commit.

Every write is queued to the writer thread; whatever is queued when it wakes
is one batch: BEGIN IMMEDIATE, each write's statements (some in a SAVEPOINT
of their own), COMMIT, then one wake-up per event loop answers the whole
batch.

What it guarantees:
- group commit: one transaction, one COMMIT, one fsync per batch (at most
  `MAX_BATCH` writes); under a high write rate (a lower one while other
  processes' writers contend for the lock), or while writes queue up for
  the writer faster than it commits them, the writer first lets writes
  gather for up to 2 ms (a commit delay, `_gather`), which at 64 writes in
  flight turns batches of ~3 into batches of ~15 and cut the server's CPU
  per put by ~30% in the measurements of docs/performance.md;
- a write is acknowledged (its future resolved) only after its COMMIT returned;
- a write that fails before it changed anything never sinks its batch
  (SQLite undoes the failing statement by itself), nor does one in a
  SAVEPOINT (undone to it); a write without one that fails after one of its
  statements changed rows (`total_changes` moved: transactions write with
  one upsert for all their puts, no savepoint) fails every write of the batch, as
  does an error that rolls back the whole transaction (disk full, I/O):
  none of them applied, all answered BACKEND_UNAVAILABLE;
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

Except on a quiet server: a write that finds the writer idle (nothing
queued, no batch running) while the store serves fewer than
`LONE_WRITE_RATE` calls a second commits at once on the caller's thread
(`commit_here`). Handing it to the thread and the answer back costs two
thread wake-ups, ~0.1 ms of a ~0.9 ms put at 1 in flight; at that rate the
event loop has nothing better to do while the COMMIT waits for the disk.
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

from ..base import BackendUnavailable, PersistenceUncertain
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
# It also applies, whatever the rate, once writes have been waiting for the
# writer when it wakes, GATHER_AT_WAITING of them on average (over ~8
# batches): they then arrive faster than it commits them batch by batch, as
# under many writers in flight (measured at wake: ~1.4 at 4 in flight, ~2 at
# 8, ~4.5 at 64), so the writer is what they wait for. The rate alone depends
# on how fast the machine is: a slower one (or a heavier write) never reached it.
GATHER_AT_WAITING = 2.5
# While other processes' writers contend for the write lock (`serve --workers`:
# one took it within the last _CONTENDED_SECONDS), the delay starts at a lower
# rate: each process then sees only its share of the file's writes, and every
# commit that does not gather is one more hand-off of the lock between them.
GATHER_AT_RATE_CONTENDED = 1500.0
_CONTENDED_SECONDS = 1.0
_GATHER_STEP = 0.0005
_RATE_WINDOW = 0.02  # seconds over which a rate is measured
#: storage calls per second (reads and writes) under which a write that finds the
#: writer idle commits on the caller's thread (`Worker.commit_here`), once the
#: store has stayed under it for QUIET_SECONDS: under load a brief stall drops
#: one window's rate, and a loop that then waited for every fsync would hold
#: the rate near the bound (seen before this: 1 s dips to half the rate at 64
#: writes in flight)
LONE_WRITE_RATE = 1500.0
QUIET_SECONDS = 0.25
#: lone writes pause for LONE_WRITE_PAUSE seconds once they have held their
#: callers for more than LONE_WRITE_SHARE of the wall time since the last
#: pause check (windows of at least LONE_WRITE_WINDOW seconds): see `Worker.commit_here`
LONE_WRITE_SHARE = 0.5
LONE_WRITE_WINDOW = 0.04
LONE_WRITE_PAUSE = 1.0

Op = Callable[..., Any]
Queued = tuple[Op, asyncio.AbstractEventLoop, "asyncio.Future[Any]", bool]


class RateMeter:
    """Events per second over the last full window of `_RATE_WINDOW` seconds
    (an idle spell counts: the first event after one sees a low rate)."""

    __slots__ = ("rate", "_since", "_count")

    def __init__(self) -> None:
        self.rate = 0.0
        self._since = time.monotonic()
        self._count = 0

    def add(self, events: int = 1) -> float:
        """Count `events`; the rate over the last full window."""
        self._count += events
        elapsed = time.monotonic() - self._since
        if elapsed >= _RATE_WINDOW:
            self.rate = self._count / elapsed
            self._since += elapsed
            self._count = 0
        return self.rate


class StoreLoad:
    """A store's calls per second, and whether it is quiet: under
    LONE_WRITE_RATE in every window of the last QUIET_SECONDS."""

    __slots__ = ("meter", "_loud_at")

    def __init__(self) -> None:
        self.meter = RateMeter()
        self._loud_at = -QUIET_SECONDS

    def count(self) -> None:
        """Count one call."""
        if self.meter.add() >= LONE_WRITE_RATE:
            self._loud_at = time.monotonic()

    def quiet(self) -> bool:
        """Count one call; whether the store is quiet."""
        self.count()
        return time.monotonic() - self._loud_at >= QUIET_SECONDS


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
        self.arrivals = RateMeter()  # writes per second handed to the thread (the commit delay's gate)
        # held while a batch is gathered and committed, or while `commit_here` commits
        self._lock = threading.Lock()
        self._contended_at = -_CONTENDED_SECONDS  # when BEGIN last found another process's writer
        self._lone_busy = 0.0  # seconds lone writes held their callers since _lone_since
        self._lone_since = time.monotonic()
        self._lone_paused_until = 0.0
        self._waiting = 0.0  # writes queued when the thread wakes for a batch, moving average
        self._stopped = False
        name = "fencepost-sqlite-writer" if writer else "fencepost-sqlite-reader"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, op: Op, savepoint: bool = True) -> asyncio.Future[Any]:
        """Queue `op`. `savepoint=False` spares two statements per op: SQLite
        undoes a failed statement by itself, and an op that fails after
        another of its statements changed rows fails the whole batch."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.put((op, loop, fut, savepoint))
        return fut

    def commit_here(self, op: Op, savepoint: bool = True) -> tuple[bool, Any] | None:
        """Commit `op` now, on the calling thread, if the writer is idle:
        nothing queued, no batch running, and the write lock not held by
        another process. (ok, result or error), or None when it is not idle
        (then `submit` it). Only for a writer.

        Not while lone writes have been holding their callers for more than
        LONE_WRITE_SHARE of the time (a slow disk, big writes): then they
        pause for LONE_WRITE_PAUSE. A caller that waits for every fsync can
        reach at most 1 / (time per write) writes a second; were that below
        the rate that hands writes to the thread, the store would never hand
        them over and never group-commit again.

        Writes in flight together were never ordered: a lone write may
        commit before one the thread has taken off the queue but not begun."""
        if not self._queue.empty() or time.monotonic() < self._lone_paused_until:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        started = time.perf_counter()
        try:
            if self._stopped:
                return None
            outcomes = self._commit([(op, savepoint)], wait=False)
        except BaseException:  # e.g. KeyboardInterrupt inside the op: never leave the transaction open
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        finally:
            self._lock.release()
        self._pause_if_holding(time.perf_counter() - started)
        if outcomes is None:
            return None
        ok, value = outcomes[0]
        return ok, value if ok else storage_error(value)

    def _pause_if_holding(self, took: float) -> None:
        """Count a lone write's `took` seconds; pause lone writes once they
        take more than LONE_WRITE_SHARE of the window."""
        self._lone_busy += took
        now = time.monotonic()
        elapsed = now - self._lone_since
        if self._lone_busy > LONE_WRITE_SHARE * max(elapsed, LONE_WRITE_WINDOW):
            self._lone_paused_until = now + LONE_WRITE_PAUSE
        if elapsed >= LONE_WRITE_WINDOW or now < self._lone_paused_until:
            self._lone_busy, self._lone_since = 0.0, now

    def stop(self) -> None:
        """Answers everything queued before it, then ends the thread (a lone
        write under way on another thread finishes first)."""
        self._queue.put(_STOP)
        self._thread.join()
        with self._lock:
            self._stopped = True
            self._conn.close()

    def _begin(self, wait: bool) -> bool:
        """BEGIN IMMEDIATE, waiting for another process's writer (`serve
        --workers`) in short steps: SQLite's own busy handler backs off to
        sleeps of 10-25 ms, far longer than the other writer holds the lock
        (one group commit), which would cap the writes of several workers.
        False when another process holds the lock and `wait` is False."""
        deadline = time.monotonic() + _BUSY_SECONDS
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return True
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                self._contended_at = time.monotonic()
                if not wait:
                    return False
            time.sleep(_BUSY_STEP)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            with self._lock:
                if self._writer:
                    self._waiting += (1 + self._queue.qsize() - self._waiting) / 8
                    if self._delay_due():
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
                self.arrivals.add(len(batch))
                if self._writer:
                    outcomes = self._commit([(op, savepoint) for op, _, _, savepoint in batch], wait=True)
                else:
                    outcomes = [_call(op, (self._conn,)) for op, *_ in batch]
            assert outcomes is not None  # a writer that waits for the lock always commits or fails
            _answer(batch, outcomes)
            if stop:
                return

    def _delay_due(self) -> bool:
        """Whether the commit delay applies to the next batch."""
        rate = self.arrivals.add(0)
        if rate >= GATHER_AT_RATE or self._waiting >= GATHER_AT_WAITING:
            return True
        contended = time.monotonic() - self._contended_at < _CONTENDED_SECONDS
        return contended and rate >= GATHER_AT_RATE_CONTENDED

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

    def _commit(self, batch: list[tuple[Op, bool]], wait: bool) -> list[tuple[bool, Any]] | None:
        """Run `batch` (op, savepoint) in one transaction: each op's outcome.
        None, having run nothing, when another process holds the write lock
        and `wait` is False."""
        conn = self._conn
        outcomes: list[tuple[bool, Any]] = []
        try:
            if not self._begin(wait):
                return None
            for op, savepoint in batch:
                if savepoint:
                    conn.execute("SAVEPOINT op")
                else:
                    changed = conn.total_changes
                outcome = _call(op, (conn, self._version))
                if savepoint:
                    conn.execute("RELEASE op" if outcome[0] else "ROLLBACK TO op")
                    if not outcome[0]:
                        conn.execute("RELEASE op")  # one bad op must not sink the batch
                elif not outcome[0]:
                    if not conn.in_transaction:
                        # some errors (disk full, I/O) roll the whole transaction back:
                        # nothing of this batch was applied, and the rest must not run unbatched
                        raise sqlite3.OperationalError(f"transaction rolled back: {outcome[1]}")
                    if conn.total_changes != changed:
                        # SQLite undid the failing statement only, and an earlier one of
                        # this op changed rows: the batch must not commit half an op.
                        # (Rows a trigger changed count even when SQLite then undid the
                        # statement it ran in: then this fails a batch that could have
                        # committed; nothing applied either way.)
                        raise sqlite3.OperationalError(f"a write failed part-way: {outcome[1]}")
                outcomes.append(outcome)
        except sqlite3.Error as exc:
            log.warning("sqlite batch failed before its commit: %s", exc)
            self._rollback()
            return [(False, BackendUnavailable(f"sqlite batch failed, nothing applied: {exc}"))] * len(batch)
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # An I/O error while the WAL is written or synced: the batch may
            # still be on disk (recovery replays every complete transaction in
            # the WAL), so "nothing applied" would be a guess.
            log.warning("sqlite batch commit failed: %s", exc)
            self._rollback()
            return [(False, PersistenceUncertain(f"sqlite commit failed, outcome unknown: {exc}"))] * len(batch)
        return outcomes

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _call(op: Op, args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, op(*args)
    except Exception as exc:
        return False, exc


def storage_error(exc: Exception) -> Exception:
    """What a write's caller is answered for `exc`: an SQLite error is the backend's."""
    return BackendUnavailable(f"sqlite: {exc}") if isinstance(exc, sqlite3.Error) else exc


def _answer(batch: list[Queued], outcomes: list[tuple[bool, Any]]) -> None:
    """Hand results back: one wake-up per event loop per batch."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for (_, loop, fut, _), (ok, value) in zip(batch, outcomes):
        by_loop.setdefault(loop, []).append((fut, ok, value if ok else storage_error(value)))
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
