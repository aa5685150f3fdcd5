"""MemoryService methods of the async client (`memory_*`).

Results are the generated messages (`fencepost.v1.memory_pb2`), so every
field the server adds is visible without an SDK release. Writes carry a
request id (one is generated when none is given), so a retried write
applies once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from ._call import paged
from .ids import new_request_id
from .v1 import memory_pb2 as pb
from .v1 import memory_pb2_grpc

KINDS = {"semantic": pb.MEMORY_KIND_SEMANTIC, "episodic": pb.MEMORY_KIND_EPISODIC,
         "procedural": pb.MEMORY_KIND_PROCEDURAL, "preference": pb.MEMORY_KIND_PREFERENCE}
TRUST = {"own": pb.MEMORY_TRUST_OWN, "operator": pb.MEMORY_TRUST_OPERATOR, "user": pb.MEMORY_TRUST_USER,
         "unknown": pb.MEMORY_TRUST_UNKNOWN, "external": pb.MEMORY_TRUST_EXTERNAL}
STRATEGIES = {"recency": pb.MEMORY_STRATEGY_RECENCY, "relevance": pb.MEMORY_STRATEGY_RELEVANCE,
              "hybrid": pb.MEMORY_STRATEGY_HYBRID}


def _rid(request_id: str | None) -> str:
    return request_id if request_id is not None else new_request_id()


def _resendable(request_id: str) -> bool:
    """A write sent without its request id (`request_id=""`) is never resent:
    its first attempt may have applied (a second Append would store the fact
    twice; the others would answer against the caller's own write)."""
    return bool(request_id)


def _timestamp(when: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when)
    return ts


class MemoryMethods:
    """Mixed into AsyncClient; `self._caller` and `self._memory` come from it."""

    _caller: Any
    _memory: memory_pb2_grpc.MemoryServiceStub

    async def memory_append(
        self,
        agent_id: str,
        content: str,
        *,
        kind: str | None = None,
        about: Sequence[str] = (),
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
        supersedes: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        trust: str | None = None,
        session_id: str = "",
        channel: str = "",
        request_id: str | None = None,
        **opts: Any,
    ) -> pb.MemoryEntry:
        """Remember a fact; returns the stored entry with its minted id."""
        req = pb.MemoryServiceAppendRequest(
            agent_id=agent_id, content=content, kind=KINDS[kind] if kind else 0, about=list(about),
            supersedes=supersedes or "", request_id=_rid(request_id),
            provenance=pb.MemoryProvenance(session_id=session_id, channel=channel, trust=TRUST[trust] if trust else 0),
        )
        if valid_from is not None:
            req.valid_from.CopyFrom(_timestamp(valid_from))
        if valid_until is not None:
            req.valid_until.CopyFrom(_timestamp(valid_until))
        if metadata:
            struct = struct_pb2.Struct()
            struct.update(dict(metadata))
            req.metadata.CopyFrom(struct)
        res = await self._caller.call(self._memory.Append, req, safe=_resendable(req.request_id), **opts)
        return res.entry

    async def memory_list(
        self, agent_id: str, *, limit: int = 0, all_validity: bool = False, page_size: int = 0,
        page_token: str = "", **opts: Any,
    ) -> pb.MemoryServiceListResponse:
        """Live entries, oldest first: bounded with `limit`, else one page."""
        req = pb.MemoryServiceListRequest(
            agent_id=agent_id, limit=limit, page_size=page_size, page_token=page_token,
            validity=pb.MEMORY_VALIDITY_FILTER_ALL if all_validity else pb.MEMORY_VALIDITY_FILTER_CURRENT,
        )
        return await self._caller.call(self._memory.List, req, safe=True, **opts)

    async def memory_list_all(
        self, agent_id: str, *, all_validity: bool = False, page_size: int = 0, **opts: Any
    ) -> AsyncIterator[pb.MemoryEntry]:
        """Every live entry, oldest first, fetched page by page."""
        async def page(token: str) -> tuple[list[pb.MemoryEntry], str]:
            res = await self.memory_list(agent_id, all_validity=all_validity, page_size=page_size,
                                         page_token=token, **opts)
            return list(res.entries), res.next_page_token

        async for entry in paged(page):
            yield entry

    async def memory_search(
        self, agent_id: str, query: str, *, limit: int = 0, strategy: str | None = None, **opts: Any
    ) -> pb.MemoryServiceSearchResponse:
        """Live entries matching every query token, ordered by `strategy`:
        "recency" (default, newest first), "relevance" (BM25) or "hybrid"."""
        req = pb.MemoryServiceSearchRequest(
            agent_id=agent_id, query=query, limit=limit, strategy=STRATEGIES[strategy] if strategy else 0
        )
        return await self._caller.call(self._memory.Search, req, safe=True, **opts)

    async def memory_forget(self, agent_id: str, entry_id: str, *, request_id: str | None = None, **opts: Any) -> bool:
        """Tombstone a live entry; False when there is none."""
        req = pb.MemoryServiceForgetRequest(agent_id=agent_id, id=entry_id, request_id=_rid(request_id))
        return (await self._caller.call(self._memory.Forget, req, safe=_resendable(req.request_id), **opts)).forgotten

    async def memory_audit(
        self, agent_id: str, *, page_size: int = 0, page_token: str = "", **opts: Any
    ) -> pb.MemoryServiceAuditResponse:
        """One page of every entry, tombstoned included, oldest first (operator role)."""
        req = pb.MemoryServiceAuditRequest(agent_id=agent_id, page_size=page_size, page_token=page_token)
        return await self._caller.call(self._memory.Audit, req, safe=True, **opts)

    async def memory_reassert_trust(
        self, agent_id: str, entry_id: str, trust: str, *, request_id: str | None = None, **opts: Any
    ) -> bool:
        """Relabel an entry (operator role); False when there is none."""
        req = pb.MemoryServiceReassertTrustRequest(
            agent_id=agent_id, id=entry_id, trust=TRUST[trust], request_id=_rid(request_id)
        )
        return (await self._caller.call(self._memory.ReassertTrust, req, safe=_resendable(req.request_id), **opts)).found

    async def memory_pin(
        self, agent_id: str, entry_id: str, *, request_id: str | None = None, **opts: Any
    ) -> pb.MemoryServicePinResponse:
        """Pin an entry; a refusal is `pinned = False` with a `reason`."""
        req = pb.MemoryServicePinRequest(agent_id=agent_id, id=entry_id, request_id=_rid(request_id))
        return await self._caller.call(self._memory.Pin, req, safe=_resendable(req.request_id), **opts)

    async def memory_unpin(self, agent_id: str, entry_id: str, *, request_id: str | None = None, **opts: Any) -> bool:
        req = pb.MemoryServiceUnpinRequest(agent_id=agent_id, id=entry_id, request_id=_rid(request_id))
        return (await self._caller.call(self._memory.Unpin, req, safe=_resendable(req.request_id), **opts)).unpinned

    async def memory_pinned(
        self, agent_id: str, *, allocated: bool = False, **opts: Any
    ) -> pb.MemoryServicePinnedResponse:
        """The pinned set in pin order (`allocated`: every pin holding budget)."""
        req = pb.MemoryServicePinnedRequest(
            agent_id=agent_id,
            include=pb.MEMORY_PINNED_INCLUDE_ALLOCATED if allocated else pb.MEMORY_PINNED_INCLUDE_CURRENT,
        )
        return await self._caller.call(self._memory.Pinned, req, safe=True, **opts)

    async def memory_topics(self, agent_id: str, **opts: Any) -> list[pb.MemoryTopic]:
        req = pb.MemoryServiceTopicsRequest(agent_id=agent_id)
        return list((await self._caller.call(self._memory.Topics, req, safe=True, **opts)).topics)

    async def memory_import(
        self, agent_id: str, entries: Sequence[pb.MemoryEntry], **opts: Any
    ) -> pb.MemoryServiceImportResponse:
        """Load entries verbatim (operator role); a re-run is a no-op."""
        req = pb.MemoryServiceImportRequest(agent_id=agent_id, entries=list(entries))
        return await self._caller.call(self._memory.Import, req, safe=True, **opts)

    async def memory_injection(self, agent_id: str, **opts: Any) -> pb.MemoryServiceBuildInjectionResponse:
        """The pinned core, topic index and recency tail a turn injects."""
        req = pb.MemoryServiceBuildInjectionRequest(agent_id=agent_id)
        return await self._caller.call(self._memory.BuildInjection, req, safe=True, **opts)
