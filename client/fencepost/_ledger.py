"""LedgerService methods of the async client, and the `Session` holder helper."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import duration_pb2

from . import reasons
from ._call import paged
from .errors import LeaseFenced
from .v1 import ledger_pb2 as pb
from .v1 import ledger_pb2_grpc

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Lease:
    holder_id: str
    generation: int
    expires_at: float  # seconds since the epoch (server clock)
    live: bool
    released: bool


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    agent: str
    session_key: str
    seq: int
    lease: Lease
    pending: int
    parent_session_id: str
    seed_length: int
    create_time: float
    last_activity_time: float
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionSummary:
    session_id: str
    session_key: str
    seq: int
    last_activity_time: float
    total_bytes: int


@dataclass(frozen=True, slots=True)
class Deletion:
    session_ids: list[str]  # descendants first, then the session
    erased_items: int


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    data: bytes


@dataclass(frozen=True, slots=True)
class InboxEvent:
    inbox_id: str
    payload: bytes
    dedupe_key: str
    deliver_time: float


@dataclass(frozen=True, slots=True)
class Commit:
    seq: int
    pending: int
    replayed: bool


@dataclass(frozen=True, slots=True)
class Delivery:
    session_id: str
    inbox_id: str
    duplicate: bool
    lease_granted: bool
    lease: Lease | None


def _dur(seconds: float | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def _lease(m: pb.Lease) -> Lease:
    return Lease(m.holder_id, m.generation, m.expires_at.ToNanoseconds() / 1e9, m.live, m.released)


def _session(m: pb.Session) -> SessionInfo:
    return SessionInfo(
        m.session_id, m.agent, m.session_key, m.seq, _lease(m.lease), m.pending, m.parent_session_id,
        m.seed_length, m.create_time.ToNanoseconds() / 1e9, m.last_activity_time.ToNanoseconds() / 1e9,
        dict(m.metadata),
    )


def _event(m: pb.InboxEvent) -> InboxEvent:
    return InboxEvent(m.inbox_id, m.payload, m.dedupe_key, m.deliver_time.ToNanoseconds() / 1e9)


class LedgerMethods:
    """Mixed into AsyncClient; `self._caller` and `self._ledger` come from it.

    Every mutating call here is idempotent when retried as the SDK does
    (commit_id, dedupe_key, generation-conditioned renew/release), so they
    are retried on UNAVAILABLE. AcquireLease is retried too: a lost grant
    only costs a generation (the retry by the same holder is granted anew)."""

    _caller: Any
    _ledger: ledger_pb2_grpc.LedgerServiceStub

    async def open_session(
        self, agent: str, session_key: str, *, metadata: dict[str, str] | None = None, **opts: Any
    ) -> SessionInfo:
        """Create-or-get the session of (agent, session_key)."""
        req = pb.OpenSessionRequest(agent=agent, session_key=session_key, metadata=metadata or {})
        return _session((await self._caller.call(self._ledger.OpenSession, req, safe=True, **opts)).session)

    async def resolve_session(self, agent: str, session_key: str, **opts: Any) -> SessionInfo:
        """The session; raises SessionNotFound only on a real miss."""
        req = pb.ResolveSessionRequest(agent=agent, session_key=session_key)
        return _session((await self._caller.call(self._ledger.ResolveSession, req, safe=True, **opts)).session)

    async def get_session(self, session_id: str, **opts: Any) -> SessionInfo:
        req = pb.GetSessionRequest(session_id=session_id)
        return _session((await self._caller.call(self._ledger.GetSession, req, safe=True, **opts)).session)

    async def list_sessions_page(
        self,
        agent: str,
        *,
        max_sessions: int = 0,
        max_age: float | None = None,
        max_total_bytes: int = 0,
        page_size: int = 0,
        page_token: str = "",
        **opts: Any,
    ) -> tuple[list[SessionSummary], str]:
        req = pb.ListSessionsRequest(
            agent=agent, max_sessions=max_sessions, max_age=_dur(max_age), max_total_bytes=max_total_bytes,
            page_size=page_size, page_token=page_token,
        )
        res = await self._caller.call(self._ledger.ListSessions, req, safe=True, **opts)
        out = [
            SessionSummary(s.session_id, s.session_key, s.seq, s.last_activity_time.ToNanoseconds() / 1e9,
                           s.total_bytes)
            for s in res.sessions
        ]
        return out, res.next_page_token

    async def list_sessions(
        self, agent: str, *, max_sessions: int = 0, max_age: float | None = None, max_total_bytes: int = 0,
        page_size: int = 0, **opts: Any,
    ) -> AsyncIterator[SessionSummary]:
        """Recent sessions, newest activity first, within the restore caps."""
        async for s in paged(lambda token: self.list_sessions_page(
            agent, max_sessions=max_sessions, max_age=max_age, max_total_bytes=max_total_bytes,
            page_size=page_size, page_token=token, **opts,
        )):
            yield s

    async def fork(self, parent_session_id: str, at_seq: int, child_session_key: str, **opts: Any) -> SessionInfo:
        req = pb.ForkRequest(parent_session_id=parent_session_id, at_seq=at_seq, child_session_key=child_session_key)
        return _session((await self._caller.call(self._ledger.Fork, req, safe=True, **opts)).session)

    async def acquire_lease(
        self, session_id: str, holder_id: str, *, ttl: float | None = None, generation: int = 0, **opts: Any
    ) -> Lease:
        """A new generation, or LeaseHeld (walk away)."""
        req = pb.AcquireLeaseRequest(session_id=session_id, holder_id=holder_id, ttl=_dur(ttl), generation=generation)
        return _lease((await self._caller.call(self._ledger.AcquireLease, req, safe=True, **opts)).lease)

    async def renew_lease(
        self, session_id: str, generation: int, *, ttl: float | None = None, holder_id: str = "", **opts: Any
    ) -> Lease:
        """Extend; LeaseFenced when the generation is no longer current."""
        req = pb.RenewLeaseRequest(session_id=session_id, generation=generation, ttl=_dur(ttl), holder_id=holder_id)
        return _lease((await self._caller.call(self._ledger.RenewLease, req, safe=True, **opts)).lease)

    async def release_lease(self, session_id: str, generation: int, *, force: bool = False, **opts: Any) -> int:
        """Release; InboxNotEmpty while events are pending (unless force).
        Returns the events left pending (force only)."""
        req = pb.ReleaseLeaseRequest(session_id=session_id, generation=generation, force=force)
        return int((await self._caller.call(self._ledger.ReleaseLease, req, safe=True, **opts)).pending)

    async def delete_session(
        self, session_id: str, *, force: bool = False, delete_descendants: bool = False, **opts: Any
    ) -> Deletion:
        """Erase a session (docs/lifecycle.md); returns every session id erased
        (descendants first) and the items removed. InboxNotEmpty while events are pending (unless
        force); SessionHasForks while it has live forks (unless
        delete_descendants). Not retried automatically: a retry after the
        delete completed answers SessionNotFound."""
        req = pb.DeleteSessionRequest(session_id=session_id, force=force, delete_descendants=delete_descendants)
        out = await self._caller.call(self._ledger.DeleteSession, req, safe=False, **opts)
        return Deletion(list(out.deleted_session_ids), out.erased_items)

    async def commit(
        self,
        session_id: str,
        generation: int,
        expected_seq: int,
        records: Sequence[bytes] = (),
        *,
        consume: Sequence[str] = (),
        commit_id: str | None = None,
        **opts: Any,
    ) -> Commit:
        """Append records and consume inbox ids in one fenced write. A commit id
        is generated when not given, so the SDK's retries apply it once."""
        req = pb.CommitRequest(
            session_id=session_id, generation=generation, expected_seq=expected_seq, records=list(records),
            consume_inbox_ids=list(consume), commit_id=commit_id or os.urandom(16).hex(),
        )
        res = await self._caller.call(self._ledger.Commit, req, safe=True, **opts)
        return Commit(res.seq, res.pending, res.replayed)

    async def read_log(
        self, session_id: str, *, from_seq: int = 1, limit: int = 0, **opts: Any
    ) -> AsyncIterator[Record]:
        """Records in seq order (fork prefix included), streamed page by page."""
        req = pb.ReadLogRequest(session_id=session_id, from_seq=from_seq, limit=limit)
        async for page in self._caller.stream(self._ledger.ReadLog, req, **opts):
            for r in page.records:
                yield Record(r.seq, r.data)

    async def deliver(
        self,
        payload: bytes,
        *,
        agent: str = "",
        session_key: str = "",
        session_id: str = "",
        dedupe_key: str = "",
        try_lease: str = "",
        ttl: float | None = None,
        **opts: Any,
    ) -> Delivery:
        """Park an event durably (the return is the ack). Retried on UNAVAILABLE
        only with a dedupe_key (otherwise a retry could park it twice)."""
        req = pb.DeliverRequest(
            agent=agent, payload=payload, dedupe_key=dedupe_key, try_lease=try_lease, ttl=_dur(ttl)
        )
        if session_id:
            req.session_id = session_id
        else:
            req.session_key = session_key
        res = await self._caller.call(self._ledger.Deliver, req, safe=bool(dedupe_key), **opts)
        lease = _lease(res.lease) if res.HasField("lease") else None
        return Delivery(res.session_id, res.inbox_id, res.duplicate, res.lease_granted, lease)

    async def list_inbox(self, session_id: str, *, page_size: int = 0, **opts: Any) -> AsyncIterator[InboxEvent]:
        """Pending events in arrival order."""
        async def page(token: str) -> tuple[list[InboxEvent], str]:
            req = pb.ListInboxRequest(session_id=session_id, page_size=page_size, page_token=token)
            res = await self._caller.call(self._ledger.ListInbox, req, safe=True, **opts)
            return [_event(e) for e in res.events], res.next_page_token

        async for event in paged(page):
            yield event

    async def watch_inbox(self, session_id: str, generation: int, **opts: Any) -> AsyncIterator[InboxEvent]:
        """Backlog, then each new event; raises LeaseFenced when the lease is lost."""
        req = pb.WatchInboxRequest(session_id=session_id, generation=generation)
        async for res in self._caller.stream(self._ledger.WatchInbox, req, **opts):
            yield _event(res.event)

    async def claim_orphan(
        self, holder_id: str, *, ttl: float | None = None, wait: float = 0.0, agent: str = "", **opts: Any
    ) -> SessionInfo | None:
        """An orphaned session with a fresh lease for `holder_id`, or None."""
        req = pb.ClaimOrphanRequest(holder_id=holder_id, ttl=_dur(ttl), wait=_dur(wait), agent=agent)
        if "timeout" not in opts and self._caller.timeout is not None:
            opts["timeout"] = max(self._caller.timeout, wait + 5.0)
        res = await self._caller.call(self._ledger.ClaimOrphan, req, safe=False, **opts)
        return _session(res.session) if res.found else None

    def session(self, session_id: str, holder_id: str | None = None, *, ttl: float = 30.0) -> Session:
        """A holder helper (async only): `async with client.session(sid) as s:`."""
        return Session(self, session_id, holder_id or uuid.uuid4().hex, ttl)


