"""JournalService and StoreApiService: two lanes over one `Journal`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from fencepost.journal import record_parts
from fencepost.v1 import journal_pb2, journal_pb2_grpc, store_api_pb2, store_api_pb2_grpc

from ..domain.journal import ArchiveInfo, Journal, check_agent, check_envelope
from .base import Authenticator, RpcObserver, ServicerBase, caller, server_stream, unary
from .fields import check_json_struct


def _archive(info: ArchiveInfo) -> journal_pb2.Archive:
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(info.rotated_ms)
    return journal_pb2.Archive(name=info.name, size_bytes=info.size, record_count=info.records, rotate_time=ts)


def _record(record: journal_pb2.TurnRecord, field: str) -> tuple[dict[str, Any], dict[str, Any]]:
    for name in ("usage", "extra"):
        check_json_struct(getattr(record, name), f"{field}.{name}")
    return record_parts(record)


class JournalServicer(ServicerBase, journal_pb2_grpc.JournalServiceServicer):
    def __init__(self, journal: Journal, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.journal = journal

    @unary
    async def AppendTurn(
        self, request: journal_pb2.AppendTurnRequest, context: grpc.aio.ServicerContext
    ) -> journal_pb2.AppendTurnResponse:
        check_agent(request.agent, "agent")  # spec order: the agent before the record's Structs
        fields, extra = _record(request.record, "record")
        record_id = await self.journal.append(caller().tenant, request.agent, fields, extra, request.request_id)
        return journal_pb2.AppendTurnResponse(record_id=record_id)

    @server_stream
    async def ReadJournal(
        self, request: journal_pb2.ReadJournalRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[journal_pb2.ReadJournalResponse]:
        view = await self.journal.read(caller().tenant, request.agent)
        if view is None:
            yield journal_pb2.ReadJournalResponse(found=False)
            return
        for chunk in view.chunks():
            yield journal_pb2.ReadJournalResponse(
                found=True, size_bytes=view.size, record_count=view.records, chunk=chunk
            )

    @unary
    async def ListArchives(
        self, request: journal_pb2.ListArchivesRequest, context: grpc.aio.ServicerContext
    ) -> journal_pb2.ListArchivesResponse:
        page = await self.journal.list_archives(caller().tenant, request.agent, request.page_size, request.page_token)
        return journal_pb2.ListArchivesResponse(
            archives=[_archive(a) for a in page.archives], next_page_token=page.next_page_token
        )

    @server_stream
    async def ReadArchive(
        self, request: journal_pb2.ReadArchiveRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[journal_pb2.ReadArchiveResponse]:
        _info, view = await self.journal.read_archive(caller().tenant, request.agent, request.name)
        for chunk in view.chunks():
            yield journal_pb2.ReadArchiveResponse(size_bytes=view.size, record_count=view.records, chunk=chunk)


class StoreApiServicer(ServicerBase, store_api_pb2_grpc.StoreApiServiceServicer):
    def __init__(self, journal: Journal, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.journal = journal

    @unary
    async def Call(self, request: store_api_pb2.CallRequest, context: grpc.aio.ServicerContext) -> store_api_pb2.CallResponse:
        payload = request.WhichOneof("payload")
        check_envelope(request.v, request.call, payload)
        tenant = caller().tenant
        if payload == "memory_append":
            body = request.memory_append
            check_agent(body.agent, "memory_append.agent")  # spec order: the agent before the record's Structs
            fields, extra = _record(body.record, "memory_append.record")
            record_id = await self.journal.append(
                tenant, body.agent, fields, extra, request.request_id, field_prefix="memory_append."
            )
            return store_api_pb2.CallResponse(
                v=request.v, ok=True, memory_append=store_api_pb2.MemoryAppendResult(record_id=record_id)
            )
        view = await self.journal.read(tenant, request.memory_read.agent, field="memory_read.agent")
        if view is None:
            result = store_api_pb2.MemoryReadResult()  # journal unset = null
        else:
            result = store_api_pb2.MemoryReadResult(
                journal=store_api_pb2.Journal(jsonl=view.data, size_bytes=view.size, record_count=view.records)
            )
        return store_api_pb2.CallResponse(v=request.v, ok=True, memory_read=result)
