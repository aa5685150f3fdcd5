"""Hostile input, exactly answered: one regression test per defect the wire
fuzz suite (tests/fuzz) and a black-box review found, on every backend.

Wire-level cases go over a raw channel (identity serializers), so the server
sees exactly the bytes sent; every refusal is checked to write nothing.
"""

from __future__ import annotations

import base64
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2
from google.rpc import error_details_pb2, status_pb2

import fencepost
from fencepost import errors, reasons
from fencepost.v1 import admin_pb2, evals_pb2, journal_pb2, kv_pb2, ledger_pb2, memory_pb2, schedule_pb2, store_api_pb2
from fencepost_server.domain.kv import KvStore
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.memory import MemoryStore
from fencepost_server.domain.memory.store import NewEntry
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import Item, Storage, TxnResult
from tests.conftest import RunningServer, running

from .test_schedule_api import FakeClock, _held

BAD_UTF8 = b"\xed\xa0\x80\xff"  # an encoded surrogate, then a byte UTF-8 never uses


class Refusal:
    def __init__(self, code: grpc.StatusCode, status: status_pb2.Status | None) -> None:
        self.code = code
        self.info = error_details_pb2.ErrorInfo()
        self.fields: list[str] = []
        for detail in status.details if status else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                detail.Unpack(self.info)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                self.fields += [v.field for v in bad.field_violations]


async def raw_call(srv: RunningServer, method: str, data: bytes) -> tuple[bytes | None, Refusal | None]:
    """One unary call with identity serializers: (response bytes, None) or (None, refusal)."""
    async with grpc.aio.insecure_channel(srv.target) as channel:
        try:
            return await channel.unary_unary(method)(data, timeout=30), None
        except grpc.aio.AioRpcError as err:
            raw = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin")
            return None, Refusal(err.code(), status_pb2.Status.FromString(raw) if raw else None)


async def snapshot(storage: Storage) -> list[Item]:
    return await storage.list("", None, 1_000_000)


def swap(data: bytes, placeholder: str) -> bytes:
    """`data` with a same-length placeholder string replaced by invalid UTF-8."""
    marker = placeholder.encode()
    assert len(marker) == len(BAD_UTF8) and marker in data
    return data.replace(marker, BAD_UTF8)


# -- 1: invalid UTF-8 in a string field ------------------------------------------------
async def test_invalid_utf8_is_a_documented_refusal_naming_the_field(storage: Storage) -> None:
    async with running(storage) as srv:
        before = await snapshot(storage)
        cases = [
            ("/fencepost.v1.KvService/Put", kv_pb2.PutRequest(key="QQQQ", value=b"v"),
             reasons.KEY_INVALID, "key"),
            ("/fencepost.v1.KvService/Get", kv_pb2.GetRequest(key="QQQQ"), reasons.KEY_INVALID, "key"),
            ("/fencepost.v1.KvService/Txn",
             kv_pb2.TxnRequest(success_ops=[kv_pb2.TxnOp(delete_key="a"),
                                            kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="QQQQ"))]),
             reasons.KEY_INVALID, "success_ops[1].put.key"),
            ("/fencepost.v1.LedgerService/GetSession", ledger_pb2.GetSessionRequest(session_id="QQQQ"),
             reasons.FIELD_INVALID, "session_id"),
            ("/fencepost.v1.JournalService/AppendTurn",
             journal_pb2.AppendTurnRequest(agent="a", record=journal_pb2.TurnRecord(at="QQQQ")),
             reasons.FIELD_INVALID, "record.at"),
        ]
        for method, msg, reason, field in cases:
            _, refusal = await raw_call(srv, method, swap(msg.SerializeToString(), "QQQQ"))
            assert refusal is not None, method
            assert (refusal.code, refusal.info.reason, refusal.info.domain) == (
                grpc.StatusCode.INVALID_ARGUMENT, reason, reasons.DOMAIN), method
            assert refusal.fields == [field], method
        _, refusal = await raw_call(srv, "/fencepost.v1.KvService/Put", b"\x0a\x05ab")  # truncated
        assert refusal is not None and (refusal.code, refusal.info.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT, reasons.FIELD_INVALID)
        assert await snapshot(storage) == before


# -- 2 and 9: schedule records the decoder must refuse ------------------------------------
def _create_record(n: int, prompt_json: str, scheduled_at: int = 1) -> bytes:
    return (
        '{"record":{"v":1,"type":"create","id":"rem_%d","kind":"after","prompt":%s,'
        '"after_seconds":5,"scheduled_at":%d},"stream":"schedule/change"}' % (n, prompt_json, scheduled_at)
    ).encode()


