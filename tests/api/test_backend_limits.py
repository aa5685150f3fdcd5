"""Requests at the edges of DynamoDB's own limits (400 KB items, 1024-byte
sort keys, empty values, 4 MB transactions, large condition values, a long
tenant), answered alike on every backend: what one backend stores, every
backend stores; what one refuses, every backend refuses with the same typed
reason. DynamoDB would answer a request past its limits with a
ValidationException (an INTERNAL error), so each of these must be validated
before it is sent."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fencepost import reasons
from fencepost.v1 import (
    evals_pb2,
    evals_pb2_grpc,
    journal_pb2,
    journal_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    ledger_pb2,
    ledger_pb2_grpc,
)
from fencepost_server.storage import Storage
from tests.conftest import running

KIB = 1024
KEY_1024 = "é" * 512  # 1024 UTF-8 bytes: the key limit, and DynamoDB's sort key limit
TTL = duration_pb2.Duration(seconds=60)


def _reason(err: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    info = error_details_pb2.ErrorInfo()
    if status is not None:
        status.details[0].Unpack(info)
    return info.reason


def _put(key: str, value: bytes) -> kv_pb2.TxnOp:
    return kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key=key, value=value))


async def test_kv_at_dynamodbs_limits(storage: Storage) -> None:
    # a long tenant: every stored key is longer than the caller's
    async with running(storage, default_tenant="T" * 300) as srv, grpc.aio.insecure_channel(srv.target) as ch:
        kv = kv_pb2_grpc.KvServiceStub(ch)
        big = b"x" * (256 * KIB)
        await kv.Put(kv_pb2.PutRequest(key=KEY_1024, value=big, request_id="r" * 128))
        assert (await kv.Get(kv_pb2.GetRequest(key=KEY_1024))).value == big
        await kv.Put(kv_pb2.PutRequest(key="a/" * 512, value=b"v"))  # every byte of the key a partition head
        listed = await kv.ListKeys(kv_pb2.ListKeysRequest(prefix="a/" * 512))
        assert list(listed.keys) == ["a/" * 512]
        for key, rid in (("empty", ""), ("empty-rid", "rid-1")):  # an empty value is a value
            await kv.Put(kv_pb2.PutRequest(key=key, value=b"", request_id=rid))
            got = await kv.Get(kv_pb2.GetRequest(key=key))
            assert got.found and got.value == b""
        # conditions on a value as large as a value, and on an empty one
        done = await kv.Txn(kv_pb2.TxnRequest(
            compares=[kv_pb2.Compare(key=KEY_1024, value=big), kv_pb2.Compare(key="empty", value=b"")],
            success_ops=[_put("t1", b"y")],
        ))
        assert done.succeeded
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # 16 values at the limit, keys at the limit
            await kv.Txn(kv_pb2.TxnRequest(success_ops=[_put(f"{i:02d}" + "é" * 511, big) for i in range(16)]))
        assert _reason(refused.value) == reasons.TXN_TOO_LARGE
        assert not (await kv.Get(kv_pb2.GetRequest(key="00" + "é" * 511))).found


async def test_ledger_journal_and_evals_at_dynamodbs_limits(storage: Storage) -> None:
    async with running(storage) as srv, grpc.aio.insecure_channel(srv.target) as ch:
        ledger = ledger_pb2_grpc.LedgerServiceStub(ch)
        opened = await ledger.OpenSession(ledger_pb2.OpenSessionRequest(
            agent="é" * 128, session_key="k" * 1024, metadata={"m": "v" * 250 * KIB}))
        sid = opened.session.session_id
        gen = (await ledger.AcquireLease(ledger_pb2.AcquireLeaseRequest(
            session_id=sid, holder_id="h" * 1024, ttl=TTL))).lease.generation
        # many records as large as a record: one commit, far over one item
        records = [bytes([i]) * (250 * KIB) for i in range(6)]
        await ledger.Commit(ledger_pb2.CommitRequest(
            session_id=sid, generation=gen, expected_seq=0, records=records, commit_id="c" * 128))
        await ledger.Fork(ledger_pb2.ForkRequest(parent_session_id=sid, at_seq=6, child_session_key="f" * 1024))
        await ledger.Deliver(ledger_pb2.DeliverRequest(session_id=sid, payload=b"e" * 256 * KIB, dedupe_key="d" * 1024))
        read = [r.data async for page in ledger.ReadLog(ledger_pb2.ReadLogRequest(session_id=sid)) for r in page.records]
        assert read == records

        journal = journal_pb2_grpc.JournalServiceStub(ch)
        turn = journal_pb2.TurnRecord(at="t", session_id="s", channel_id="c",
                                      status=journal_pb2.TURN_STATUS_COMPLETED, result="r" * 15_000)
        for _ in range(30):  # a tail far larger than one item, folded into segments on read
            await journal.AppendTurn(journal_pb2.AppendTurnRequest(agent="j", record=turn))
        chunks = [r.chunk async for r in journal.ReadJournal(journal_pb2.ReadJournalRequest(agent="j"))]
        assert b"".join(chunks).count(b"\n") == 30

        evals = evals_pb2_grpc.EvalServiceStub(ch)
        snapshot = struct_pb2.Struct()
        snapshot.update({"x": "y" * (255 * KIB)})
        await evals.PutAbSnapshot(evals_pb2.PutAbSnapshotRequest(agent="a" * 65536, snapshot=snapshot))
        got = await evals.GetAbSnapshot(evals_pb2.GetAbSnapshotRequest(agent="a" * 65536))
        assert got.found and got.snapshot == snapshot
