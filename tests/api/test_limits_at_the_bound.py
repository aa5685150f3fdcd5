"""Every documented limit, over gRPC on every backend: a request exactly at the
bound is served, one byte (or one item) past it is INVALID_ARGUMENT with the
documented reason, a BadRequest violation naming the field, metadata `limit`
and `size`, and writes nothing. Sizes are counted in UTF-8 bytes, so the
strings straddle the bound with a two-byte character where that matters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2

from fencepost import reasons
from fencepost.v1 import journal_pb2, kv_pb2
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage import Item, Storage
from tests.api.security_support import Rpc, secs, write_tokens

KIB = 1024


@dataclass
class Refusal:
    code: str
    reason: str
    domain: str
    fields: list[str]
    limit: str
    size: str


async def _refusal(rpc: Rpc, name: str, fields: dict[str, Any]) -> Refusal | None:
    try:
        await rpc(name, **fields)
    except grpc.aio.AioRpcError as exc:
        info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
        raw = dict(exc.trailing_metadata() or ()).get("grpc-status-details-bin")
        for detail in status_pb2.Status.FromString(raw).details if raw else ():
            detail.Unpack(info) or detail.Unpack(bad)
        return Refusal(exc.code().name, info.reason, info.domain, [v.field for v in bad.field_violations],
                       info.metadata.get("limit", ""), info.metadata.get("size", ""))
    return None


async def _snapshot(storage: Storage) -> list[Item]:
    return await storage.list("", None, 1_000_000)


def _turn(message: str) -> journal_pb2.TurnRecord:
    return journal_pb2.TurnRecord(at="2026-01-01T00:00:00Z", session_id="s", channel_id="c",
                                  status=journal_pb2.TURN_STATUS_COMPLETED, user_message=message)


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


@pytest.fixture
async def operator(tmp_path: Path, storage: Storage) -> AsyncIterator[Rpc]:
    app = App(Settings(listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json")), storage=storage)
    await app.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}",
                                         options=[("grpc.max_send_message_length", -1)]) as channel:
        yield Rpc(channel, "token-operator-a")
    await app.stop(grace=0.2)


async def test_each_limit_takes_its_bound_and_refuses_one_past_it(operator: Rpc, storage: Storage) -> None:
    rpc = operator
    sid = (await rpc("LedgerService/OpenSession", agent="ag", session_key="main")).session.session_id
    gen = (await rpc("LedgerService/AcquireLease", session_id=sid, holder_id="h", ttl=secs(600))).lease.generation
    seq = 0

    def commit(records: list[bytes]) -> dict[str, Any]:
        return {"session_id": sid, "generation": gen, "expected_seq": seq, "records": records}

    def put(n: int) -> list[kv_pb2.TxnOp]:
        return [kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key=f"t/{i}", value=b"v")) for i in range(n)]

    # (name, rpc, request at the bound, request one past it, reason, field, limit)
    cases: list[tuple[str, str, Any, Any, str, str, int]] = [
        ("kv key", "KvService/Put", {"key": "é" * 512, "value": b"v"}, {"key": "é" * 512 + "x", "value": b"v"},
         reasons.KEY_TOO_LONG, "key", 1024),
        ("kv value", "KvService/Put", {"key": "v", "value": b"x" * 256 * KIB},
         {"key": "v", "value": b"x" * (256 * KIB + 1)}, reasons.VALUE_TOO_LARGE, "value", 256 * KIB),
        ("kv prefix", "KvService/List", {"prefix": "é" * 512}, {"prefix": "é" * 512 + "x"},
         reasons.KEY_TOO_LONG, "prefix", 1024),
        ("txn ops", "KvService/Txn", {"success_ops": put(100)}, {"success_ops": put(101)},
         reasons.TXN_TOO_LARGE, "success_ops", 100),
        ("agent", "LedgerService/OpenSession", {"agent": "é" * 128, "session_key": "k"},
         {"agent": "é" * 128 + "x", "session_key": "k"}, reasons.FIELD_INVALID, "agent", 256),
        ("session key", "LedgerService/OpenSession", {"agent": "ag", "session_key": "é" * 512},
         {"agent": "ag", "session_key": "é" * 512 + "x"}, reasons.FIELD_INVALID, "session_key", 1024),
        ("event", "LedgerService/Deliver", {"session_id": sid, "payload": b"e" * 256 * KIB},
         {"session_id": sid, "payload": b"e" * (256 * KIB + 1)}, reasons.EVENT_TOO_LARGE, "payload", 256 * KIB),
        ("records per commit", "LedgerService/Commit", "commit:64", "commit:65",
         reasons.COMMIT_TOO_LARGE, "records", 64),
        ("record", "LedgerService/Commit", "record:262144", "record:262145",
         reasons.RECORD_TOO_LARGE, "records", 256 * KIB),
        ("fork key", "LedgerService/Fork", {"parent_session_id": sid, "at_seq": 0, "child_session_key": "ff" + "é" * 511},
         {"parent_session_id": sid, "at_seq": 0, "child_session_key": "ff" + "é" * 511 + "x"},
         reasons.FIELD_INVALID, "child_session_key", 1024),
        ("content", "MemoryService/Append", {"agent_id": "ag", "content": "é" * 2048},
         {"agent_id": "ag", "content": "é" * 2048 + "x"}, reasons.CONTENT_TOO_LARGE, "content", 4096),
        ("about keys", "MemoryService/Append", {"agent_id": "ag", "content": "c", "about": [f"k{i}" for i in range(12)]},
         {"agent_id": "ag", "content": "c", "about": [f"k{i}" for i in range(13)]},
         reasons.ABOUT_TOO_LARGE, "about", 12),
        ("about bytes", "MemoryService/Append", {"agent_id": "ag", "content": "c", "about": ["é" * 128, "b" * 256]},
         {"agent_id": "ag", "content": "c", "about": ["é" * 128, "b" * 257]}, reasons.ABOUT_TOO_LARGE, "about", 512),
        # AIP-155 request ids: characters, on every service that takes one
        ("kv request id", "KvService/Put", {"key": "rq", "value": b"v", "request_id": "é" * 128},
         {"key": "rq", "value": b"v", "request_id": "é" * 129}, reasons.FIELD_INVALID, "request_id", 128),
        ("memory request id", "MemoryService/Append", {"agent_id": "ag", "content": "c", "request_id": "m" * 128},
         {"agent_id": "ag", "content": "c", "request_id": "m" * 129}, reasons.FIELD_INVALID, "request_id", 128),
        ("journal request id", "JournalService/AppendTurn",
         {"agent": "ag", "record": _turn("u"), "request_id": "j" * 128},
         {"agent": "ag", "record": _turn("u"), "request_id": "j" * 129}, reasons.FIELD_INVALID, "request_id", 128),
    ]
    # Limits on a whole record: the overhead is learnt from one refusal, then the bound is hit exactly.
    measured: list[tuple[str, str, Any, int, str, str]] = [
        ("journal record", "JournalService/AppendTurn", lambda n: {"agent": "ag", "record": _turn("u" * n)},
         16 * KIB, reasons.RECORD_TOO_LARGE, "record"),
        ("memory record", "MemoryService/Append",
         lambda n: {"agent_id": "ag", "content": "c", "metadata": _struct({"m": "v" * n})},
         16320, reasons.RECORD_TOO_LARGE, "metadata"),
    ]
    for name, method, build, limit, reason, field in measured:
        probe = await _refusal(rpc, method, build(limit))
        assert probe is not None and probe.size, name
        filler = 2 * limit - int(probe.size)  # size grows by one per filler byte
        cases.append((name, method, build(filler), build(filler + 1), reason, field, limit))
    # The session's record holds its creation time, whose printed length varies by a few
    # bytes: its bound is met within that much.
    session = lambda n: {"agent": "ag", "session_key": f"meta-{n:08d}", "metadata": _struct({"m": "v" * n})}  # noqa: E731
    probe = await _refusal(rpc, "LedgerService/OpenSession", session(256 * KIB))
    assert probe is not None and probe.size
    filler = 2 * 256 * KIB - int(probe.size)
    assert await _refusal(rpc, "LedgerService/OpenSession", session(filler - 32)) is None
    refused = await _refusal(rpc, "LedgerService/OpenSession", session(filler + 32))
    assert refused is not None and (refused.reason, refused.fields, refused.limit) == (
        reasons.FIELD_INVALID, ["metadata"], str(256 * KIB))
    # last: the erasure it starts runs on in the background
    cases.append(("erased agent", "AdminService/EraseAgent", {"agent": "é" * 32768}, {"agent": "é" * 32768 + "x"},
                  reasons.AGENT_NAME_INVALID, "agent", 65536))

    wrong: dict[str, Any] = {}
    for name, method, at_bound, past, reason, field, limit in cases:
        if isinstance(at_bound, str):  # a commit: built against the head as it is now
            kind, _, n = at_bound.partition(":")
            at_bound = commit([b"r"] * int(n) if kind == "commit" else [b"r" * int(n)])
            kind, _, n = past.partition(":")
            past = commit([b"r"] * int(n) if kind == "commit" else [b"r" * int(n)])
        before = await _snapshot(storage)
        refused = await _refusal(rpc, method, past)
        if await _snapshot(storage) != before:
            wrong[f"{name}: past the bound"] = "wrote"
        expected = Refusal("INVALID_ARGUMENT", reason, reasons.DOMAIN, [field], str(limit), str(limit + 1))
        if refused != expected:
            wrong[f"{name}: past the bound"] = refused
        served = await _refusal(rpc, method, at_bound)
        if served is not None:
            wrong[f"{name}: at the bound"] = served
        elif method == "LedgerService/Commit":
            seq = (await rpc("LedgerService/GetSession", session_id=sid)).session.seq
    assert wrong == {}