async def test_schedule_records_that_cannot_be_served_are_rejected(storage: Storage) -> None:
    clock = FakeClock()
    async with running(storage, schedule_clock=clock, schedule_watch_seconds=0.05) as srv, \
            srv.client(timeout=10) as c:
        sid, gen = await _held(c, "hostile")
        records = [
            _create_record(1, '"\\ud800x"'),  # a lone surrogate: no proto string can carry it
            _create_record(2, '"ok \\udfff"'),
            _create_record(3, '"too late"', 253_402_300_800_000),  # 10000-01-01
            _create_record(4, '"fine"'),
        ]
        await c.commit(sid, gen, 0, records)
        page = schedule_pb2.ListRemindersResponse.FromString(
            (await raw_call(srv, "/fencepost.v1.ScheduleService/ListReminders",
                            schedule_pb2.ListRemindersRequest(session_id=sid).SerializeToString()))[0] or b""
        )
        assert [r.id for r in page.reminders] == ["rem_4"]
        assert [r.seq for r in page.rejected_records] == [1, 2, 3]
        assert [r.id async for r in c.due_reminders(sid)] == ["rem_4"]
        async for r in c.watch_due(sid, gen):  # the stream serves past the rejected records
            assert r.id == "rem_4"
            break


async def test_a_record_nested_too_deep_to_parse_does_not_break_the_schedule(storage: Storage) -> None:
    """A committed record tagged with the schedule stream but nested deeper than
    the JSON parser goes made every schedule read of the session INTERNAL."""
    clock = FakeClock()
    async with running(storage, schedule_clock=clock, schedule_watch_seconds=0.05) as srv, \
            srv.client(timeout=10) as c:
        sid, gen = await _held(c, "deep")
        deep = b'{"stream":"schedule/change","record":' + b"[" * 10_000 + b"]" * 10_000 + b"}"
        await c.commit(sid, gen, 0, [deep, _create_record(2, '"fine"')])
        await c.create_reminder(sid, gen, "later", after_seconds=60)
        page, refusal = await raw_call(srv, "/fencepost.v1.ScheduleService/ListReminders",
                                       schedule_pb2.ListRemindersRequest(session_id=sid).SerializeToString())
        assert refusal is None, (refusal.code, refusal.info.reason)
        assert [r.id for r in schedule_pb2.ListRemindersResponse.FromString(page or b"").reminders] == [
            "rem_2", "rem_3"]
        assert [r.id async for r in c.due_reminders(sid)] == ["rem_2"]
        async for r in c.watch_due(sid, gen):
            assert r.id == "rem_2"
            break


async def test_after_seconds_past_year_9999_is_refused(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "far")
        with pytest.raises(errors.ReminderInvalid):
            await c.create_reminder(sid, gen, "never", after_seconds=2**53 - 1)
        assert (await c.get_session(sid)).seq == 0  # nothing written


async def test_watch_due_pushes_earliest_target_first(storage: Storage) -> None:
    clock = FakeClock()
    async with running(storage, schedule_clock=clock, schedule_watch_seconds=0.05) as srv, \
            srv.client(timeout=10) as c:
        sid, gen = await _held(c, "order")
        for after in (300, 100, 200):  # ids in creation order, targets not
            await c.create_reminder(sid, gen, f"in {after}", after_seconds=after)
        clock.now += 1000  # all three due at once
        seen = []
        async for r in c.watch_due(sid, gen):
            seen.append(r.id)
            if len(seen) == 3:
                break
        assert seen == ["rem_2", "rem_3", "rem_1"]


def _struct(value: object) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.fields["x"].list_value.values.add().CopyFrom(struct_pb2.Value(**value))  # type: ignore[arg-type]
    return s


