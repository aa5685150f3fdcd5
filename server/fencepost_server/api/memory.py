"""MemoryService: decode, call the domain, encode."""

from __future__ import annotations

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from fencepost import reasons
from fencepost.v1 import memory_pb2 as pb
from fencepost.v1 import memory_pb2_grpc

from ..domain.errors import InvalidArgument
from ..domain.memory import Entry, EntryView, MemoryStore, NewEntry, Topic
from ..domain.memory import rules
from .base import Authenticator, RpcObserver, ServicerBase, caller, require_operator, unary
from .fields import check_json_struct, timestamp_micros

_VALIDITY = {rules.CURRENT: pb.MEMORY_VALIDITY_CURRENT, rules.NOT_YET_VALID: pb.MEMORY_VALIDITY_NOT_YET_VALID,
             rules.EXPIRED: pb.MEMORY_VALIDITY_EXPIRED}
_STRATEGY = {"recency": pb.MEMORY_STRATEGY_RECENCY, "relevance": pb.MEMORY_STRATEGY_RELEVANCE,
             "hybrid": pb.MEMORY_STRATEGY_HYBRID}
_STRATEGY_NAME = {v: k for k, v in _STRATEGY.items()}


def _enum_name(value: int, names: tuple[str, ...], field: str) -> str | None:
    """Enum number -> domain name (0 = unset). An unknown number is refused,
    on Import too: dropping it would store another entry than the one sent
    (an Audit of a newer server is imported by a server that knows its values)."""
    if value == 0:
        return None
    if 1 <= value <= len(names):
        return names[value - 1]
    raise InvalidArgument(reasons.FIELD_INVALID, f"{field} has unknown value {value}", field=field)


def _known(value: int, enum: object, field: str) -> int:
    """A request enum that only selects a mode: refused when its number is not
    one of the enum's values (proto3 enums carry any number)."""
    if value not in enum.DESCRIPTOR.values_by_number:  # type: ignore[attr-defined]
        raise InvalidArgument(reasons.FIELD_INVALID, f"{field} has unknown value {value}", field=field)
    return value


def _enum_number(name: str | None, names: tuple[str, ...]) -> int:
    return names.index(name) + 1 if name in names else 0


def _micros(msg: object, field: str, where: str = "") -> int | None:
    return timestamp_micros(msg, field, f"{where}.{field}" if where else field)