class Session:
    """Holds one session's lease: acquires, renews in the background every
    ttl/3, commits on the current head, and stops the holder's work with
    `LeaseFenced` once the lease is lost (a renew or a commit was fenced, or
    no renewal got through for a whole TTL).

        async with client.session(sid, "worker-1") as s:
            async for event in s.inbox():
                await s.commit([b"..."], consume=[event.inbox_id])

    Leaving the block releases the lease (InboxNotEmpty propagates: drain
    first, or call `release(force=True)`). On an exception it only stops
    renewing: the lease expires and the janitor hands pending work on.
    """

    def __init__(self, client: LedgerMethods, session_id: str, holder_id: str, ttl: float) -> None:
        self.client = client
        self.session_id = session_id
        self.holder_id = holder_id
        self.ttl = ttl
        self.generation = 0
        self.seq = 0
        self.pending = 0
        self.fenced: LeaseFenced | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._work: set[asyncio.Task[Any]] = set()

    async def acquire(self) -> Session:
        renewed = time.monotonic()  # the TTL runs from (no earlier than) the request
        lease = await self.client.acquire_lease(self.session_id, self.holder_id, ttl=self.ttl)
        self.generation, self.fenced = lease.generation, None
        try:
            info = await self.client.get_session(self.session_id)
        except BaseException:
            # not holding it for nobody until the TTL runs out: give it back if the server lets us
            with contextlib.suppress(Exception):
                await self.client.release_lease(self.session_id, self.generation, force=True)
            raise
        self.seq, self.pending = info.seq, info.pending
        self._renewer = asyncio.create_task(self._renew_loop(renewed))
        return self

    async def _renew_loop(self, renewed: float | None = None) -> None:
        """Renew every ttl/3. `renewed`: when the granting request was sent
        (monotonic clock; now when not given)."""
        if renewed is None:
            renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.ttl / 3)
            sent = time.monotonic()
            try:
                # a renewal not answered by the end of the TTL is too late: its
                # deadline is what is left of it (not the client's default)
                await self.client.renew_lease(
                    self.session_id, self.generation, ttl=self.ttl, holder_id=self.holder_id,
                    timeout=max(renewed + self.ttl - sent, 0.001),
                )
                renewed = sent
            except LeaseFenced as exc:
                self._lost(exc)
                return
            except Exception as exc:  # the next tick retries (renew is idempotent)...
                if time.monotonic() - renewed < self.ttl:
                    continue
                # ...until the TTL has run out unrenewed: another holder may own it now
                self._lost(LeaseFenced(
                    f"the lease was not renewed within its ttl of {self.ttl} s (last error: {exc})",
                    reason=reasons.LEASE_FENCED,
                ))
                return

    def _lost(self, exc: LeaseFenced) -> None:
        self.fenced = exc
        for task in list(self._work):
            task.cancel()

    def check(self) -> None:
        """Raise LeaseFenced when the lease is known lost."""
        if self.fenced is not None:
            raise self.fenced

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run the holder's work; cancelled (raising LeaseFenced) if the lease is lost."""
        self.check()
        task = asyncio.ensure_future(work())
        self._work.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if self.fenced is not None:
                raise self.fenced from None
            raise
        finally:
            self._work.discard(task)

    async def commit(self, records: Sequence[bytes] = (), *, consume: Sequence[str] = (),
                     commit_id: str | None = None) -> Commit:
        self.check()
        try:
            out = await self.client.commit(
                self.session_id, self.generation, self.seq, records, consume=consume, commit_id=commit_id
            )
        except LeaseFenced as exc:
            self._lost(exc)
            raise
        self.seq, self.pending = out.seq, out.pending
        return out

    async def inbox(self) -> AsyncIterator[InboxEvent]:
        """WatchInbox for this holder (ends with LeaseFenced when lost)."""
        try:
            async for event in self.client.watch_inbox(self.session_id, self.generation):
                yield event
        except LeaseFenced as exc:
            self._lost(exc)
            raise

    async def _stop(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
            self._renewer = None

    async def release(self, *, force: bool = False) -> int:
        await self._stop()
        return await self.client.release_lease(self.session_id, self.generation, force=force)

    async def __aenter__(self) -> Session:
        return await self.acquire()

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self.fenced is None:
            await self.release()
        else:
            await self._stop()