async def test_caller_json_that_json_cannot_carry_is_refused_on_every_path(storage: Storage) -> None:
    """A surrogate (as its UTF-8-like bytes) or NaN / Infinity inside any
    caller JSON object: evals, memory metadata, journal and store API records."""
    def requests(s: struct_pb2.Struct) -> list[tuple[str, object, str]]:
        record = journal_pb2.TurnRecord(at="t", session_id="s", channel_id="c", status=1, extra=s)
        return [
            ("/fencepost.v1.EvalService/PutAbSnapshot", evals_pb2.PutAbSnapshotRequest(agent="a", snapshot=s),
             "snapshot"),
            ("/fencepost.v1.EvalService/PutEvalRun",
             evals_pb2.PutEvalRunRequest(agent="a", run_id="r", snapshot=s), "snapshot"),
            ("/fencepost.v1.MemoryService/Append",
             memory_pb2.MemoryServiceAppendRequest(agent_id="a", content="c", metadata=s), "metadata"),
            ("/fencepost.v1.JournalService/AppendTurn", journal_pb2.AppendTurnRequest(agent="a", record=record),
             "record.extra"),
            ("/fencepost.v1.StoreApiService/Call", store_api_pb2.CallRequest(
                v=1, call="memory.append",
                memory_append=store_api_pb2.MemoryAppendPayload(agent="a", record=record)),
             "memory_append.record.extra"),
        ]

    async with running(storage) as srv:
        before = await snapshot(storage)
        for bad in ({"number_value": float("nan")}, {"number_value": float("-inf")}, {"string_value": "QQQQ"}):
            for method, msg, field in requests(_struct(bad)):
                data = msg.SerializeToString()  # type: ignore[attr-defined]
                if "string_value" in bad:
                    data = swap(data, "QQQQ")  # what a "\ud800" escape becomes when sent as UTF-8 anyway
                _, refusal = await raw_call(srv, method, data)
                assert refusal is not None, (method, bad)
                assert (refusal.code, refusal.info.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                               reasons.FIELD_INVALID), (method, bad)
                assert refusal.fields and refusal.fields[0].startswith(field), (method, bad, refusal.fields)
        assert await snapshot(storage) == before


async def test_session_names_and_metadata_are_bounded_on_every_backend(storage: Storage) -> None:
    """Found by the fuzz suite on the DynamoDB emulator: a 1 MiB session_key (or
    a long agent, part of every session id) made keys or items DynamoDB cannot
    hold, answered INTERNAL there and accepted elsewhere."""
    async with running(storage) as srv:
        ok, _ = await raw_call(srv, "/fencepost.v1.LedgerService/OpenSession", ledger_pb2.OpenSessionRequest(
            agent="é" * 128, session_key="k" * 1024, metadata={"m": "v" * 200_000}).SerializeToString())
        assert ok is not None  # at the limits
        before = await snapshot(storage)
        for msg, field, limit in (
            (ledger_pb2.OpenSessionRequest(agent="a" * 257, session_key="s"), "agent", 256),
            (ledger_pb2.OpenSessionRequest(agent="a", session_key="s" * (1 << 20)), "session_key", 1024),
            (ledger_pb2.OpenSessionRequest(agent="a", session_key="s", metadata={"m": "v" * 300_000}),
             "metadata", 256 * 1024),
        ):
            _, refusal = await raw_call(srv, "/fencepost.v1.LedgerService/OpenSession", msg.SerializeToString())
            assert refusal is not None and (refusal.info.reason, refusal.fields) == (reasons.FIELD_INVALID, [field])
            assert refusal.info.metadata["limit"] == str(limit)
        assert await snapshot(storage) == before


# -- 3: the Txn operation limit ------------------------------------------------------------
async def test_txn_limit_is_100_operations_everywhere(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=30) as c:
        ops = [fencepost.put_op(f"t/{i:03d}", b"v") for i in range(100)]
        assert (await c.txn(success=ops, request_id="")).succeeded  # exactly the documented limit
        before = await snapshot(storage)
        for extra, request_id in ((ops + [fencepost.put_op("t/100", b"v")], ""), (ops[:99], "rq-txn")):
            with pytest.raises(errors.FencepostError) as err:
                await c.txn(success=extra, request_id=request_id)
            assert err.value.reason == reasons.TXN_TOO_LARGE
            assert err.value.metadata["limit"] == "100"
            assert err.value.metadata["size"] == "101"  # a request id's marker counts as 2
        assert await snapshot(storage) == before
        assert (await c.txn(success=ops[:98], request_id="rq-98")).succeeded


async def test_txn_over_the_limit_by_its_compares_alone_names_compares(storage: Storage) -> None:
    """The compares count in every branch: when they alone are over the limit
    (no op in either branch), the field to shrink is `compares`, not an empty
    branch; when a branch tips the count over, it is that branch."""
    async with running(storage) as srv, srv.client(timeout=30) as c:
        checks = [fencepost.compare(f"c/{i:03d}", exists=False) for i in range(101)]
        for compares, success, field in ((checks, [], "compares"), (checks[:99], [], "compares"),
                                         (checks[:50], [fencepost.put_op(f"t/{i}", b"v") for i in range(51)],
                                          "success_ops")):
            rid = "rq" if len(compares) == 99 else ""
            with pytest.raises(errors.FencepostError) as err:
                await c.txn(compares, success, request_id=rid)
            assert (err.value.reason, list(err.value.field_violations)) == (reasons.TXN_TOO_LARGE, [field])


