"""`SessionWorker`: the lease holder's loop, written once.

    async def turn(session: fencepost.Session, events: list[fencepost.InboxEvent]) -> list[bytes]:
        ...                                   # run the agent; return the records to commit

    worker = fencepost.SessionWorker(client, turn, holder_id="pod-7")
    result = await worker.deliver(b"hello", agent="a", session_key="chan-1")

`deliver` parks the event with `try_lease`. When the lease is granted this
worker serves the session: it runs `turn` on the pending events, commits the
returned records consuming exactly those events (one fenced write), and keeps
going while the commit reports events still pending or WatchInbox pushes new
ones. The lease is renewed in the background (the `Session` helper). When
nothing arrives for `idle` seconds (or `stop()` was called) it releases the
lease; a release refused with INBOX_NOT_EMPTY (an event parked after the last
look) sends it back to draining. LeaseFenced anywhere — renew, watch, commit —
stops it without committing anything more: `result.fenced` is true. Any
other error (the turn raised, the server stayed unavailable past the SDK's
retries) propagates after renewal stops: the lease expires and the janitor
hands the session on.

When the lease is held by someone else, `deliver` returns at once
(`served = False`): the holder drains the event. A delivery the SDK resent
(its first answer lost) finds the lease this worker was granted by its first
attempt: it serves the session then, unless a worker of this process already does. `claim_orphans()` is the
recovery loop: it claims sessions whose holder died with events pending (the
server's janitor finds them) and serves each the same way, until `stop()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ._ledger import Delivery, InboxEvent, LedgerMethods, Session
from .errors import DeadlineExceeded, FencepostError, InboxNotEmpty, LeaseFenced, Unavailable

log = logging.getLogger("fencepost.worker")

TurnFn = Callable[[Session, list[InboxEvent]], Awaitable[Sequence[bytes] | None]]

MAX_CONSUME = 32  # consumed ids per commit (spec/ledger.md)
_STOP = object()
#: (holder_id, session_id) of every session a worker of this process is serving
_SERVING: set[tuple[str, str]] = set()


@dataclass
class WorkerResult:
    """What serving one session did."""

    session_id: str
    served: bool  # this worker held the lease and ran the loop
    generation: int = 0
    turns: int = 0
    consumed: int = 0  # events consumed by this worker's commits
    fenced: bool = False  # the lease was lost: stopped without committing further
    released: bool = False  # the lease was released (idle, inbox empty)
    delivery: Delivery | None = None


class SessionWorker:
    """The holder's loop over `turn` (see the module docstring)."""

    def __init__(
        self,
        client: LedgerMethods,
        turn: TurnFn,
        *,
        holder_id: str | None = None,
        ttl: float = 30.0,
        idle: float = 5.0,
        batch: int = MAX_CONSUME,
        retry_delay: float = 0.5,
    ) -> None:
        if not 1 <= batch <= MAX_CONSUME:
            raise ValueError(f"batch must be 1..{MAX_CONSUME}")
        self.client = client
        self.turn = turn
        self.holder_id = holder_id or uuid.uuid4().hex
        self.ttl = ttl
        self.idle = idle
        self.batch = batch
        self.retry_delay = retry_delay
        self._stopping = asyncio.Event()
        self._queues: set[asyncio.Queue[object]] = set()

    def stop(self) -> None:
        """Finish the current work, release when idle, and end `claim_orphans`."""
        self._stopping.set()
        for q in self._queues:
            q.put_nowait(_STOP)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def deliver(
        self,
        payload: bytes,
        *,
        agent: str = "",
        session_key: str = "",
        session_id: str = "",
        dedupe_key: str = "",
    ) -> WorkerResult:
        """Park `payload` (trying the lease); serve the session if granted."""
        d = await self.client.deliver(
            payload, agent=agent, session_key=session_key, session_id=session_id, dedupe_key=dedupe_key,
            try_lease=self.holder_id, ttl=self.ttl,
        )
        if d.lease is None or not (d.lease_granted or self._granted_unanswered(d)):
            return WorkerResult(d.session_id, served=False, delivery=d)
        result = await self.serve(d.session_id, d.lease.generation)
        result.delivery = d
        return result

    def _granted_unanswered(self, d: Delivery) -> bool:
        """A resent delivery (the SDK's retry under its dedupe key) whose first
        attempt was granted the lease and lost its answer: the lease is live
        under this holder id and no worker of this process serves the session,
        so nobody else will drain the event before the TTL runs out."""
        return (
            d.duplicate and d.lease is not None and d.lease.live and d.lease.holder_id == self.holder_id
            and (self.holder_id, d.session_id) not in _SERVING
        )

    async def claim_orphans(self, *, agent: str = "", wait: float = 5.0) -> list[WorkerResult]:
        """Claim and serve orphaned sessions until `stop()`; returns what each served."""
        results: list[WorkerResult] = []
        while not self.stopping:
            claim = asyncio.ensure_future(
                self.client.claim_orphan(self.holder_id, ttl=self.ttl, wait=wait, agent=agent)
            )
            stopper = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait({claim, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
            if not claim.done():  # stopping: a lease granted to a cancelled claim simply expires
                claim.cancel()
                with contextlib.suppress(asyncio.CancelledError, FencepostError):
                    await claim
                break
            try:
                info = claim.result()
            except (Unavailable, DeadlineExceeded) as exc:
                log.warning("claim_orphan failed (retrying): %s", exc)
                await self._pause(self.retry_delay)
                continue
            if info is None:
                continue
            results.append(await self.serve(info.session_id, info.lease.generation))
        return results

    async def serve(self, session_id: str, generation: int) -> WorkerResult:
        """Serve a session whose lease this worker already holds at `generation`."""
        s = Session(self.client, session_id, self.holder_id, self.ttl)
        s.generation = generation
        result = WorkerResult(session_id, served=True, generation=generation)
        queue: asyncio.Queue[object] = asyncio.Queue()
        self._queues.add(queue)
        _SERVING.add((self.holder_id, session_id))
        if self.stopping:
            queue.put_nowait(_STOP)
        s._renewer = asyncio.create_task(s._renew_loop())
        watcher = asyncio.create_task(self._watch(s, queue))
        try:
            info = await self.client.get_session(session_id)
            s.seq, s.pending = info.seq, info.pending
            await self._loop(s, queue, result)
        except LeaseFenced:
            result.fenced = True
        finally:
            _SERVING.discard((self.holder_id, session_id))
            self._queues.discard(queue)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
            await s._stop()
        return result

    async def _loop(self, s: Session, queue: asyncio.Queue[object], result: WorkerResult) -> None:
        consumed: set[str] = set()
        pending = s.pending
        while True:
            s.check()
            events: list[InboxEvent] = []
            if pending > 0:
                async for event in self.client.list_inbox(s.session_id):
                    events.append(event)
                    if len(events) >= self.batch:
                        break
            else:
                events = self._take(queue, consumed)
            if not events:
                if pending > 0:  # the count was stale: look at the queue next round
                    pending = 0
                    continue
                item = await self._next(s, queue)
                if isinstance(item, InboxEvent):
                    if item.inbox_id in consumed:
                        continue
                    events = [item, *self._take(queue, consumed, self.batch - 1)]
                elif await self._release(s):
                    result.released = True
                    return
                else:
                    pending = 1  # INBOX_NOT_EMPTY: drain, then try again
                    continue
            ids = [e.inbox_id for e in events]
            records = await s.run(lambda: self.turn(s, events)) or []
            commit = await s.commit(list(records), consume=ids)
            consumed.update(ids)
            result.turns += 1
            result.consumed += len(ids)
            pending = commit.pending

    def _take(self, queue: asyncio.Queue[object], consumed: set[str], limit: int | None = None) -> list[InboxEvent]:
        """Events already pushed by WatchInbox (not yet consumed), without waiting."""
        limit = self.batch if limit is None else limit
        out: list[InboxEvent] = []
        while len(out) < limit and not queue.empty():
            item = queue.get_nowait()
            if isinstance(item, LeaseFenced):
                raise item
            if item is _STOP:
                queue.put_nowait(_STOP)  # still stopping once this work is done
                break
            if isinstance(item, InboxEvent) and item.inbox_id not in consumed:
                if all(e.inbox_id != item.inbox_id for e in out):
                    out.append(item)
        return out

    async def _next(self, s: Session, queue: asyncio.Queue[object]) -> object:
        """The next pushed event, or `_STOP` when idle for `idle` seconds or stopping."""
        if self.stopping:
            return _STOP
        try:
            item = await s.run(lambda: asyncio.wait_for(queue.get(), self.idle))
        except TimeoutError:
            return _STOP
        if isinstance(item, LeaseFenced):
            raise item
        return item

    async def _release(self, s: Session) -> bool:
        """Release while still renewing; False when events are pending (drain them)."""
        try:
            await self.client.release_lease(s.session_id, s.generation)
        except InboxNotEmpty:
            return False
        await s._stop()
        return True

    async def _watch(self, s: Session, queue: asyncio.Queue[object]) -> None:
        """Feed WatchInbox pushes to the loop; reconnect after a transient end."""
        while True:
            try:
                async for event in s.inbox():
                    queue.put_nowait(event)
            except LeaseFenced as exc:
                queue.put_nowait(exc)
                return
            except FencepostError as exc:
                log.debug("WatchInbox ended (reconnecting): %s", exc)
            await asyncio.sleep(self.retry_delay)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