def _ts(micros: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromMicroseconds(micros)
    return ts


def _metadata(msg: object, field: str = "metadata") -> dict[str, object] | None:
    if not msg.HasField("metadata"):  # type: ignore[attr-defined]
        return None
    check_json_struct(msg.metadata, field)  # type: ignore[attr-defined]
    return json_format.MessageToDict(msg.metadata) or None  # type: ignore[attr-defined]


def entry_pb(agent: str, e: Entry, view: EntryView | None = None) -> pb.MemoryEntry:
    out = pb.MemoryEntry(
        id=e.id, agent_id=agent, content=e.content, created_at=_ts(e.created_at),
        kind=_enum_number(e.kind, rules.KINDS), about=list(e.about), supersedes=e.supersedes or "",
        provenance=pb.MemoryProvenance(
            session_id=e.session_id, channel=e.channel, trust=_enum_number(e.trust_label, rules.TRUST_LEVELS)
        ),
        position=e.position,
    )
    if e.valid_from is not None:
        out.valid_from.CopyFrom(_ts(e.valid_from))
    if e.valid_until is not None:
        out.valid_until.CopyFrom(_ts(e.valid_until))
    if e.metadata:
        struct = struct_pb2.Struct()
        struct.update(e.metadata)
        out.metadata.CopyFrom(struct)
    if view is not None:
        out.validity = _VALIDITY[view.validity]
        out.forgotten = view.forgotten
        out.superseded = view.superseded
        if view.usage is not None:
            out.usage.recall_count = view.usage.recall_count
            out.usage.last_recalled_at.CopyFrom(_ts(view.usage.last_recalled_at))
    return out


def topic_pb(t: Topic) -> pb.MemoryTopic:
    return pb.MemoryTopic(
        name=t.name, count=t.count, last_updated_at=_ts(t.last_updated_at),
        trust=_enum_number(t.trust, rules.TRUST_LEVELS),
    )


def _imported(i: int, m: pb.MemoryEntry) -> Entry:
    where = f"entries[{i}]"
    created = _micros(m, "created_at", where)
    if created is None:  # any valid instant is kept verbatim, 1970 and before included
        raise InvalidArgument(reasons.FIELD_INVALID, f"{where}.created_at is required", field=f"{where}.created_at")
    return Entry(
        id=m.id, content=m.content, created_at=created,
        kind=_enum_name(m.kind, rules.KINDS, f"{where}.kind"),
        about=tuple(m.about), valid_from=_micros(m, "valid_from", where),
        valid_until=_micros(m, "valid_until", where),
        supersedes=m.supersedes or None, metadata=_metadata(m, f"{where}.metadata"),
        session_id=m.provenance.session_id, channel=m.provenance.channel,
        trust=_enum_name(m.provenance.trust, rules.TRUST_LEVELS, f"{where}.provenance.trust"),
    )


class MemoryServicer(ServicerBase, memory_pb2_grpc.MemoryServiceServicer):
    def __init__(self, memory: MemoryStore, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.memory = memory

    def _views(self, agent: str, views: list[EntryView]) -> list[pb.MemoryEntry]:
        return [entry_pb(agent, v.entry, v) for v in views]

    @unary
    async def Append(
        self, request: pb.MemoryServiceAppendRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceAppendResponse:
        trust = _enum_name(request.provenance.trust, rules.TRUST_LEVELS, "provenance.trust")
        if trust == "operator":
            # Only an operator may say "an operator said this": the label ranks
            # above everything but the agent's own conclusions, and raising a
            # label after the fact (ReassertTrust) needs the operator role too.
            require_operator("provenance.trust = MEMORY_TRUST_OPERATOR")
        options = NewEntry(
            kind=_enum_name(request.kind, rules.KINDS, "kind"),
            about=list(request.about),
            valid_from=_micros(request, "valid_from"),
            valid_until=_micros(request, "valid_until"),
            supersedes=request.supersedes or None,
            metadata=_metadata(request),
            session_id=request.provenance.session_id,
            channel=request.provenance.channel,
            trust=trust,
        )
        entry = await self.memory.append(
            caller().tenant, request.agent_id, request.content, options, request.request_id
        )
        view = EntryView(entry, self.memory.validity_of(entry))
        return pb.MemoryServiceAppendResponse(entry=entry_pb(request.agent_id, entry, view))

    @unary
    async def List(
        self, request: pb.MemoryServiceListRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceListResponse:
        validity = "all" if _known(request.validity, pb.MemoryValidityFilter, "validity") \
            == pb.MEMORY_VALIDITY_FILTER_ALL else "current"
        out = await self.memory.list(
            caller().tenant, request.agent_id, limit=request.limit, validity=validity,
            size=request.page_size, token=request.page_token,
        )
        return pb.MemoryServiceListResponse(
            entries=self._views(request.agent_id, out.entries), truncated=out.truncated,
            next_page_token=out.next_page_token,
        )

    @unary
    async def Search(
        self, request: pb.MemoryServiceSearchRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceSearchResponse:
        out = await self.memory.search(
            caller().tenant, request.agent_id, request.query, limit=request.limit,
            strategy=_STRATEGY_NAME.get(_known(request.strategy, pb.MemoryStrategy, "strategy")),
        )
        return pb.MemoryServiceSearchResponse(
            entries=self._views(request.agent_id, out.entries), truncated=out.truncated,
            strategy=_STRATEGY[out.strategy],
        )

    @unary
    async def Forget(
        self, request: pb.MemoryServiceForgetRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceForgetResponse:
        done = await self.memory.forget(caller().tenant, request.agent_id, request.id, request.request_id)
        return pb.MemoryServiceForgetResponse(forgotten=done)

    @unary
    async def Audit(
        self, request: pb.MemoryServiceAuditRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceAuditResponse:
        who = require_operator("memory Audit")
        out = await self.memory.audit(
            who.tenant, request.agent_id, size=request.page_size, token=request.page_token
        )
        return pb.MemoryServiceAuditResponse(
            entries=self._views(request.agent_id, out.entries), next_page_token=out.next_page_token
        )

    @unary
    async def ReassertTrust(
        self, request: pb.MemoryServiceReassertTrustRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceReassertTrustResponse:
        who = require_operator("ReassertTrust")
        trust = _enum_name(request.trust, rules.TRUST_LEVELS, "trust")
        if trust is None:
            raise InvalidArgument(reasons.FIELD_INVALID, "trust must be specified", field="trust")
        found = await self.memory.reassert_trust(who.tenant, request.agent_id, request.id, trust, request.request_id)
        return pb.MemoryServiceReassertTrustResponse(found=found)

    @unary
    async def Pin(
        self, request: pb.MemoryServicePinRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServicePinResponse:
        out = await self.memory.pin(caller().tenant, request.agent_id, request.id, request.request_id)
        return pb.MemoryServicePinResponse(
            pinned=out.pinned, reason=out.reason, bytes=out.bytes, blocking_id=out.blocking_id
        )

    @unary
    async def Unpin(
        self, request: pb.MemoryServiceUnpinRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceUnpinResponse:
        done = await self.memory.unpin(caller().tenant, request.agent_id, request.id, request.request_id)
        return pb.MemoryServiceUnpinResponse(unpinned=done)

    @unary
    async def Pinned(
        self, request: pb.MemoryServicePinnedRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServicePinnedResponse:
        include = "allocated" if _known(request.include, pb.MemoryPinnedInclude, "include") \
            == pb.MEMORY_PINNED_INCLUDE_ALLOCATED else "current"
        views, allocated = await self.memory.pinned(caller().tenant, request.agent_id, include)
        return pb.MemoryServicePinnedResponse(
            entries=self._views(request.agent_id, views), allocated_bytes=allocated
        )

    @unary
    async def Topics(
        self, request: pb.MemoryServiceTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceTopicsResponse:
        topics = await self.memory.topics(caller().tenant, request.agent_id)
        return pb.MemoryServiceTopicsResponse(topics=[topic_pb(t) for t in topics])

    @unary
    async def Import(
        self, request: pb.MemoryServiceImportRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceImportResponse:
        who = require_operator("memory Import")
        entries = [_imported(i, m) for i, m in enumerate(request.entries)]
        # a repeated id is skipped: only its first entry, the one imported, says whether it is forgotten
        first: dict[str, bool] = {}
        for m in request.entries:
            first.setdefault(m.id, m.forgotten)
        forgotten = [eid for eid, gone in first.items() if gone]
        out = await self.memory.import_entries(who.tenant, request.agent_id, entries, forgotten)
        return pb.MemoryServiceImportResponse(imported=out.imported, skipped=out.skipped)

    @unary
    async def BuildInjection(
        self, request: pb.MemoryServiceBuildInjectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.MemoryServiceBuildInjectionResponse:
        inj = await self.memory.build_injection(caller().tenant, request.agent_id)
        agent = request.agent_id
        return pb.MemoryServiceBuildInjectionResponse(
            pinned=[entry_pb(agent, e) for e in inj.pinned],
            topics=[topic_pb(t) for t in inj.topics],
            recent=[entry_pb(agent, e) for e in inj.recent],
            topics_text=inj.topics_text,
        )
