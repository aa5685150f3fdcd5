"""Which Python SDK calls are resent on UNAVAILABLE, and with what.

A write is resent only when the contract says a resend is safe: with its
request id (commit id, dedupe key), the same one on every attempt. A write
that takes a request id but is sent without one (`request_id=""`) is never
resent: its first attempt may have applied, and a resend would apply it a
second time (a second memory entry, a second journal record) or answer
against the caller's own write. The stubs here fail the first attempt with
UNAVAILABLE / PERSISTENCE_UNCERTAIN and record every request they get."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, message_factory
from google.rpc import error_details_pb2, status_pb2

import fencepost
from fencepost import errors, reasons
from fencepost.v1 import admin_pb2, journal_pb2, kv_pb2, ledger_pb2, memory_pb2, store_api_pb2

SERVICES = {
    "_kv": kv_pb2.DESCRIPTOR.services_by_name["KvService"],
    "_memory": memory_pb2.DESCRIPTOR.services_by_name["MemoryService"],
    "_journal": journal_pb2.DESCRIPTOR.services_by_name["JournalService"],
    "_store_api": store_api_pb2.DESCRIPTOR.services_by_name["StoreApiService"],
    "_ledger": ledger_pb2.DESCRIPTOR.services_by_name["LedgerService"],
    "_admin": admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
}


def _uncertain() -> grpc.aio.AioRpcError:
    info = error_details_pb2.ErrorInfo(reason=reasons.PERSISTENCE_UNCERTAIN, domain=reasons.DOMAIN)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="lost", details=[detail])
    trailer = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), trailer, details="lost")


class _FlakyStub:
    """Every method fails its first attempt, then answers its default response."""

    def __init__(self, service: Any, sent: list[Any]) -> None:
        self._service, self._sent = service, sent

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        output = message_factory.GetMessageClass(self._service.methods_by_name[name].output_type)

        async def method(request: Any, **_: Any) -> Any:
            self._sent.append(request)
            if len(self._sent) == 1:
                raise _uncertain()
            return output()

        return method


def _client(sent: list[Any]) -> fencepost.AsyncClient:
    c = fencepost.AsyncClient("127.0.0.1:1", retry=fencepost.RetryPolicy(initial_backoff=0.001), token="")
    for attr, service in SERVICES.items():
        setattr(c, attr, _FlakyStub(service, sent))
    return c


def _id(request: Any) -> str:
    for field in ("request_id", "commit_id", "dedupe_key"):
        if field in request.DESCRIPTOR.fields_by_name:
            return str(getattr(request, field))
    raise AssertionError(f"{request.DESCRIPTOR.name} has no request id")


RECORD = {"at": "2024-01-01T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}

# each takes `**kw` (the request id argument, when given)
WRITES: dict[str, Callable[..., Awaitable[Any]]] = {
    "put_if_absent": lambda c, **kw: c.put_if_absent("k", b"v", **kw),
    "put_if_version": lambda c, **kw: c.put_if_version("k", b"v", "1", **kw),
    "delete_if_version": lambda c, **kw: c.delete_if_version("k", "1", **kw),
    "txn": lambda c, **kw: c.txn([], [fencepost.put_op("k", b"v")], **kw),
    "memory_append": lambda c, **kw: c.memory_append("a", "fact", **kw),
    "memory_forget": lambda c, **kw: c.memory_forget("a", "mem_1", **kw),
    "memory_reassert_trust": lambda c, **kw: c.memory_reassert_trust("a", "mem_1", "own", **kw),
    "memory_pin": lambda c, **kw: c.memory_pin("a", "mem_1", **kw),
    "memory_unpin": lambda c, **kw: c.memory_unpin("a", "mem_1", **kw),
    "append_turn": lambda c, **kw: c.append_turn("a", RECORD, **kw),
    "store_call": lambda c, **kw: c.store_call("memory.append", {"agent": "a", "record": RECORD}, **kw),
}


@pytest.mark.parametrize("name", sorted(WRITES))
async def test_a_write_is_resent_with_the_request_id_it_was_first_sent_with(name: str) -> None:
    sent: list[Any] = []
    async with _client(sent) as c:
        await WRITES[name](c)
    assert len(sent) == 2
    assert _id(sent[0]) and _id(sent[0]) == _id(sent[1])


@pytest.mark.parametrize("name", sorted(WRITES))
async def test_a_write_sent_without_its_request_id_is_never_resent(name: str) -> None:
    sent: list[Any] = []
    async with _client(sent) as c:
        with pytest.raises(errors.PersistenceUncertain):
            await WRITES[name](c, request_id="")
    assert len(sent) == 1


OTHER_IDS: dict[str, Callable[..., Awaitable[Any]]] = {
    "commit": lambda c: c.commit("s", 1, 0, [b"r"]),
    "deliver with a dedupe key": lambda c: c.deliver(b"e", session_id="s", dedupe_key="d-1"),
    "erase_agent": lambda c: c.erase_agent("a"),
    "erase_tenant": lambda c: c.erase_tenant(),
}


@pytest.mark.parametrize("name", sorted(OTHER_IDS))
async def test_writes_keyed_otherwise_keep_their_key_across_attempts(name: str) -> None:
    sent: list[Any] = []
    async with _client(sent) as c:
        await OTHER_IDS[name](c)
    assert len(sent) == 2 and _id(sent[0]) and _id(sent[0]) == _id(sent[1])


async def test_a_delivery_without_a_dedupe_key_is_never_resent() -> None:
    sent: list[Any] = []
    async with _client(sent) as c:
        with pytest.raises(errors.PersistenceUncertain):
            await c.deliver(b"e", session_id="s")
    assert len(sent) == 1
