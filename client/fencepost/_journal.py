"""JournalService and StoreApiService methods of the async client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ._call import paged
from .ids import new_request_id
from .journal import MAX_RECORD_BYTES, check_record_size, record_from_dict
from .v1 import journal_pb2, journal_pb2_grpc, store_api_pb2, store_api_pb2_grpc


@dataclass(frozen=True, slots=True)
class JournalContent:
    """A journal's JSONL bytes (one record per line, in record id order)."""

    data: bytes
    size_bytes: int
    record_count: int

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.data.splitlines() if line]


@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    name: str
    size_bytes: int
    record_count: int
    rotate_time: datetime


Record = Mapping[str, Any] | journal_pb2.TurnRecord


def _record(record: Record) -> journal_pb2.TurnRecord:
    return record if isinstance(record, journal_pb2.TurnRecord) else record_from_dict(record)


class JournalMethods:
    """Mixed into AsyncClient; `self._caller` comes from it."""

    _caller: Any
    _journal: journal_pb2_grpc.JournalServiceStub
    _store_api: store_api_pb2_grpc.StoreApiServiceStub

    async def append_turn(
        self, agent: str, record: Record, *, request_id: str | None = None, **opts: Any
    ) -> str:
        """Journal one turn record (a `TurnRecord` or its JSON form, e.g.
        `{"at", "sessionId", "channelId", "status", ..., **extra}`); returns
        the server-assigned record id. Over 16 KiB of compact JSON raises
        `RecordTooLarge` without sending. Retried with one request id, so a
        retry after an ambiguous failure is journaled once."""
        pb = _record(record)
        check_record_size(pb, MAX_RECORD_BYTES)
        req = journal_pb2.AppendTurnRequest(
            agent=agent, record=pb, request_id=request_id if request_id is not None else new_request_id()
        )
        # without its request id (`request_id=""`) a resend could journal it twice
        return (await self._caller.call(self._journal.AppendTurn, req, safe=bool(req.request_id), **opts)).record_id

    async def read_journal(self, agent: str, **opts: Any) -> JournalContent | None:
        """The agent's live journal (flush-on-read: every append acked before
        this call is in it), or None when the agent never appended."""
        parts: list[bytes] = []
        size = count = 0
        async for msg in self._caller.stream(self._journal.ReadJournal, journal_pb2.ReadJournalRequest(agent=agent), **opts):
            if not msg.found:
                return None
            parts.append(msg.chunk)
            size, count = msg.size_bytes, msg.record_count
        return JournalContent(b"".join(parts), size, count)

    async def list_archives_page(
        self, agent: str, *, page_size: int = 0, page_token: str = "", **opts: Any
    ) -> tuple[list[ArchiveEntry], str]:
        req = journal_pb2.ListArchivesRequest(agent=agent, page_size=page_size, page_token=page_token)
        res = await self._caller.call(self._journal.ListArchives, req, safe=True, **opts)
        out = [
            ArchiveEntry(a.name, a.size_bytes, a.record_count, a.rotate_time.ToDatetime(tzinfo=timezone.utc))
            for a in res.archives
        ]
        return out, res.next_page_token

    async def list_archives(self, agent: str, *, page_size: int = 0, **opts: Any) -> AsyncIterator[ArchiveEntry]:
        """Every rotated journal of `agent`, oldest first."""
        async for entry in paged(lambda token: self.list_archives_page(
            agent, page_size=page_size, page_token=token, **opts
        )):
            yield entry

    async def read_archive(self, agent: str, name: str, **opts: Any) -> JournalContent:
        """One rotated journal (ArchiveNotFound when there is none of that name)."""
        parts: list[bytes] = []
        size = count = 0
        req = journal_pb2.ReadArchiveRequest(agent=agent, name=name)
        async for msg in self._caller.stream(self._journal.ReadArchive, req, **opts):
            parts.append(msg.chunk)
            size, count = msg.size_bytes, msg.record_count
        return JournalContent(b"".join(parts), size, count)

    async def store_call(
        self, call: str, payload: Mapping[str, Any], *, v: int = 1, request_id: str | None = None, **opts: Any
    ) -> dict[str, Any]:
        """The envelope lane: `{v, call, payload}` in, `{v, ok, ...}` out, as
        in seed 000. `memory.append` answers `{v, ok, recordId}`,
        `memory.read` answers `{v, ok, journal}` with `journal` None or
        `{"jsonl": str, "sizeBytes": int, "recordCount": int}`."""
        req = store_api_pb2.CallRequest(v=v, call=call)
        if call == "memory.append":
            pb = _record(payload["record"])
            check_record_size(pb, MAX_RECORD_BYTES)
            req.memory_append.CopyFrom(store_api_pb2.MemoryAppendPayload(agent=payload["agent"], record=pb))
            req.request_id = request_id if request_id is not None else new_request_id()
        elif call == "memory.read":
            req.memory_read.CopyFrom(store_api_pb2.MemoryReadPayload(agent=payload["agent"]))
        # memory.append is resent only with its request id (as AppendTurn); memory.read is a read
        safe = call != "memory.append" or bool(req.request_id)
        res = await self._caller.call(self._store_api.Call, req, safe=safe, **opts)
        out: dict[str, Any] = {"v": res.v, "ok": res.ok}
        if res.WhichOneof("result") == "memory_append":
            out["recordId"] = res.memory_append.record_id
        elif res.WhichOneof("result") == "memory_read":
            j = res.memory_read.journal if res.memory_read.HasField("journal") else None
            out["journal"] = None if j is None else {
                "jsonl": j.jsonl.decode("utf-8"), "sizeBytes": j.size_bytes, "recordCount": j.record_count,
            }
        return out
