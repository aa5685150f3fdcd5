"""MemoryService through a real server on loopback, on every backend."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

import fencepost
from fencepost import errors
from fencepost.v1 import memory_pb2 as pb
from fencepost_server.api.base import Caller
from fencepost_server.storage import Storage
from fencepost_server.storage.base import CasResult
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.app import App
from fencepost_server.config import Settings
from tests.conftest import running

A = "agent/one"  # a slash: agent ids are one encoded segment


async def test_append_list_search_forget_audit(client: fencepost.AsyncClient) -> None:
    a = await client.memory_append(A, "The deploy uses Postgres", kind="semantic", about=["Deploy pipeline"],
                                   trust="own", metadata={"source": "chat"}, session_id="s1")
    b = await client.memory_append(A, "deploy window is friday")
    assert a.id != b.id and a.kind == pb.MEMORY_KIND_SEMANTIC and list(a.about) == ["Deploy pipeline"]
    assert a.provenance.trust == pb.MEMORY_TRUST_OWN and b.provenance.trust == pb.MEMORY_TRUST_UNKNOWN
    assert dict(a.metadata) == {"source": "chat"} and a.agent_id == A
    listed = await client.memory_list(A)
    assert [e.id for e in listed.entries] == [a.id, b.id]
    found = await client.memory_search(A, "DEPLOY")
    assert [e.id for e in found.entries] == [b.id, a.id] and found.strategy == pb.MEMORY_STRATEGY_RECENCY
    # `a` says "deploy" twice (content and about key): the stronger match
    found = await client.memory_search(A, "DEPLOY", strategy="relevance")
    assert [e.id for e in found.entries] == [a.id, b.id] and found.strategy == pb.MEMORY_STRATEGY_RELEVANCE
    assert [e.usage.recall_count for e in found.entries] == [2, 2]
    assert [e.id for e in (await client.memory_search(A, "pipeline")).entries] == [a.id]  # about matches
    assert (await client.memory_search(A, "!!!")).entries == []
    assert await client.memory_forget(A, a.id)
    assert not await client.memory_forget(A, a.id)
    audit = await client.memory_audit(A)
    assert [(e.id, e.forgotten) for e in audit.entries] == [(a.id, True), (b.id, False)]
    assert audit.entries[0].usage.recall_count == 3


async def test_caps_and_supersedes_errors(client: fencepost.AsyncClient) -> None:
    with pytest.raises(errors.ContentTooLarge) as err:
        await client.memory_append(A, "x" * 4097)
    assert err.value.metadata == {"limit": "4096", "size": "4097"}
    with pytest.raises(errors.AboutTooLarge):
        await client.memory_append(A, "ok", about=[f"k{i}" for i in range(13)])
    await client.memory_append("other-agent", "theirs")
    with pytest.raises(errors.SupersedesInvalid):
        await client.memory_append(A, "takeover", supersedes="mem-1")
    assert (await client.memory_list(A)).entries == []
    with pytest.raises(errors.FieldInvalid):
        await client.memory_append("", "no agent")


async def test_validity_and_supersession(client: fencepost.AsyncClient) -> None:
    now = datetime.now(timezone.utc)
    old = await client.memory_append(A, "works at Acme")
    later = await client.memory_append(A, "works at Initech", supersedes=old.id,
                                       valid_from=now + timedelta(days=7))
    expired = await client.memory_append(A, "works part time", valid_until=now - timedelta(days=1))
    assert later.validity == pb.MEMORY_VALIDITY_NOT_YET_VALID
    assert [e.id for e in (await client.memory_list(A)).entries] == [old.id]
    everything = await client.memory_list(A, all_validity=True)
    assert [e.id for e in everything.entries] == [old.id, later.id, expired.id]
    marks = {e.id: e.validity for e in (await client.memory_search(A, "works")).entries}
    assert marks[expired.id] == pb.MEMORY_VALIDITY_EXPIRED and marks[old.id] == pb.MEMORY_VALIDITY_CURRENT
    now_successor = await client.memory_append(A, "works at Hooli", supersedes=old.id)
    assert [e.id for e in (await client.memory_list(A)).entries] == [now_successor.id]
    assert await client.memory_forget(A, now_successor.id)
    assert [e.id for e in (await client.memory_list(A)).entries] == [old.id]


async def test_pins_topics_injection(client: fencepost.AsyncClient) -> None:
    big = await client.memory_append(A, "a" * 2000, about=["Core"], trust="operator")
    small = await client.memory_append(A, "b" * 100, about=["core", "misc"], trust="external")
    assert (await client.memory_pin(A, big.id)).pinned
    refused = await client.memory_pin(A, small.id)
    assert not refused.pinned and "2048-byte cap" in refused.reason and refused.bytes == 2000
    with pytest.raises(errors.EntryNotFound):
        await client.memory_pin(A, "mem-404")
    pinned = await client.memory_pinned(A, allocated=True)
    assert [e.id for e in pinned.entries] == [big.id] and pinned.allocated_bytes == 2000
    topics = await client.memory_topics(A)
    assert [(t.name, t.count, t.trust) for t in topics] == [
        ("Core", 2, pb.MEMORY_TRUST_EXTERNAL), ("misc", 1, pb.MEMORY_TRUST_EXTERNAL)
    ]
    inj = await client.memory_injection(A)
    assert [e.id for e in inj.pinned] == [big.id] and [e.id for e in inj.recent] == [small.id]
    assert [t.name for t in inj.topics] == ["Core", "misc"]
    assert await client.memory_unpin(A, big.id) and not await client.memory_unpin(A, big.id)
    assert (await client.memory_pin(A, small.id)).pinned


async def test_import_is_operator_and_idempotent(client: fencepost.AsyncClient) -> None:
    created = pb.MemoryEntry(id="mem-7", content="imported fact", agent_id="someone-else")
    created.created_at.FromDatetime(datetime(2024, 1, 2, tzinfo=timezone.utc))
    created.usage.recall_count = 99  # dropped
    res = await client.memory_import(A, [created])
    assert res.imported == 1 and list(res.skipped) == []
    again = await client.memory_import(A, [created])
    assert again.imported == 0 and list(again.skipped) == ["mem-7"]
    listed = (await client.memory_list(A)).entries
    assert [(e.id, e.agent_id) for e in listed] == [("mem-7", A)]
    assert listed[0].created_at.ToDatetime(tzinfo=timezone.utc) == datetime(2024, 1, 2, tzinfo=timezone.utc)
    assert (await client.memory_append(A, "minted")).id == "mem-8"
    assert (await client.memory_audit(A)).entries[0].usage.recall_count == 0
    assert await client.memory_reassert_trust(A, "mem-7", "operator")
    assert (await client.memory_list(A)).entries[0].provenance.trust == pb.MEMORY_TRUST_OPERATOR


async def test_audit_then_import_moves_an_agent_without_reviving_what_it_forgot(
        client: fencepost.AsyncClient) -> None:
    kept = await client.memory_append(A, "keep this")
    gone = await client.memory_append(A, "forget this")
    assert await client.memory_forget(A, gone.id)
    audit = list((await client.memory_audit(A)).entries)
    assert [e.forgotten for e in audit] == [False, True]
    assert (await client.memory_import("agent-b", audit)).imported == 2
    assert [e.id for e in (await client.memory_list("agent-b")).entries] == [kept.id]
    assert [(e.id, e.forgotten) for e in (await client.memory_audit("agent-b")).entries] == [
        (kept.id, False), (gone.id, True)]


class _ServiceRole:
    def identify(self, context: object) -> Caller:
        return Caller(tenant="default", role="service", subject="svc")


async def test_import_and_reassert_need_the_operator_role(storage: Storage) -> None:
    app = App(Settings(listen="127.0.0.1:0"), storage=storage, auth=_ServiceRole())
    await app.start()
    try:
        async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=10.0) as c:
            entry = pb.MemoryEntry(id="x", content="y")
            entry.created_at.GetCurrentTime()
            with pytest.raises(errors.PermissionDenied):
                await c.memory_import(A, [entry])
            e = await c.memory_append(A, "ordinary writes work")
            with pytest.raises(errors.PermissionDenied):
                await c.memory_reassert_trust(A, e.id, "own")
    finally:
        await app.stop(grace=0.2)


async def test_concurrent_pins_on_two_servers_one_effective_set(storage: Storage) -> None:
    async with running(storage) as s1, running(storage) as s2:
        async with s1.client(timeout=10.0) as c1, s2.client(timeout=10.0) as c2:
            base = await c1.memory_append(A, "b" * 1000)
            assert (await c1.memory_pin(A, base.id)).pinned
            x = await c1.memory_append(A, "x" * 900)
            y = await c2.memory_append(A, "y" * 900)
            await c1.memory_pinned(A), await c2.memory_pinned(A)  # both caches warm
            r1, r2 = await asyncio.gather(c1.memory_pin(A, x.id), c2.memory_pin(A, y.id))
            assert [r1.pinned, r2.pinned].count(True) == 1
            views = []
            for c in (c1, c2):
                for allocated in (False, True):
                    res = await c.memory_pinned(A, allocated=allocated)
                    views.append(([e.id for e in res.entries], res.allocated_bytes))
                inj = await c.memory_injection(A)
                views.append(([e.id for e in inj.pinned], sum(len(e.content) for e in inj.pinned)))
            assert len(set(map(str, views))) == 1
            assert views[0] == ([base.id, x.id if r1.pinned else y.id], 1900)


def test_sync_client_has_memory_methods() -> None:
    assert hasattr(fencepost.Client, "memory_append") and hasattr(fencepost.Client, "memory_list_all")


async def test_record_too_large_is_a_declared_reason(client: fencepost.AsyncClient) -> None:
    """Metadata can grow a record past what the lane holds: Append and Import
    refuse it as RECORD_TOO_LARGE, a reason both RPCs declare."""
    from fencepost.contract import declared_reasons

    big = {"blob": "x" * 17_000}
    with pytest.raises(errors.RecordTooLarge):
        await client.memory_append(A, "small fact", metadata=big)
    imported = pb.MemoryEntry(id="imp-1", content="small fact")
    imported.created_at.FromDatetime(datetime(2024, 1, 2, tzinfo=timezone.utc))
    imported.metadata.update(big)
    with pytest.raises(errors.RecordTooLarge):
        await client.memory_import(A, [imported])
    assert (await client.memory_list(A)).entries == []
    for rpc in ("Append", "Import"):
        assert "RECORD_TOO_LARGE" in (declared_reasons(f"/fencepost.v1.MemoryService/{rpc}") or ())


async def test_record_too_large_names_the_field_that_grew_the_record(client: fencepost.AsyncClient) -> None:
    """A record can outgrow the lane through any field without a cap of its
    own; the refusal names that field, not `metadata` when none was sent."""
    big = "x" * 17_000
    grown = {
        "provenance.session_id": {"session_id": big},
        "provenance.channel": {"channel": big},
        "supersedes": {"supersedes": big},
        "metadata": {"metadata": {"blob": big}, "supersedes": "y" * 100},
    }
    for field, fields in grown.items():
        with pytest.raises(errors.RecordTooLarge) as refused:
            await client.memory_append(A, "small fact", **fields)
        assert list(refused.value.field_violations) == [field]
    for field, value in (("id", big), ("supersedes", big), ("provenance.session_id", big)):
        entry = pb.MemoryEntry(id="imp-1", content="small fact")
        entry.created_at.FromDatetime(datetime(2024, 1, 2, tzinfo=timezone.utc))
        if field == "id":
            entry.id = value
        elif field == "supersedes":
            entry.supersedes = value
        else:
            entry.provenance.session_id = value
        with pytest.raises(errors.RecordTooLarge) as refused:
            await client.memory_import(A, [pb.MemoryEntry(id="fine", content="c", created_at=entry.created_at), entry])
        assert list(refused.value.field_violations) == [f"entries[1].{field}"]
    assert (await client.memory_list(A)).entries == []


class _LaneAlwaysTaken(MemoryStorage):
    """Every append to a memory lane loses the race for its position (as
    under a writer that always gets there first)."""

    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        if "/memory/lane/" in key:
            return CasResult(False, "v0")
        return await super().put_if_absent(key, value)


async def test_a_lane_that_keeps_moving_is_a_declared_txn_contended() -> None:
    async with running(_LaneAlwaysTaken()) as srv, srv.client(timeout=30) as c:
        with pytest.raises(errors.TxnContended):
            await c.memory_append(A, "fact")
        imported = pb.MemoryEntry(id="imp-1", content="fact")
        imported.created_at.FromDatetime(datetime(2024, 1, 2, tzinfo=timezone.utc))
        with pytest.raises(errors.TxnContended):
            await c.memory_import(A, [imported])
    from fencepost.contract import declared_reasons

    for rpc in ("Append", "Forget", "ReassertTrust", "Pin", "Unpin", "Import"):
        assert "TXN_CONTENDED" in (declared_reasons(f"/fencepost.v1.MemoryService/{rpc}") or ()), rpc


async def test_import_keeps_any_valid_created_at_and_requires_one(client: fencepost.AsyncClient) -> None:
    """Import is verbatim: a created_at at or before 1970-01-01 (a valid
    Timestamp) was refused as "created_at is required" although it was set."""
    old = pb.MemoryEntry(id="old", content="from before the epoch")
    old.created_at.FromDatetime(datetime(1969, 7, 20, 20, 17, tzinfo=timezone.utc))
    epoch = pb.MemoryEntry(id="epoch", content="at the epoch")
    epoch.created_at.FromDatetime(datetime(1970, 1, 1, tzinfo=timezone.utc))
    assert (await client.memory_import(A, [old, epoch])).imported == 2
    listed = (await client.memory_list(A)).entries
    assert [(e.id, e.created_at.ToDatetime(tzinfo=timezone.utc)) for e in listed] == [
        ("old", datetime(1969, 7, 20, 20, 17, tzinfo=timezone.utc)),
        ("epoch", datetime(1970, 1, 1, tzinfo=timezone.utc)),
    ]
    with pytest.raises(errors.FieldInvalid) as err:
        await client.memory_import(A, [pb.MemoryEntry(id="unset", content="no created_at")])
    assert "entries[0].created_at is required" in str(err.value)


async def test_import_refuses_an_unknown_kind_or_trust_as_append_does(client: fencepost.AsyncClient) -> None:
    """An enum number the server does not know was dropped on Import (the
    entry stored without its kind or trust label) where Append refuses it:
    Import validates what Append does, and writes nothing of the call."""
    ok = pb.MemoryEntry(id="ok", content="kept", kind=pb.MEMORY_KIND_SEMANTIC)
    ok.created_at.FromDatetime(datetime(2026, 1, 1, tzinfo=timezone.utc))
    odd_kind = pb.MemoryEntry(id="k", content="odd kind", kind=99)
    odd_kind.created_at.CopyFrom(ok.created_at)
    odd_trust = pb.MemoryEntry(id="t", content="odd trust", provenance=pb.MemoryProvenance(trust=77))
    odd_trust.created_at.CopyFrom(ok.created_at)
    for bad, field in ((odd_kind, "entries[1].kind"), (odd_trust, "entries[1].provenance.trust")):
        with pytest.raises(errors.FieldInvalid) as err:
            await client.memory_import(A, [ok, bad])
        assert field in str(err.value)
    assert (await client.memory_list(A)).entries == []


async def test_a_page_token_with_limit_is_refused_not_ignored(client: fencepost.AsyncClient) -> None:
    """List with `limit` is the bounded read and issues no tokens; a token sent
    with it (another tenant's, an altered one, anything) was silently ignored
    and the list served, where every listing refuses a token it did not issue."""
    await client.memory_append(A, "one")
    await client.memory_append(A, "two")
    token = (await client.memory_list(A, page_size=1)).next_page_token
    assert token
    for sent in (token, "garbage"):
        with pytest.raises(errors.PageTokenInvalid):
            await client.memory_list(A, limit=5, page_token=sent)
    assert len((await client.memory_list(A, limit=5)).entries) == 2