# -- 4: COMMIT_TOO_LARGE names the limit, the size and the field ---------------------------
async def test_commit_too_large_carries_limit_size_and_field(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "big")
        before = await snapshot(storage)
        for request, field, limit, size in (
            (ledger_pb2.CommitRequest(session_id=sid, generation=gen, records=[b"r"] * 65), "records", 64, 65),
            (ledger_pb2.CommitRequest(session_id=sid, generation=gen, consume_inbox_ids=[f"i{n}" for n in range(33)]),
             "consume_inbox_ids", 32, 33),
        ):
            _, refusal = await raw_call(srv, "/fencepost.v1.LedgerService/Commit", request.SerializeToString())
            assert refusal is not None and refusal.info.reason == reasons.COMMIT_TOO_LARGE
            assert (refusal.info.metadata["limit"], refusal.info.metadata["size"]) == (str(limit), str(size))
            assert refusal.fields == [field]
        assert await snapshot(storage) == before


async def _commits_near_the_byte_limit(storage: Storage) -> list[tuple[int, str]]:
    """(margin, outcome) of 16-record commits whose records total 4 MiB
    minus `margin` bytes: "applied", or the refusal's reason."""
    out = []
    async with running(storage) as srv, srv.client(timeout=60) as c:
        for margin in (64, 2048, 3072, 4096, 8192):
            sid, gen = await _held(c, f"near-{margin}")
            records = [b"r" * (256 * 1024)] * 15 + [b"r" * (256 * 1024 - margin)]
            try:
                await c.commit(sid, gen, 0, records, commit_id=f"c-{margin}")
                out.append((margin, "applied"))
            except errors.FencepostError as err:
                assert err.metadata["limit"] == str(4 * 1024 * 1024) and int(err.metadata["size"]) > 4 * 1024 * 1024
                out.append((margin, err.reason))
    return out


async def test_a_commit_near_the_byte_limit_is_answered_alike_on_every_backend(storage: Storage) -> None:
    """The commit's 4 MiB is one limit on every backend (a commit within it
    fits one DynamoDB transaction, whose own count adds attribute names, key
    prefixes and versions per item): a commit within a few KiB of it is
    applied everywhere or refused everywhere as COMMIT_TOO_LARGE, never
    refused by one backend's own count (TXN_TOO_LARGE, which Commit does not
    declare) while another applies it."""
    from fencepost_server.storage.memory import MemoryStorage

    got = await _commits_near_the_byte_limit(storage)
    assert got == await _commits_near_the_byte_limit(MemoryStorage())
    assert {outcome for _, outcome in got} == {"applied", reasons.COMMIT_TOO_LARGE}


