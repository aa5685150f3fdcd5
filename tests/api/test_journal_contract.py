"""spec/journal.md statement by statement, over gRPC against a real server on
every backend: envelope handling, the rotation boundary, flush-on-read across
rotations, archive paging, and acked appends across a server restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

import fencepost
from fencepost import errors
from fencepost.journal import compact_json
from fencepost.v1 import store_api_pb2
from fencepost_server.storage import Storage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.api.test_journal_api import append_env, envelope, read_env, record, snapshot
from tests.api.test_unknown_fields import _unknown_fields
from tests.conftest import RunningServer, running


def tagged(i: int) -> dict[str, Any]:
    return record(0, tag=f"t{i:03d}")  # every line the same length


LINE = len(compact_json(tagged(0))) + 1  # a journal line and its newline


async def everything(client: fencepost.AsyncClient, agent: str) -> list[str]:
    """Archives (oldest first) then the live journal: every record's tag.
    The read comes first: its flush is what rotates."""
    live = await client.read_journal(agent)
    tags = []
    async for a in client.list_archives(agent, page_size=1):
        tags.extend(r["tag"] for r in (await client.read_archive(agent, a.name)).records())
    return tags + ([r["tag"] for r in live.records()] if live else [])


async def test_the_answer_carries_the_request_version_and_ok(client: fencepost.AsyncClient) -> None:
    res = await envelope(client, append_env("env"))
    assert (res.v, res.ok, res.WhichOneof("result")) == (1, True, "memory_append") and res.memory_append.record_id
    res = await envelope(client, read_env("env"))
    assert (res.v, res.ok, res.WhichOneof("result")) == (1, True, "memory_read")
    assert res.memory_read.journal.record_count == 1
    assert res.memory_read.journal.size_bytes == len(res.memory_read.journal.jsonl)


async def test_version_refusal_names_the_version_seen_and_the_versions_served(
    storage: Storage, client: fencepost.AsyncClient
) -> None:
    for v in (-1, 2, 2**31 - 1):
        with pytest.raises(errors.InvalidArgument) as err:
            await envelope(client, read_env("env", v=v))
        assert err.value.reason == "UNSUPPORTED_PROTOCOL_VERSION"
        assert err.value.metadata == {"v": str(v), "served": "1"}
    assert await snapshot(storage) == []


@pytest.mark.parametrize("call", ["", "Memory.Append", "memory.append ", "memory", "memory.read.extra"])
async def test_a_call_name_that_is_not_exactly_served_is_a_mismatch(
    storage: Storage, client: fencepost.AsyncClient, call: str
) -> None:
    with pytest.raises(errors.InvalidArgument) as err:
        await envelope(client, append_env("env", call=call))
    assert err.value.reason == "CALL_PAYLOAD_MISMATCH"
    assert err.value.metadata == {"call": call, "payload": "memory_append"}
    assert await snapshot(storage) == []


async def _raw_call(server: RunningServer, body: bytes) -> bytes:
    async with grpc.aio.insecure_channel(server.target) as channel:
        call = channel.unary_unary(
            "/fencepost.v1.StoreApiService/Call", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        return await call(body, timeout=10.0)


async def test_unknown_fields_anywhere_in_an_envelope_are_ignored(server: RunningServer) -> None:
    """A newer client's extra fields, on the envelope, the payload and the
    record, are accepted; the journaled line holds only what v1 knows."""
    req = append_env("newer")
    payload = req.memory_append
    rec = payload.record.SerializeToString() + _unknown_fields()
    body_payload = store_api_pb2.MemoryAppendPayload(agent="newer").SerializeToString()
    body_payload += b"\x12" + _len(rec) + rec + _unknown_fields()  # field 2 = record
    body = store_api_pb2.CallRequest(v=1, call="memory.append").SerializeToString()
    body += b"\x1a" + _len(body_payload) + body_payload + _unknown_fields()  # field 3 = memory_append
    res = store_api_pb2.CallResponse.FromString(await _raw_call(server, body))
    assert res.ok and res.memory_append.record_id
    read = store_api_pb2.CallResponse.FromString(
        await _raw_call(server, read_env("newer").SerializeToString() + _unknown_fields())
    )
    assert [json.loads(x) for x in read.memory_read.journal.jsonl.splitlines()] == [record()]


def _len(b: bytes) -> bytes:
    n, out = len(b), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


async def test_a_truncated_envelope_is_field_invalid_and_writes_nothing(
    storage: Storage, server: RunningServer
) -> None:
    body = append_env("cut").SerializeToString()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _raw_call(server, body[:-3])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await snapshot(storage) == []


async def test_the_live_journal_rotates_one_byte_past_max_journal_bytes(storage: Storage) -> None:
    """Exactly at max_journal_bytes the journal stays live; the next record
    archives it and starts a new generation."""
    async with running(storage, max_journal_bytes=3 * LINE) as srv, srv.client(timeout=10.0) as client:
        for i in range(3):
            await client.append_turn("edge", tagged(i))
        live = await client.read_journal("edge")
        assert live is not None and live.size_bytes == 3 * LINE and live.record_count == 3
        assert [a async for a in client.list_archives("edge")] == []
        await client.append_turn("edge", tagged(3))
        live = await client.read_journal("edge")
        assert live is not None and [r["tag"] for r in live.records()] == ["t003"]
        [archive] = [a async for a in client.list_archives("edge")]
        assert (archive.size_bytes, archive.record_count) == (3 * LINE, 3)
        assert archive.name.startswith("000001-")
        content = await client.read_archive("edge", archive.name)
        assert [r["tag"] for r in content.records()] == ["t000", "t001", "t002"]


async def test_every_read_sees_every_ack_across_rotations(storage: Storage, scaled: Any) -> None:
    """Flush-on-read across rotation boundaries: after each append, archives
    plus the live journal are exactly the acked records, in order, each once."""
    n = scaled(24, 10)
    async with running(storage, max_journal_bytes=2 * LINE) as srv, srv.client(timeout=10.0) as client:
        acked = []
        for i in range(n):
            await client.append_turn("rot", tagged(i))
            acked.append(f"t{i:03d}")
            assert await everything(client, "rot") == acked
        archives = [a async for a in client.list_archives("rot")]
        assert len(archives) == (n - 1) // 2
        assert [a.name for a in archives] == sorted(a.name for a in archives)
        assert [int(a.name.split("-")[0]) for a in archives] == list(range(1, len(archives) + 1))


async def test_archive_listing_pages_and_refuses_bad_paging(storage: Storage) -> None:
    async with running(storage, max_journal_bytes=LINE) as srv, srv.client(timeout=10.0) as client:
        for i in range(6):
            await client.append_turn("pages", tagged(i))
        await client.read_journal("pages")
        all_names = [a.name for a in (await client.list_archives_page("pages", page_size=1000))[0]]
        assert len(all_names) == 5
        names, token = [], ""
        while True:
            page, token = await client.list_archives_page("pages", page_size=2, page_token=token)
            assert len(page) <= 2
            names.extend(a.name for a in page)
            if not token:
                break
        assert names == all_names
        _, token = await client.list_archives_page("pages", page_size=2)
        with pytest.raises(errors.PageTokenInvalid):
            await client.list_archives_page("other", page_size=2, page_token=token)
        with pytest.raises(errors.PageSizeInvalid):
            await client.list_archives_page("pages", page_size=-1)
        clamped, token = await client.list_archives_page("pages", page_size=5000)
        assert [a.name for a in clamped] == all_names and token == ""


async def test_acked_appends_survive_a_server_restart_on_sqlite(tmp_path: Path) -> None:
    """Acked appends, unflushed (a long flush interval) and then flushed, are
    all there after the server and its SQLite file are closed and reopened;
    ids keep their order after the restart."""
    path = tmp_path / "journal.db"
    quiet = {"journal_flush_seconds": 3600.0, "max_journal_bytes": 4 * LINE}

    async def serve() -> tuple[SqliteStorage, Any]:
        storage = SqliteStorage(path, synchronous="FULL")
        return storage, running(storage, **quiet)

    storage, ctx = await serve()
    async with ctx as srv, srv.client(timeout=10.0) as client:
        ids = [await client.append_turn("keep", tagged(i), request_id=f"keep-{i}") for i in range(6)]
    await storage.close()

    storage, ctx = await serve()
    async with ctx as srv, srv.client(timeout=10.0) as client:
        assert await everything(client, "keep") == [f"t{i:03d}" for i in range(6)]  # the read flushed and rotated
        ids.append(await client.append_turn("keep", tagged(6)))
        assert await client.append_turn("keep", tagged(5), request_id="keep-5") == ids[5]  # a retry: replayed
        env = await client.store_call("memory.read", {"agent": "keep"})
        assert env["journal"]["recordCount"] >= 1
    await storage.close()

    storage, ctx = await serve()
    async with ctx as srv, srv.client(timeout=10.0) as client:
        assert await everything(client, "keep") == [f"t{i:03d}" for i in range(7)]
    await storage.close()
    assert ids == sorted(ids) and len(set(ids)) == 7


async def test_two_replicas_interleaved_appends_every_read_complete(storage: Storage, scaled: Any) -> None:
    """Appends on one replica are read on the other at once (the reader
    flushes the other replica's tail), across rotations, each record once."""
    n = scaled(16, 8)
    async with running(storage, max_journal_bytes=3 * LINE, journal_flush_seconds=3600.0) as s1, \
            running(storage, max_journal_bytes=3 * LINE, journal_flush_seconds=3600.0) as s2:
        async with s1.client(timeout=10.0) as c1, s2.client(timeout=10.0) as c2:
            acked = []
            for i in range(n):
                await (c1 if i % 2 else c2).append_turn("two", tagged(i))
                acked.append(f"t{i:03d}")
                assert await everything(c2 if i % 2 else c1, "two") == acked


async def test_read_journal_streams_whole_lines_that_add_up_to_the_envelope(client: fencepost.AsyncClient) -> None:
    from fencepost.v1 import journal_pb2, journal_pb2_grpc

    big = [record(0, tag=f"b{i}", result="r" * 15_000) for i in range(12)]  # about 180 KB
    for rec in big:
        await client.append_turn("big", rec)
    stub = journal_pb2_grpc.JournalServiceStub(client.channel)
    chunks = [m async for m in stub.ReadJournal(journal_pb2.ReadJournalRequest(agent="big"), timeout=10.0)]
    assert len(chunks) > 1
    assert all(m.found and m.chunk.endswith(b"\n") for m in chunks)
    data = b"".join(m.chunk for m in chunks)
    assert {(m.size_bytes, m.record_count) for m in chunks} == {(len(data), 12)}
    env = await envelope(client, read_env("big"))
    assert env.memory_read.journal.jsonl == data
    assert [json.loads(line) for line in data.splitlines()] == big


@pytest.mark.parametrize("agent", ["é" * 256, "%2F..%00 space?#", "😀" * 128])
async def test_agents_with_long_or_escaped_names_rotate_and_archive(storage: Storage, agent: str) -> None:
    async with running(storage, max_journal_bytes=LINE) as srv, srv.client(timeout=10.0) as client:
        for i in range(3):
            await client.append_turn(agent, tagged(i))
        assert await everything(client, agent) == ["t000", "t001", "t002"]
        assert len([a async for a in client.list_archives(agent)]) == 2
        assert await client.read_journal(agent[:-1]) is None  # a different agent


async def test_a_random_mix_of_lanes_retries_and_replicas_reads_each_ack_once(storage: Storage, scaled: Any) -> None:
    """Appends on either lane and either replica, some retried with their
    request id, some reusing an id for another record (refused): archives
    plus the live journal are always the acked records, each once, in record
    id order (two replicas' ids within one millisecond need not follow the
    order of the acks)."""
    import random

    rng = random.Random(7)
    settings = {"max_journal_bytes": 3 * LINE, "journal_flush_seconds": 3600.0}
    async with running(storage, **settings) as s1, running(storage, **settings) as s2:
        async with s1.client(timeout=10.0) as c1, s2.client(timeout=10.0) as c2:
            acked: list[tuple[str, str]] = []  # (record id, tag)
            sent: list[tuple[str, dict[str, Any], str]] = []  # (request id, record, record id)
            for i in range(scaled(40, 15)):
                c = rng.choice([c1, c2])
                roll = rng.random()
                if sent and roll < 0.25:  # a retry: the first record id, nothing journaled
                    rid, rec, first = rng.choice(sent)
                    assert await c.append_turn("mix", rec, request_id=rid) == first
                elif sent and roll < 0.35:
                    rid, _, _ = rng.choice(sent)
                    with pytest.raises(errors.RequestIdReused):
                        await c.store_call("memory.append", {"agent": "mix", "record": tagged(1000 + i)},
                                           request_id=rid)
                else:
                    rec, rid = tagged(i), f"req-{i}"
                    if rng.random() < 0.5:
                        got = (await c.store_call("memory.append", {"agent": "mix", "record": rec},
                                                  request_id=rid))["recordId"]
                    else:
                        got = await c.append_turn("mix", rec, request_id=rid)
                    sent.append((rid, rec, got))
                    acked.append((got, rec["tag"]))
                if rng.random() < 0.4:
                    assert await everything(rng.choice([c1, c2]), "mix") == [t for _, t in sorted(acked)]
            assert await everything(c1, "mix") == [t for _, t in sorted(acked)]


async def test_a_read_while_another_replica_holds_the_flush_lease_still_has_every_ack(
        storage: Storage, client: fencepost.AsyncClient) -> None:
    import time

    from fencepost_server.domain.journal import _Keys

    keys = _Keys("default", "leased")
    for i in range(3):
        await client.append_turn("leased", tagged(i))
    held = compact_json({"owner": "elsewhere:0", "until": int(time.time() * 1000) + 600_000})
    await storage.put(keys.lease, held)
    before = await snapshot(storage)
    env = await client.store_call("memory.read", {"agent": "leased"})
    assert [json.loads(x)["tag"] for x in env["journal"]["jsonl"].splitlines()] == ["t000", "t001", "t002"]
    assert await snapshot(storage) == before  # the flush was skipped: nothing written, nothing taken
    stale = compact_json({"owner": "elsewhere:0", "until": int(time.time() * 1000) - 1})
    await storage.put(keys.lease, stale)  # the holder died: its lease expired
    assert await everything(client, "leased") == ["t000", "t001", "t002"]
    assert await storage.list(keys.tail, None, 10) == []  # this read's flush took the lease over


async def test_concurrent_writers_flushers_and_readers_on_two_replicas_across_rotations(
        storage: Storage, scaled: Any) -> None:
    import asyncio

    settings = {"max_journal_bytes": 5 * LINE, "journal_flush_seconds": 0.05}
    writers, per = scaled(8, 3), scaled(6, 3)
    async with running(storage, **settings) as s1, running(storage, **settings) as s2:
        async with s1.client(timeout=20.0) as c1, s2.client(timeout=20.0) as c2:
            acked: set[str] = set()
            done = asyncio.Event()

            async def writer(w: int) -> None:
                for i in range(per):
                    tag = f"w{w}-{i}"
                    await (c1 if (w + i) % 2 else c2).append_turn("storm", record(0, tag=tag))
                    acked.add(tag)

            async def reader(c: fencepost.AsyncClient) -> int:
                reads = 0
                while not done.is_set():
                    before = set(acked)
                    # live then archives is two reads: a rotation between them may show a
                    # record twice, never miss one (archives are only ever added)
                    assert before <= set(await everything(c, "storm"))
                    reads += 1
                return reads

            readers = [asyncio.create_task(reader(c)) for c in (c1, c2)]
            await asyncio.gather(*(writer(w) for w in range(writers)))
            done.set()
            assert all(await asyncio.gather(*readers))
            final, previous = await everything(c1, "storm"), None
            while final != previous:  # settled: the background flushers have nothing left to rotate
                previous, final = final, await everything(c1, "storm")
            assert sorted(final) == sorted(acked) and len(final) == writers * per
            for a in [a async for a in c2.list_archives("storm")]:
                assert a.size_bytes <= 5 * LINE and a.record_count >= 1
