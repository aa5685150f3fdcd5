"""JournalService + StoreApiService through a real server, on every backend."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import fencepost
from fencepost import errors
from fencepost.journal import compact_json, record_from_dict, record_size
from fencepost.v1 import journal_pb2, journal_pb2_grpc, store_api_pb2, store_api_pb2_grpc
from fencepost_server.storage import Storage
from tests.conftest import RunningServer, running


def record(i: int = 0, **more: Any) -> dict[str, Any]:
    return {"at": f"2025-01-01T00:00:{i % 60:02d}Z", "sessionId": "s1", "channelId": "c1", "status": "completed", **more}


def record_of_size(size: int) -> dict[str, Any]:
    base = record_size(record(result=""))
    return record(result="é" * ((size - base) // 2) + "x" * ((size - base) % 2))


async def snapshot(storage: Storage) -> list[tuple[str, bytes]]:
    """Everything the server could have written: the tenant's keys and the
    server-global ones (listed by prefix: a DynamoDB list must be a Query)."""
    out: list[tuple[str, bytes]] = []
    for prefix in ("default/", "#/"):
        after = None
        while page := await storage.list(prefix, after, 1000):
            out.extend((i.key, i.value) for i in page)
            after = page[-1].key
    return out


async def envelope(client: fencepost.AsyncClient, req: store_api_pb2.CallRequest) -> store_api_pb2.CallResponse:
    stub = store_api_pb2_grpc.StoreApiServiceStub(client.channel)
    return await client._caller.call(stub.Call, req, safe=False)


def append_env(agent: str = "a", rec: dict[str, Any] | None = None, **kw: Any) -> store_api_pb2.CallRequest:
    payload = store_api_pb2.MemoryAppendPayload(agent=agent, record=record_from_dict(rec or record()))
    return store_api_pb2.CallRequest(**{"v": 1, "call": "memory.append", "memory_append": payload, **kw})


def read_env(agent: str = "a", **kw: Any) -> store_api_pb2.CallRequest:
    return store_api_pb2.CallRequest(
        **{"v": 1, "call": "memory.read", "memory_read": store_api_pb2.MemoryReadPayload(agent=agent), **kw}
    )


BAD_AGENTS = ["", "a/b", "a\\b", ".", "..", "x" * 257]

BAD_ENVELOPES = [
    pytest.param(append_env(v=2), "UNSUPPORTED_PROTOCOL_VERSION", id="v2"),
    pytest.param(append_env(v=0), "UNSUPPORTED_PROTOCOL_VERSION", id="v-unset"),
    pytest.param(append_env(agent="a/b", v=3), "UNSUPPORTED_PROTOCOL_VERSION", id="v-checked-first"),
    pytest.param(append_env(call="memory.read"), "CALL_PAYLOAD_MISMATCH", id="read-call-append-payload"),
    pytest.param(read_env(call="memory.append"), "CALL_PAYLOAD_MISMATCH", id="append-call-read-payload"),
    pytest.param(append_env(call="memory.delete"), "CALL_PAYLOAD_MISMATCH", id="unknown-call"),
    pytest.param(store_api_pb2.CallRequest(v=1, call="memory.append"), "CALL_PAYLOAD_MISMATCH", id="no-payload"),
    *[pytest.param(append_env(agent=a), "AGENT_NAME_INVALID", id=f"append-agent-{a[:5]!r}") for a in BAD_AGENTS],
    *[pytest.param(read_env(agent=a), "AGENT_NAME_INVALID", id=f"read-agent-{a[:5]!r}") for a in BAD_AGENTS],
    pytest.param(append_env(rec=record_of_size(16 * 1024 + 1)), "RECORD_TOO_LARGE", id="record-16KiB+1"),
    pytest.param(append_env(rec={**record(), "sessionId": ""}), "FIELD_INVALID", id="no-session"),
    pytest.param(append_env(rec={**record(), "at": ""}), "FIELD_INVALID", id="no-at"),
]


@pytest.mark.parametrize(("req", "reason"), BAD_ENVELOPES)
async def test_bad_envelope_answers_reason_and_writes_nothing(
    storage: Storage, client: fencepost.AsyncClient, req: store_api_pb2.CallRequest, reason: str
) -> None:
    await client.append_turn("a", record(0, tag="before"))  # a journal exists (and "a" has a tail item)
    before = await snapshot(storage)
    with pytest.raises(errors.InvalidArgument) as err:
        await envelope(client, req)
    assert err.value.reason == reason
    assert await snapshot(storage) == before
    if reason == "UNSUPPORTED_PROTOCOL_VERSION":
        assert err.value.metadata["served"] == "1"
    if reason == "RECORD_TOO_LARGE":
        assert err.value.metadata == {"limit": "16384", "size": "16385"}


async def test_status_unspecified_is_refused(storage: Storage, client: fencepost.AsyncClient) -> None:
    req = append_env()
    req.memory_append.record.status = journal_pb2.TURN_STATUS_UNSPECIFIED
    with pytest.raises(errors.FieldInvalid) as err:
        await envelope(client, req)
    assert "memory_append.record.status" in err.value.field_violations
    assert await snapshot(storage) == []


@pytest.mark.parametrize("agent", BAD_AGENTS)
async def test_typed_lane_refuses_bad_agent(storage: Storage, client: fencepost.AsyncClient, agent: str) -> None:
    with pytest.raises(errors.AgentNameInvalid):
        await client.append_turn(agent, record())
    with pytest.raises(errors.AgentNameInvalid):
        await client.read_journal(agent)
    assert await snapshot(storage) == []


async def test_record_cap_boundary_and_sdk_precheck(storage: Storage, client: fencepost.AsyncClient) -> None:
    assert record_size(record_of_size(16 * 1024)) == 16 * 1024
    await client.append_turn("a", record_of_size(16 * 1024))  # exactly at the cap: accepted
    before = await snapshot(storage)
    with pytest.raises(errors.RecordTooLarge) as err:
        await client.append_turn("a", record_of_size(16 * 1024 + 1))
    assert err.value.__cause__ is None  # raised by the SDK, never sent
    assert err.value.metadata == {"limit": "16384", "size": "16385"}
    with pytest.raises(errors.RecordTooLarge):
        await client.store_call("memory.append", {"agent": "a", "record": record_of_size(16 * 1024 + 1)})
    # The server enforces the same cap on its own (typed lane, raw stub).
    stub = journal_pb2_grpc.JournalServiceStub(client.channel)
    req = journal_pb2.AppendTurnRequest(agent="a", record=record_from_dict(record_of_size(16 * 1024 + 1)))
    with pytest.raises(errors.RecordTooLarge) as err:
        await client._caller.call(stub.AppendTurn, req, safe=False)
    assert err.value.__cause__ is not None and err.value.metadata["size"] == "16385"
    assert await snapshot(storage) == before


EXTRA = {
    "futureField": {"nested": [1, 2.5, -3, True, None, "ünï\u2028"], "empty": {}},
    "flag": False,
    "n": 9007199254740991,
    "text": "line\nbreak \"quoted\" \\ tab\t",
}


async def test_extra_round_trips_verbatim_on_both_lanes(client: fencepost.AsyncClient) -> None:
    rec = record(1, title="T", sdkAgentId="sdk", userMessage="hi", result="ok", usage={"inputTokens": 12}, **EXTRA)
    await client.append_turn("x", rec)
    out = await client.store_call("memory.append", {"agent": "x", "record": rec})
    assert out["v"] == 1 and out["ok"] is True and out["recordId"]
    typed = await client.read_journal("x")
    assert typed is not None and typed.records() == [rec, rec]
    assert typed.size_bytes == len(typed.data) == 2 * (len(compact_json(rec)) + 1) and typed.record_count == 2
    # typed fields first, in wire order; then extra (a protobuf map: key order is not kept)
    first = list(json.loads(typed.data.splitlines()[0]))
    assert first[:9] == ["at", "sessionId", "channelId", "status", "title", "sdkAgentId", "userMessage", "result", "usage"]
    env = await client.store_call("memory.read", {"agent": "x"})
    assert env["journal"]["jsonl"].encode() == typed.data and env["journal"]["recordCount"] == 2
    assert [json.loads(line) for line in env["journal"]["jsonl"].split("\n") if line] == [rec, rec]


async def test_journal_is_null_for_an_agent_that_never_appended(client: fencepost.AsyncClient) -> None:
    await client.append_turn("someone-else", record())
    assert await client.read_journal("never") is None
    assert await client.store_call("memory.read", {"agent": "never"}) == {"v": 1, "ok": True, "journal": None}
    res = await envelope(client, read_env("never"))
    assert res.v == 1 and res.ok and res.HasField("memory_read") and not res.memory_read.HasField("journal")


async def test_read_mid_stream_has_every_acked_append_from_32_writers(client: fencepost.AsyncClient) -> None:
    acked: list[str] = []
    done = asyncio.Event()

    async def writer(w: int) -> None:
        for i in range(8):
            tag = f"w{w:02d}-{i}"
            await client.append_turn("hot", record(i, tag=tag))
            acked.append(tag)

    async def reader() -> list[tuple[set[str], list[str]]]:
        seen = []
        while not done.is_set():
            before = set(acked)
            got = await client.read_journal("hot")
            seen.append((before, [r["tag"] for r in got.records()] if got else []))
        return seen

    read_task = asyncio.create_task(reader())
    await asyncio.gather(*(writer(w) for w in range(32)))
    done.set()
    reads = await read_task
    final = await client.read_journal("hot")
    assert final is not None
    reads.append((set(acked), [r["tag"] for r in final.records()]))
    for before, got in reads:
        assert len(got) == len(set(got))
        assert before <= set(got)
    assert len(reads[-1][1]) == 32 * 8
    # per writer, acks are sequential, so the journal (id order) keeps each writer's order
    for w in range(32):
        mine = [t for t in reads[-1][1] if t.startswith(f"w{w:02d}-")]
        assert mine == [f"w{w:02d}-{i}" for i in range(8)]


async def test_rotation_through_the_api(storage: Storage) -> None:
    async with running(storage, max_journal_bytes=1500) as srv:
        async with srv.client(timeout=10.0) as client:
            tags = [f"t{i:02d}" for i in range(50)]
            for tag in tags:
                await client.append_turn("rot", record(0, tag=tag))
            live = await client.read_journal("rot")  # flush-on-read folds and rotates
            assert live is not None and 0 < live.size_bytes <= 1500
            archives = [a async for a in client.list_archives("rot", page_size=1)]
            assert len(archives) >= 2
            got = []
            for a in archives:
                content = await client.read_archive("rot", a.name)
                assert content.size_bytes == a.size_bytes <= 1500 and content.record_count == a.record_count
                got.extend(r["tag"] for r in content.records())
            assert got + [r["tag"] for r in live.records()] == tags
            with pytest.raises(errors.ArchiveNotFound):
                await client.read_archive("rot", "000999-nope")


async def test_sync_client_appends_and_reads(server: RunningServer) -> None:
    def use() -> tuple[str, fencepost.JournalContent | None]:
        with fencepost.Client(server.target, timeout=10.0) as fp:
            return fp.append_turn("sync", record(3, tag="s")), fp.read_journal("sync")

    rid, got = await asyncio.to_thread(use)  # the server runs on this test's event loop
    assert rid and got is not None and got.records() == [record(3, tag="s")]


async def _eventually(check: Any) -> bool:
    """Poll (up to 20 s, no timing assertion) until `check()` is true."""
    for _ in range(400):
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"journal_flush_seconds": 0.05}, id="age"),
        pytest.param({"journal_flush_seconds": 3600.0, "journal_flush_bytes": 500}, id="size"),
    ],
)
async def test_background_flusher_folds_the_tail(storage: Storage, settings: dict[str, Any]) -> None:
    from fencepost_server.domain.journal import _Keys

    keys = _Keys("default", "bg")
    async with running(storage, **settings) as srv:
        async with srv.client(timeout=10.0) as client:
            for i in range(10):
                await client.append_turn("bg", record(i, tag=f"t{i}"))

            async def flushed() -> bool:
                # age: the whole tail is folded; size: at least one segment was written
                if settings["journal_flush_seconds"] < 1:
                    return not await storage.list(keys.tail, None, 1)
                return bool(await storage.list(keys.segments(1), None, 1))

            assert await _eventually(flushed)
            got = await client.read_journal("bg")
            assert got is not None and [r["tag"] for r in got.records()] == [f"t{i}" for i in range(10)]


async def test_the_flush_lag_gauge_is_set_by_the_background_flusher(storage: Storage) -> None:
    async with running(storage, journal_flush_seconds=0.05) as srv:
        registry = srv.app.metrics.registry
        assert registry.get_sample_value("fencepost_journal_flush_lag_seconds") == 0.0
        async with srv.client(timeout=10.0) as client:
            await client.append_turn("lag", record(0, tag="t0"))

            async def reported() -> bool:
                return (registry.get_sample_value("fencepost_journal_flush_lag_seconds") or 0.0) > 0.0

            assert await _eventually(reported)


def _nan_record() -> journal_pb2.TurnRecord:
    rec = record_from_dict(record())
    rec.extra["bad"] = float("nan")  # a Struct carries it; JSON cannot (FIELD_INVALID)
    return rec


@pytest.mark.parametrize(("agent", "reason"), [
    pytest.param("a/b", "AGENT_NAME_INVALID", id="bad-agent-and-bad-record"),
    pytest.param("a", "FIELD_INVALID", id="good-agent-bad-record"),
])
async def test_agent_name_is_checked_before_the_record_structs(
    storage: Storage, client: fencepost.AsyncClient, agent: str, reason: str
) -> None:
    """Spec order: the agent name (AGENT_NAME_INVALID) before the record's
    fields, the Structs' NaN check included, on both lanes."""
    req = store_api_pb2.CallRequest(
        v=1, call="memory.append",
        memory_append=store_api_pb2.MemoryAppendPayload(agent=agent, record=_nan_record()),
    )
    with pytest.raises(errors.InvalidArgument) as err:
        await envelope(client, req)
    assert err.value.reason == reason
    stub = journal_pb2_grpc.JournalServiceStub(client.channel)
    with pytest.raises(errors.InvalidArgument) as err:
        await client._caller.call(
            stub.AppendTurn, journal_pb2.AppendTurnRequest(agent=agent, record=_nan_record()), safe=False
        )
    assert err.value.reason == reason
    assert await snapshot(storage) == []


async def test_journal_lines_write_numbers_as_json_stringify(client: fencepost.AsyncClient) -> None:
    """memory.read returns JSON.stringify's text for Struct numbers, so a
    JavaScript reader re-serializing a line gets the same bytes back."""
    rec = record(0, usage={"tokens": 2**53, "cost": 1e-7, "ratio": 0.5, "huge": 1e21})
    await envelope(client, append_env("nums", rec))
    read = await envelope(client, read_env("nums"))
    line = read.memory_read.journal.jsonl.rstrip(b"\n")
    assert b'"usage":{"cost":1e-7,"huge":1e+21,"ratio":0.5,"tokens":9007199254740992}' in line
    assert json.loads(line)["usage"] == {"cost": 1e-7, "huge": 1e21, "ratio": 0.5, "tokens": 2**53}