# -- 5: AppendTurn request ids ----------------------------------------------------------------
async def test_append_turn_request_id_reused_for_another_record_is_refused(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        record = {"at": "2026-01-01T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}
        first = await c.append_turn("agent", {**record, "note": "first"}, request_id="rq-1")
        assert await c.append_turn("agent", {**record, "note": "first"}, request_id="rq-1") == first
        before = await snapshot(storage)
        with pytest.raises(errors.FencepostError) as err:
            await c.append_turn("agent", {**record, "note": "other"}, request_id="rq-1")
        assert err.value.reason == reasons.REQUEST_ID_REUSED
        assert await snapshot(storage) == before
        journal = await c.read_journal("agent")
        assert journal is not None and [r.get("note") for r in journal.records()] == ["first"]


# -- 6: a refused CAS reports the version that refused it --------------------------------------
class DeleteAfterRefusal(Storage):
    """Passes everything through; right after a refused transaction it deletes
    the refused key, as a concurrent writer could before a follow-up read."""

    def __init__(self, inner: Storage, key: str) -> None:
        self.inner, self.key = inner, key

    async def transact(self, checks=(), writes=(), count=None) -> TxnResult:  # type: ignore[no-untyped-def]
        result = await self.inner.transact(checks, writes, count)
        if not result.applied and any(w.key == self.key for w in writes):
            await self.inner.delete(self.key)
        return result

    async def get(self, key: str) -> Item | None:
        return await self.inner.get(key)

    async def put(self, key: str, value: bytes) -> str:
        return await self.inner.put(key, value)

    async def delete(self, key: str) -> bool:
        return await self.inner.delete(key)

    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        return await self.inner.list(prefix, start_after, limit, max_bytes)

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        return await self.inner.list_keys(prefix, start_after, limit)

    async def put_if_absent(self, key: str, value: bytes):  # type: ignore[no-untyped-def]
        return await self.inner.put_if_absent(key, value)

    async def put_if_version(self, key: str, value: bytes, expected: str):  # type: ignore[no-untyped-def]
        return await self.inner.put_if_version(key, value, expected)

    async def delete_if_version(self, key: str, expected: str):  # type: ignore[no-untyped-def]
        return await self.inner.delete_if_version(key, expected)


async def test_cas_refusal_reports_the_refusing_version(storage: Storage) -> None:
    scoped = "default/kv/lock"
    racing = DeleteAfterRefusal(storage, scoped)
    kv = KvStore(racing, Limits(), RequestLog(racing))
    for attempt, refuse in enumerate((
        lambda rid: kv.put_if_absent("default", "lock", b"b", rid),
        lambda rid: kv.put_if_version("default", "lock", b"b", "not-the-version", rid),
        lambda rid: kv.delete_if_version("default", "lock", "not-the-version", rid),
    )):
        version = await kv.put("default", "lock", b"a")
        out = await refuse(f"rq-{attempt}")
        # refused by the key at `version`; it was deleted only afterwards
        assert (out.applied, out.version) == (False, version), attempt


# -- 7: negative durations and caps ---------------------------------------------------------------
async def test_negative_ttl_and_list_sessions_caps_are_refused(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid = (await c.open_session("agent", "neg")).session_id
        before = await snapshot(storage)
        minus = duration_pb2.Duration(seconds=-5)
        cases = [
            ("/fencepost.v1.LedgerService/AcquireLease",
             ledger_pb2.AcquireLeaseRequest(session_id=sid, holder_id="h", ttl=minus), "ttl"),
            ("/fencepost.v1.LedgerService/Deliver",
             ledger_pb2.DeliverRequest(session_id=sid, payload=b"p", try_lease="h", ttl=minus), "ttl"),
            ("/fencepost.v1.LedgerService/ListSessions",
             ledger_pb2.ListSessionsRequest(agent="agent", max_sessions=-1), "max_sessions"),
            ("/fencepost.v1.LedgerService/ListSessions",
             ledger_pb2.ListSessionsRequest(agent="agent", max_total_bytes=-1), "max_total_bytes"),
            ("/fencepost.v1.LedgerService/ListSessions",
             ledger_pb2.ListSessionsRequest(agent="agent", max_age=minus), "max_age"),
            ("/fencepost.v1.LedgerService/ClaimOrphan", ledger_pb2.ClaimOrphanRequest(holder_id="h", wait=minus),
             "wait"),
        ]
        for method, msg, field in cases:
            _, refusal = await raw_call(srv, method, msg.SerializeToString())
            assert refusal is not None, (method, field)
            assert (refusal.code, refusal.info.reason, refusal.fields) == (
                grpc.StatusCode.INVALID_ARGUMENT, reasons.FIELD_INVALID, [field]), (method, field)
        assert await snapshot(storage) == before


# -- 8: memory ties and liveness ---------------------------------------------------------------
async def test_memory_ties_on_created_at_keep_the_smallest_ids(storage: Storage) -> None:
    memory = MemoryStore(storage, Limits(), clock=lambda: 1_000_000)  # every entry at one created_at
    ids = [(await memory.append("t", "agent", f"fact {n}")).id for n in range(10)]
    smallest = sorted(ids)
    listed = await memory.list("t", "agent", limit=3)
    assert [v.entry.id for v in listed.entries] == smallest[:3]  # newest first, ties by id ascending
    injection = await memory.build_injection("t", "agent")
    assert [e.id for e in injection.recent] == smallest[:8]


async def test_reassert_trust_touches_only_a_live_entry(storage: Storage) -> None:
    memory = MemoryStore(storage, Limits())
    ids = [(await memory.append("t", "agent", f"fact {n}")).id for n in range(2)]
    old = ids[0]
    await memory.append("t", "agent", "fact 0, corrected", NewEntry(supersedes=old))
    assert await memory.reassert_trust("t", "agent", old, "operator") is False  # superseded: not live
    assert await memory.reassert_trust("t", "agent", ids[1], "operator") is True



async def test_unknown_enum_values_of_memory_reads_are_refused(storage: Storage) -> None:
    """MemoryService's common errors promise FIELD_INVALID for an unknown enum;
    List's validity, Search's strategy and Pinned's include took any number as
    the default (and Search then counted a recall)."""
    async with running(storage) as srv, srv.client(timeout=10) as c:
        await c.memory_append("agent", "a fact worth finding")
        before = await snapshot(storage)
        cases = [
            ("List", memory_pb2.MemoryServiceListRequest(agent_id="agent", validity=7), "validity"),
            ("Search", memory_pb2.MemoryServiceSearchRequest(agent_id="agent", query="fact", strategy=7),
             "strategy"),
            ("Search", memory_pb2.MemoryServiceSearchRequest(agent_id="agent", query="fact", strategy=-1),
             "strategy"),
            ("Pinned", memory_pb2.MemoryServicePinnedRequest(agent_id="agent", include=3), "include"),
        ]
        for method, msg, field in cases:
            _, refusal = await raw_call(srv, f"/fencepost.v1.MemoryService/{method}", msg.SerializeToString())
            assert refusal is not None, (method, field)
            assert (refusal.code, refusal.info.reason, refusal.fields) == (
                grpc.StatusCode.INVALID_ARGUMENT, reasons.FIELD_INVALID, [field]), (method, field)
        assert await snapshot(storage) == before


async def test_put_ab_sample_refuses_a_timestamp_with_nanos_out_of_range(storage: Storage) -> None:
    """`at` with nanos of -1 or 1e9 was stored under the key of another instant
    (seconds=0, nanos=1e9 overwrote the sample at seconds=1)."""
    async with running(storage) as srv:
        before = await snapshot(storage)
        for nanos in (-1, 1_000_000_000):
            msg = evals_pb2.PutAbSampleRequest(agent="a", experiment="e", session_id="s", sample={})
            msg.at.seconds, msg.at.nanos = 0, nanos
            _, refusal = await raw_call(srv, "/fencepost.v1.EvalService/PutAbSample", msg.SerializeToString())
            assert refusal is not None, nanos
            assert (refusal.code, refusal.info.reason, refusal.fields) == (
                grpc.StatusCode.INVALID_ARGUMENT, reasons.FIELD_INVALID, ["at"]), nanos
        assert await snapshot(storage) == before


async def test_import_names_the_entry_whose_timestamp_is_invalid(storage: Storage) -> None:
    """The refusal of an invalid Timestamp inside Import's entries named
    `valid_from` alone, not which entry held it."""
    async with running(storage) as srv:
        before = await snapshot(storage)
        for field in ("created_at", "valid_from", "valid_until"):
            bad = memory_pb2.MemoryEntry(id="m2", content="c")
            bad.created_at.seconds = 1000
            getattr(bad, field).nanos = -1
            good = memory_pb2.MemoryEntry(id="m1", content="c")
            good.created_at.seconds = 1000
            msg = memory_pb2.MemoryServiceImportRequest(agent_id="a", entries=[good, bad])
            _, refusal = await raw_call(srv, "/fencepost.v1.MemoryService/Import", msg.SerializeToString())
            assert refusal is not None, field
            assert (refusal.code, refusal.info.reason, refusal.fields) == (
                grpc.StatusCode.INVALID_ARGUMENT, reasons.FIELD_INVALID, [f"entries[1].{field}"]), field
        assert await snapshot(storage) == before


def _field(number: int, body: bytes) -> bytes:
    """A length-delimited field on the wire."""
    size, length = b"", len(body)
    while True:
        size += bytes([(length & 0x7F) | (0x80 if length > 0x7F else 0)])
        length >>= 7
        if not length:
            break
    return bytes([number << 3 | 2]) + size + body


def _deep_struct(levels: int) -> bytes:
    """A Struct `{"x": [[[...]]]}` nested `levels` lists deep, as wire bytes
    (the Python message API refuses to build what protobuf cannot decode)."""
    value = b""
    for _ in range(levels):
        value = _field(6, _field(1, value))  # Value.list_value { values: [value] }
    return _field(1, _field(1, b"x") + _field(2, value))  # Struct.fields {"x": value}


async def test_a_message_nested_past_the_decode_depth_is_refused_naming_the_field(storage: Storage) -> None:
    """Nesting deeper than protobuf decodes is refused by protobuf; naming the
    field then walked the bytes recursively, as deep as they went: 5000
    levels answered INTERNAL (RecursionError) on every RPC taking a Struct."""
    deep = _deep_struct(5000)
    cases = [
        ("/fencepost.v1.EvalService/PutEvalRun",
         evals_pb2.PutEvalRunRequest(agent="a", run_id="r").SerializeToString() + _field(3, deep), "snapshot"),
        ("/fencepost.v1.MemoryService/Append",
         memory_pb2.MemoryServiceAppendRequest(agent_id="a", content="c").SerializeToString()
         + _field(8, deep), "metadata"),
    ]
    async with running(storage) as srv:
        before = await snapshot(storage)
        for method, data, field in cases:
            _, refusal = await raw_call(srv, method, data)
            assert refusal is not None, method
            assert (refusal.code, refusal.info.reason) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                           reasons.FIELD_INVALID), method
            assert refusal.fields and refusal.fields[0].startswith(field), (method, refusal.fields)
        assert await snapshot(storage) == before



async def _all_refused_by_field(srv: RunningServer, cases: list[tuple[str, Any, str, str]]) -> None:
    """Each (method, request, field, reason) is INVALID_ARGUMENT naming that one field."""
    for method, msg, field, reason in cases:
        _, refusal = await raw_call(srv, method, msg.SerializeToString())
        assert refusal is not None, method
        assert (refusal.code, refusal.info.reason, refusal.fields) == (
            grpc.StatusCode.INVALID_ARGUMENT, reason, [field]), method

async def test_holder_ids_and_erased_agent_names_are_bounded_on_every_backend(storage: Storage) -> None:
    """A 500 KB holder id (kept in the lease item), EraseAgent name (kept in
    the operation's record) or Fork child_session_key answered INTERNAL on
    DynamoDB, whose items hold 400 KB, and was stored as is elsewhere. Deliver parked its event
    before the oversized try_lease failed."""
    big = "h" * 500_000
    async with running(storage) as srv, srv.client(timeout=30) as c:
        sid = (await c.open_session("agent", "holders")).session_id
        before = await snapshot(storage)
        cases = [
            ("/fencepost.v1.LedgerService/AcquireLease",
             ledger_pb2.AcquireLeaseRequest(session_id=sid, holder_id=big), "holder_id", reasons.FIELD_INVALID),
            ("/fencepost.v1.LedgerService/RenewLease",
             ledger_pb2.RenewLeaseRequest(session_id=sid, generation=1, holder_id=big), "holder_id",
             reasons.FIELD_INVALID),
            ("/fencepost.v1.LedgerService/Deliver",
             ledger_pb2.DeliverRequest(session_id=sid, payload=b"p", try_lease=big), "try_lease",
             reasons.FIELD_INVALID),
            ("/fencepost.v1.LedgerService/ClaimOrphan", ledger_pb2.ClaimOrphanRequest(holder_id=big), "holder_id",
             reasons.FIELD_INVALID),
            ("/fencepost.v1.AdminService/EraseAgent", admin_pb2.EraseAgentRequest(agent=big), "agent",
             reasons.AGENT_NAME_INVALID),
            ("/fencepost.v1.LedgerService/Fork",  # bounded as OpenSession's session_key
             ledger_pb2.ForkRequest(parent_session_id=sid, child_session_key=big), "child_session_key",
             reasons.FIELD_INVALID),
        ]
        await _all_refused_by_field(srv, cases)
        assert await snapshot(storage) == before
        lease = await c.acquire_lease(sid, "h" * 1024)  # at the limit
        assert lease.holder_id == "h" * 1024


async def test_ids_with_a_trailing_newline_are_malformed(storage: Storage) -> None:
    """Id shapes were checked with a regex ending in `$`, which also matches
    before a trailing newline: `rem_1\\n` passed DeleteReminder / Dispatch's
    shape check and an inbox id plus `\\n` answered INBOX_ENTRY_GONE."""
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "newline")
        rem = (await c.create_reminder(sid, gen, "soon", after_seconds=60)).id
        inbox_id = (await c.deliver(payload=b"p", session_id=sid)).inbox_id
        before = await snapshot(storage)
        cases = [
            ("/fencepost.v1.ScheduleService/Dispatch",
             schedule_pb2.DispatchRequest(session_id=sid, generation=gen, id=rem + "\n"), "id",
             reasons.REMINDER_INVALID),
            ("/fencepost.v1.ScheduleService/DeleteReminder",
             schedule_pb2.DeleteReminderRequest(session_id=sid, generation=gen, id=rem + "\n"), "id",
             reasons.REMINDER_INVALID),
            ("/fencepost.v1.LedgerService/Commit",
             ledger_pb2.CommitRequest(session_id=sid, generation=gen, expected_seq=1,
                                      consume_inbox_ids=[inbox_id + "\n"]), "consume_inbox_ids",
             reasons.FIELD_INVALID),
        ]
        await _all_refused_by_field(srv, cases)
        assert await snapshot(storage) == before


async def test_over_long_session_ids_and_archive_names_are_not_found_on_every_backend(storage: Storage) -> None:
    """A well-formed session id naming an agent longer than any session's, or
    a long archive name, was looked up as is: SESSION_NOT_FOUND /
    ARCHIVE_NOT_FOUND on memory and SQLite, INTERNAL on DynamoDB (keys over
    its limit)."""
    agent_over = base64.urlsafe_b64encode(b"a" * 257).decode().rstrip("=")
    sids = ["0" * 32 + "." + "A" * 100_000, "0" * 32 + "." + agent_over]
    async with running(storage) as srv:
        for sid in sids:
            for method, msg in [
                ("/fencepost.v1.LedgerService/GetSession", ledger_pb2.GetSessionRequest(session_id=sid)),
                ("/fencepost.v1.LedgerService/Commit",
                 ledger_pb2.CommitRequest(session_id=sid, generation=1, records=[b"r"])),
                ("/fencepost.v1.LedgerService/Deliver", ledger_pb2.DeliverRequest(session_id=sid, payload=b"p")),
                ("/fencepost.v1.ScheduleService/ListReminders", schedule_pb2.ListRemindersRequest(session_id=sid)),
            ]:
                _, refusal = await raw_call(srv, method, msg.SerializeToString())
                assert refusal is not None, method
                assert (refusal.code, refusal.info.reason) == (grpc.StatusCode.NOT_FOUND,
                                                               reasons.SESSION_NOT_FOUND), (method, len(sid))
        async with grpc.aio.insecure_channel(srv.target) as channel:
            read = channel.unary_stream("/fencepost.v1.JournalService/ReadArchive")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                [r async for r in read(journal_pb2.ReadArchiveRequest(agent="a", name="n" * 100_000)
                                       .SerializeToString(), timeout=30)]
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_txn_op_that_sets_no_write_is_refused(storage: Storage) -> None:
    """An empty TxnOp (or one of a kind this server does not know) was
    skipped: the Txn succeeded having applied less than asked, `versions`
    no longer lined up with the ops, and 100,000 of them passed the
    100-operation limit."""
    put = kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="k", value=b"v"))
    cases = [
        (kv_pb2.TxnRequest(success_ops=[kv_pb2.TxnOp(), put]), "success_ops[0]"),
        (kv_pb2.TxnRequest(success_ops=[put], failure_ops=[put, kv_pb2.TxnOp()]), "failure_ops[1]"),
        (kv_pb2.TxnRequest(success_ops=[kv_pb2.TxnOp()] * 100_000), "success_ops[0]"),
    ]
    await assert_txns_refused(storage, [(msg, reasons.FIELD_INVALID, field) for msg, field in cases])


