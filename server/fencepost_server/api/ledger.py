"""LedgerService: decode, call the domain, encode."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf import timestamp_pb2

from fencepost.v1 import ledger_pb2 as pb
from fencepost.v1 import ledger_pb2_grpc

from ..domain.ledger import InboxEvent, LeaseState, Ledger, SessionView
from .base import Authenticator, RpcObserver, ServicerBase, caller, server_stream, unary
from .fields import duration_seconds


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _lease(st: LeaseState | None, now: float) -> pb.Lease | None:
    if st is None:
        return None
    return pb.Lease(
        holder_id=st.holder, generation=st.generation, expires_at=_ts(st.expires),
        # never leased (generation 0) is free but was not released by anyone
        live=st.live(now), released=st.released and st.generation > 0,
    )


def _event(e: InboxEvent) -> pb.InboxEvent:
    return pb.InboxEvent(inbox_id=e.inbox_id, payload=e.payload, dedupe_key=e.dedupe_key, deliver_time=_ts(e.delivered))


class LedgerServicer(ServicerBase, ledger_pb2_grpc.LedgerServiceServicer):
    def __init__(self, ledger: Ledger, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.ledger = ledger

    def _session(self, v: SessionView) -> pb.Session:
        return pb.Session(
            session_id=v.session_id, agent=v.agent, session_key=v.session_key, seq=v.seq,
            lease=_lease(v.lease, self.ledger.clock()), pending=v.pending, parent_session_id=v.parent,
            seed_length=v.seed_length, create_time=_ts(v.created), last_activity_time=_ts(v.last_activity),
            metadata=v.metadata,
        )

    @unary
    async def OpenSession(self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext) -> pb.OpenSessionResponse:
        view, created = await self.ledger.open(caller().tenant, request.agent, request.session_key, dict(request.metadata))
        return pb.OpenSessionResponse(session=self._session(view), created=created)

    @unary
    async def ResolveSession(
        self, request: pb.ResolveSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveSessionResponse:
        view = await self.ledger.resolve(caller().tenant, request.agent, request.session_key)
        return pb.ResolveSessionResponse(session=self._session(view))

    @unary
    async def GetSession(self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext) -> pb.GetSessionResponse:
        return pb.GetSessionResponse(session=self._session(await self.ledger.get(caller().tenant, request.session_id)))

    @unary
    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        items, token = await self.ledger.list_sessions(
            caller().tenant, request.agent, request.max_sessions, duration_seconds(request, "max_age"),
            request.max_total_bytes, request.page_size, request.page_token,
        )
        return pb.ListSessionsResponse(
            sessions=[
                pb.SessionSummary(
                    session_id=s.session_id, session_key=s.session_key, seq=s.seq,
                    last_activity_time=_ts(s.last_activity), total_bytes=s.total_bytes,
                )
                for s in items
            ],
            next_page_token=token,
        )

    @unary
    async def Fork(self, request: pb.ForkRequest, context: grpc.aio.ServicerContext) -> pb.ForkResponse:
        view = await self.ledger.fork(
            caller().tenant, request.parent_session_id, request.at_seq, request.child_session_key
        )
        return pb.ForkResponse(session=self._session(view))

    @unary
    async def AcquireLease(
        self, request: pb.AcquireLeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.AcquireLeaseResponse:
        st = await self.ledger.acquire(
            caller().tenant, request.session_id, request.holder_id, duration_seconds(request, "ttl"),
            request.generation,
        )
        return pb.AcquireLeaseResponse(lease=_lease(st, self.ledger.clock()))

    @unary
    async def RenewLease(self, request: pb.RenewLeaseRequest, context: grpc.aio.ServicerContext) -> pb.RenewLeaseResponse:
        st = await self.ledger.renew(
            caller().tenant, request.session_id, request.generation, duration_seconds(request, "ttl"),
            request.holder_id,
        )
        return pb.RenewLeaseResponse(lease=_lease(st, self.ledger.clock()))

    @unary
    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseLeaseResponse:
        pending = await self.ledger.release(caller().tenant, request.session_id, request.generation, request.force)
        return pb.ReleaseLeaseResponse(pending=pending)

    @unary
    async def Commit(self, request: pb.CommitRequest, context: grpc.aio.ServicerContext) -> pb.CommitResponse:
        out = await self.ledger.commit(
            caller().tenant, request.session_id, request.generation, request.expected_seq,
            list(request.records), list(request.consume_inbox_ids), request.commit_id,
        )
        return pb.CommitResponse(seq=out.seq, pending=out.pending, replayed=out.replayed)

    @server_stream
    async def ReadLog(
        self, request: pb.ReadLogRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadLogResponse]:
        async for page in self.ledger.read_log(caller().tenant, request.session_id, request.from_seq, request.limit):
            yield pb.ReadLogResponse(records=[pb.Record(seq=s, data=d) for s, d in page])

    @unary
    async def Deliver(self, request: pb.DeliverRequest, context: grpc.aio.ServicerContext) -> pb.DeliverResponse:
        out = await self.ledger.deliver(
            caller().tenant, agent=request.agent, session_key=request.session_key,
            session_id=request.session_id, payload=request.payload, dedupe_key=request.dedupe_key,
            try_lease=request.try_lease, ttl=duration_seconds(request, "ttl"),
        )
        return pb.DeliverResponse(
            session_id=out.session_id, inbox_id=out.inbox_id, duplicate=out.duplicate,
            lease_granted=out.lease_granted, lease=_lease(out.lease, self.ledger.clock()),
        )

    @unary
    async def ListInbox(self, request: pb.ListInboxRequest, context: grpc.aio.ServicerContext) -> pb.ListInboxResponse:
        events, token = await self.ledger.list_inbox(
            caller().tenant, request.session_id, request.page_size, request.page_token
        )
        return pb.ListInboxResponse(events=[_event(e) for e in events], next_page_token=token)

    @server_stream
    async def WatchInbox(
        self, request: pb.WatchInboxRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchInboxResponse]:
        async for event in self.ledger.watch_inbox(
            caller().tenant, request.session_id, request.generation, self.still_allowed(context)
        ):
            yield pb.WatchInboxResponse(event=_event(event))

    @unary
    async def ClaimOrphan(self, request: pb.ClaimOrphanRequest, context: grpc.aio.ServicerContext) -> pb.ClaimOrphanResponse:
        wait = min(duration_seconds(request, "wait"), 60.0)
        view = await self.ledger.janitor.claim(
            caller().tenant, request.holder_id or "", duration_seconds(request, "ttl"), wait, request.agent,
            still_allowed=self.still_allowed(context),
        )
        if view is None:
            return pb.ClaimOrphanResponse(found=False)
        return pb.ClaimOrphanResponse(found=True, session=self._session(view))

    @unary
    async def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSessionResponse:
        out = await self.ledger.delete_session(
            caller().tenant, request.session_id, force=request.force, descendants=request.delete_descendants
        )
        return pb.DeleteSessionResponse(deleted_session_ids=list(out.session_ids), erased_items=out.items)