async def test_txn_op_refusals_name_the_field_as_the_request_spells_it(storage: Storage) -> None:
    """A Txn op's key or value over a limit (or a NUL key) is named by its
    path in TxnRequest, as invalid UTF-8 in it is: `success_ops[1].put.key`,
    `failure_ops[0].delete_key`, `success_ops[0].put.value`. The refusal
    named `success_ops[1].key`, a field no TxnOp has."""
    put = kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="k", value=b"v"))
    cases = [
        (kv_pb2.TxnRequest(success_ops=[put, kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="x" * 1025))]),
         reasons.KEY_TOO_LONG, "success_ops[1].put.key"),
        (kv_pb2.TxnRequest(success_ops=[put], failure_ops=[kv_pb2.TxnOp(delete_key="a\x00")]),
         reasons.KEY_INVALID, "failure_ops[0].delete_key"),
        (kv_pb2.TxnRequest(success_ops=[kv_pb2.TxnOp(delete_key="")]), reasons.KEY_INVALID, "success_ops[0].delete_key"),
        (kv_pb2.TxnRequest(success_ops=[kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="k", value=b"v" * (256 * 1024 + 1)))]),
         reasons.VALUE_TOO_LARGE, "success_ops[0].put.value"),
    ]
    await assert_txns_refused(storage, cases)


async def test_a_txn_compare_that_sets_no_target_is_refused(storage: Storage) -> None:
    """A Compare with no target (exists / version / value), or with one of a
    kind this server does not know (a newer client's, dropped as an unknown
    field), held: the success branch applied on a condition nobody checked.
    It is refused as an empty TxnOp is, naming the compare, and nothing is
    written."""
    unknown_target = kv_pb2.Compare(key="k").SerializeToString() + b"\x2a\x01\x01"  # field 5, a newer target
    request = kv_pb2.TxnRequest(
        compares=[kv_pb2.Compare(key="k", exists=False), kv_pb2.Compare.FromString(unknown_target)],
        success_ops=[kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="won", value=b"v"))],
        failure_ops=[kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="lost", value=b"v"))],
    )
    cases = [
        (request, "compares[1]"),
        (kv_pb2.TxnRequest(compares=[kv_pb2.Compare(key="k")]), "compares[0]"),
    ]
    await assert_txns_refused(storage, [(msg, reasons.FIELD_INVALID, field) for msg, field in cases])


async def assert_txns_refused(storage: Storage, cases: list[tuple[kv_pb2.TxnRequest, str, str]]) -> None:
    """Each Txn is INVALID_ARGUMENT with (reason, the one field named), and nothing is written."""
    async with running(storage) as srv:
        before = await snapshot(storage)
        for msg, reason, field in cases:
            _, refusal = await raw_call(srv, "/fencepost.v1.KvService/Txn", msg.SerializeToString())
            assert refusal is not None, field
            assert (refusal.code, refusal.info.reason, refusal.fields) == (
                grpc.StatusCode.INVALID_ARGUMENT, reason, [field]), field
        assert await snapshot(storage) == before
