"""spec/memory.md statement by statement, over gRPC against a real server on
every backend: the pin budget at its bound, supersession chains, validity in
reads and search, import idempotency and its limits, paging and caps."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost.v1 import memory_pb2 as pb
from fencepost_server.storage import Storage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import running

A = "tester"


def imported(eid: str, content: str, **fields: object) -> pb.MemoryEntry:
    e = pb.MemoryEntry(id=eid, content=content, **fields)  # type: ignore[arg-type]
    if not e.HasField("created_at"):
        e.created_at.FromDatetime(datetime(2024, 1, 2, tzinfo=timezone.utc))
    return e


async def ids_of_list(client: fencepost.AsyncClient, **kw: object) -> list[str]:
    return [e.id for e in (await client.memory_list(A, **kw)).entries]  # type: ignore[arg-type]


async def test_pin_budget_exactly_at_the_bound_then_one_byte_past(client: fencepost.AsyncClient) -> None:
    """2048 bytes (UTF-8, not characters) pin; one more byte is refused naming
    the cap, and nothing that was pinned moves or goes."""
    first = await client.memory_append(A, "é" * 512)  # 1024 bytes, 512 characters
    second = await client.memory_append(A, "x" * 1024)
    extra = await client.memory_append(A, "y")
    one = await client.memory_pin(A, first.id)
    assert (one.pinned, one.bytes) == (True, 1024)
    two = await client.memory_pin(A, second.id)
    assert (two.pinned, two.bytes, two.reason) == (True, 2048, "")
    refused = await client.memory_pin(A, extra.id)
    assert not refused.pinned and refused.bytes == 2048 and refused.blocking_id == ""
    assert "2048-byte cap" in refused.reason
    for allocated in (False, True):
        got = await client.memory_pinned(A, allocated=allocated)
        assert [e.id for e in got.entries] == [first.id, second.id] and got.allocated_bytes == 2048
    again = await client.memory_pin(A, first.id)  # re-pinning does not move it
    assert (again.pinned, again.bytes) == (True, 2048)
    assert [e.id for e in (await client.memory_pinned(A)).entries] == [first.id, second.id]
    inj = await client.memory_injection(A)
    assert [e.id for e in inj.pinned] == [first.id, second.id] and [e.id for e in inj.recent] == [extra.id]
    assert await client.memory_unpin(A, first.id)
    assert (await client.memory_pin(A, extra.id)).pinned  # room again: goes last
    assert [e.id for e in (await client.memory_pinned(A)).entries] == [second.id, extra.id]


async def test_a_pin_holds_its_budget_while_superseded_or_out_of_window(client: fencepost.AsyncClient) -> None:
    now = datetime.now(timezone.utc)
    pinned = await client.memory_append(A, "p" * 1500)
    assert (await client.memory_pin(A, pinned.id)).pinned
    successor = await client.memory_append(A, "q" * 600, supersedes=pinned.id)
    cur = await client.memory_pinned(A)
    assert cur.entries == [] and cur.allocated_bytes == 1500
    alloc = await client.memory_pinned(A, allocated=True)
    assert [(e.id, e.superseded) for e in alloc.entries] == [(pinned.id, True)]
    refused = await client.memory_pin(A, successor.id)  # 1500 + 600 > 2048: the superseded pin keeps its bytes
    assert not refused.pinned and "2048-byte cap" in refused.reason
    with pytest.raises(errors.EntryNotFound):
        await client.memory_pin(A, pinned.id)  # superseded: not live
    assert await client.memory_forget(A, pinned.id) is False  # not live either
    # forgetting the successor releases the predecessor, pinned as before
    assert await client.memory_forget(A, successor.id)
    assert [e.id for e in (await client.memory_pinned(A)).entries] == [pinned.id]
    expired = await client.memory_append(A, "e" * 500, valid_until=now - timedelta(seconds=1))
    assert (await client.memory_pin(A, expired.id)).pinned  # live, out of window: may pin
    assert [e.id for e in (await client.memory_pinned(A)).entries] == [pinned.id]
    alloc = await client.memory_pinned(A, allocated=True)
    assert [e.id for e in alloc.entries] == [pinned.id, expired.id] and alloc.allocated_bytes == 2000


async def test_supersession_chain_and_release(client: fencepost.AsyncClient) -> None:
    a = await client.memory_append(A, "lives in Paris", about=["home"])
    b = await client.memory_append(A, "lives in Berlin", about=["home"], supersedes=a.id)
    with pytest.raises(errors.SupersedesInvalid):  # a is no longer live
        await client.memory_append(A, "lives in Rome", supersedes=a.id)
    c = await client.memory_append(A, "lives in Lisbon", about=["home"], supersedes=b.id)
    assert await ids_of_list(client) == [c.id]
    assert [e.id for e in (await client.memory_search(A, "lives")).entries] == [c.id]
    assert [(t.name, t.count) for t in await client.memory_topics(A)] == [("home", 1)]
    audit = (await client.memory_audit(A)).entries
    assert [(e.id, e.superseded, e.forgotten) for e in audit] == [
        (a.id, True, False), (b.id, True, False), (c.id, False, False)
    ]
    assert list(e.supersedes for e in audit) == ["", a.id, b.id]
    assert await client.memory_forget(A, c.id)
    assert await ids_of_list(client) == [b.id]
    assert await client.memory_forget(A, b.id)
    assert await ids_of_list(client) == [a.id]
    with pytest.raises(errors.SupersedesInvalid):  # a forgotten entry cannot be superseded
        await client.memory_append(A, "x", supersedes=c.id)


async def test_two_successors_both_retire_and_both_stay_live(client: fencepost.AsyncClient) -> None:
    a = await client.memory_append(A, "team size is 5")
    b = await client.memory_append(A, "team size is 6", supersedes=a.id)
    # a is retired by b, so a second successor naming a is refused (not live)
    with pytest.raises(errors.SupersedesInvalid):
        await client.memory_append(A, "team size is 7", supersedes=a.id)
    assert await ids_of_list(client) == [b.id]
    # imported successors may both name one predecessor (import is verbatim)
    res = await client.memory_import("pair", [
        imported("p", "old"), imported("s1", "new one", supersedes="p"), imported("s2", "new two", supersedes="p"),
    ])
    assert res.imported == 3
    assert [e.id for e in (await client.memory_list("pair")).entries] == ["s1", "s2"]
    assert await client.memory_forget("pair", "s1")
    assert [e.id for e in (await client.memory_list("pair")).entries] == ["s2"]  # s2 still retires p
    assert await client.memory_forget("pair", "s2")
    assert [e.id for e in (await client.memory_list("pair")).entries] == ["p"]


async def test_a_future_successor_retires_only_from_its_valid_from(client: fencepost.AsyncClient) -> None:
    """The cached view crosses a validity boundary while nothing is written."""
    soon = datetime.now(timezone.utc) + timedelta(milliseconds=600)
    a = await client.memory_append(A, "price is 10", about=["price"])
    b = await client.memory_append(A, "price is 12", about=["price"], supersedes=a.id, valid_from=soon)
    assert b.validity == pb.MEMORY_VALIDITY_NOT_YET_VALID
    assert await ids_of_list(client) == [a.id]
    assert await ids_of_list(client, all_validity=True) == [a.id, b.id]
    marks = {e.id: e.validity for e in (await client.memory_search(A, "price")).entries}
    assert marks == {a.id: pb.MEMORY_VALIDITY_CURRENT, b.id: pb.MEMORY_VALIDITY_NOT_YET_VALID}
    while datetime.now(timezone.utc) < soon + timedelta(milliseconds=50):
        await asyncio.sleep(0.05)
    assert await ids_of_list(client) == [b.id]
    assert [e.id for e in (await client.memory_search(A, "price")).entries] == [b.id]
    assert [(t.name, t.count) for t in await client.memory_topics(A)] == [("price", 1)]


async def test_validity_bounds_on_reads_search_and_topics(client: fencepost.AsyncClient) -> None:
    now = datetime.now(timezone.utc)
    expired = await client.memory_append(A, "meeting on monday", about=["Meetings"],
                                         valid_until=now - timedelta(seconds=1))
    future = await client.memory_append(A, "meeting on friday", about=["meetings"],
                                        valid_from=now + timedelta(days=1))
    current = await client.memory_append(A, "meeting room 4", about=["MEETINGS"], trust="external",
                                         valid_from=now - timedelta(days=1), valid_until=now + timedelta(days=1))
    assert await ids_of_list(client) == [current.id]
    assert await ids_of_list(client, all_validity=True) == [expired.id, future.id, current.id]
    found = (await client.memory_search(A, "meeting")).entries
    assert [(e.id, e.validity) for e in found] == [
        (current.id, pb.MEMORY_VALIDITY_CURRENT), (future.id, pb.MEMORY_VALIDITY_NOT_YET_VALID),
        (expired.id, pb.MEMORY_VALIDITY_EXPIRED),
    ]
    # topics are over entries true now: one entry, named as that entry spells it
    assert [(t.name, t.count, t.trust) for t in await client.memory_topics(A)] == [
        ("MEETINGS", 1, pb.MEMORY_TRUST_EXTERNAL)
    ]
    with pytest.raises(errors.FieldInvalid):  # an empty window
        await client.memory_append(A, "never true", valid_from=now, valid_until=now)


async def test_topics_count_name_newest_and_least_trusted(client: fencepost.AsyncClient) -> None:
    e1 = await client.memory_append(A, "one", about=["Beta", "alpha"], trust="own")
    e2 = await client.memory_append(A, "two", about=["beta"], trust="user")
    e3 = await client.memory_append(A, "three", about=["gamma", "BETA"], trust="operator")
    gone = await client.memory_append(A, "four", about=["alpha", "gamma"], trust="external")
    assert await client.memory_forget(A, gone.id)
    topics = await client.memory_topics(A)
    assert [(t.name, t.count, t.trust) for t in topics] == [
        ("Beta", 3, pb.MEMORY_TRUST_USER), ("alpha", 1, pb.MEMORY_TRUST_OWN), ("gamma", 1, pb.MEMORY_TRUST_OPERATOR),
    ]
    newest = {t.name: t.last_updated_at.ToDatetime() for t in topics}
    assert newest["Beta"] == e3.created_at.ToDatetime() and newest["alpha"] == e1.created_at.ToDatetime()
    assert e2.created_at.ToDatetime() <= newest["Beta"]


async def test_import_rerun_partial_overlap_and_duplicates(client: fencepost.AsyncClient) -> None:
    first = [imported(f"imp-{i}", f"fact {i}") for i in range(3)]
    assert (await client.memory_import(A, first)).imported == 3
    mixed = [imported("imp-1", "changed text"), imported("new-1", "fresh"), imported("new-1", "fresh twice")]
    res = await client.memory_import(A, mixed)
    assert res.imported == 1 and list(res.skipped) == ["imp-1", "new-1"]
    listed = {e.id: e.content for e in (await client.memory_list(A)).entries}
    assert listed == {"imp-0": "fact 0", "imp-1": "fact 1", "imp-2": "fact 2", "new-1": "fresh"}
    again = await client.memory_import(A, first + mixed)
    assert again.imported == 0
    assert sorted(again.skipped) == sorted(["imp-0", "imp-1", "imp-2", "imp-1", "new-1", "new-1"])


async def test_import_keeps_fields_verbatim_and_validates_before_writing(client: fencepost.AsyncClient) -> None:
    vf, vu = datetime(2020, 1, 1, tzinfo=timezone.utc), datetime(2099, 1, 1, tzinfo=timezone.utc)
    e = imported("keep", "kept as is", kind=pb.MEMORY_KIND_PROCEDURAL, about=[" Ops ", "ops", ""],
                 provenance=pb.MemoryProvenance(session_id="s", channel="cli", trust=pb.MEMORY_TRUST_USER))
    e.valid_from.FromDatetime(vf)
    e.valid_until.FromDatetime(vu)
    e.metadata.update({"k": "v"})
    assert (await client.memory_import(A, [e])).imported == 1
    [got] = (await client.memory_list(A)).entries
    assert (got.id, got.kind, list(got.about), got.provenance.trust, got.provenance.channel, dict(got.metadata)) == (
        "keep", pb.MEMORY_KIND_PROCEDURAL, ["Ops"], pb.MEMORY_TRUST_USER, "cli", {"k": "v"})
    assert got.valid_from.ToDatetime(tzinfo=timezone.utc) == vf
    assert got.valid_until.ToDatetime(tzinfo=timezone.utc) == vu
    # one bad entry anywhere (past the first 100-record chunk too) writes nothing
    many = [imported(f"m{i}", f"m {i}") for i in range(150)] + [imported("big", "x" * 4097)]
    with pytest.raises(errors.ContentTooLarge) as err:
        await client.memory_import(A, many)
    assert "entries[150]" in str(err.value)
    with pytest.raises(errors.FieldInvalid):
        await client.memory_import(A, [imported(f"n{i}", "n") for i in range(1001)])
    with pytest.raises(errors.FieldInvalid):
        await client.memory_import(A, [imported("", "no id")])
    assert await ids_of_list(client) == ["keep"]
    # 150 entries (two transactions) in, then a re-run is a no-op
    assert (await client.memory_import(A, many[:150])).imported == 150
    res = await client.memory_import(A, many[:150])
    assert res.imported == 0 and len(res.skipped) == 150
    assert len([x async for x in client.memory_list_all(A)]) == 151


async def test_minted_ids_never_repeat_imported_ones(client: fencepost.AsyncClient) -> None:
    a = await client.memory_append(A, "minted one")
    assert (await client.memory_import(A, [imported("mem-5", "imported five")])).imported == 1
    nxt = await client.memory_append(A, "minted two")
    assert a.id == "mem-1" and nxt.id == "mem-6"


async def test_list_paging_tokens_and_caps(client: fencepost.AsyncClient) -> None:
    ids = [(await client.memory_append(A, f"entry {i}")).id for i in range(5)]
    got, token = [], ""
    while True:
        page = await client.memory_list(A, page_size=2, page_token=token)
        assert len(page.entries) <= 2 and not page.truncated
        got.extend(e.id for e in page.entries)
        token = page.next_page_token
        if not token:
            break
    assert got == ids
    token = (await client.memory_list(A, page_size=2)).next_page_token
    with pytest.raises(errors.PageTokenInvalid):  # issued for the current listing, not for `all`
        await client.memory_list(A, page_size=2, page_token=token, all_validity=True)
    with pytest.raises(errors.PageTokenInvalid):
        await client.memory_list("someone-else", page_size=2, page_token=token)
    with pytest.raises(errors.PageSizeInvalid):
        await client.memory_list(A, page_size=-1)
    with pytest.raises(errors.PageSizeInvalid):
        await client.memory_audit(A, page_size=-1)
    audit_token = (await client.memory_audit(A, page_size=2)).next_page_token
    with pytest.raises(errors.PageTokenInvalid):
        await client.memory_list(A, page_size=2, page_token=audit_token)
    big = await client.memory_list(A, page_size=5000)
    assert [e.id for e in big.entries] == ids and big.next_page_token == ""


async def test_bounded_list_stops_at_16384_bytes(client: fencepost.AsyncClient) -> None:
    ids = [(await client.memory_append(A, chr(ord("a") + i) * 4096)).id for i in range(5)]
    res = await client.memory_list(A, limit=10)
    assert [e.id for e in res.entries] == ids[1:] and res.truncated  # 4 x 4096 = 16384 exactly
    res = await client.memory_list(A, limit=4)
    assert [e.id for e in res.entries] == ids[1:] and res.truncated
    res = await client.memory_list(A, limit=2)
    assert [e.id for e in res.entries] == ids[3:] and res.truncated
    with pytest.raises(errors.FieldInvalid):
        await client.memory_list(A, limit=-1)


async def test_search_limit_default_clamp_and_truncation(client: fencepost.AsyncClient) -> None:
    for i in range(55):
        await client.memory_append(A, f"needle {i}")
    for limit, n in ((0, 10), (-3, 10), (1, 1), (50, 50), (51, 50), (1000, 50)):
        res = await client.memory_search(A, "NEEDLE", limit=limit)
        assert len(res.entries) == n and res.truncated
    newest = (await client.memory_search(A, "needle", limit=3)).entries
    assert [e.content for e in newest] == ["needle 54", "needle 53", "needle 52"]
    assert (await client.memory_search(A, "needle 54")).entries[0].content == "needle 54"
    assert (await client.memory_search(A, "needl")).entries == []  # whole tokens only
    one = await client.memory_search(A, "needle 7")
    assert [e.content for e in one.entries] == ["needle 7"] and not one.truncated


async def test_search_tokenizes_unicode_as_the_spec_says(client: fencepost.AsyncClient) -> None:
    e = await client.memory_append(A, "Straße café_Menü 42nd", about=["Ünïcode-Key"])
    for q in ("STRASSE", "strasse", "cafe\u0301", "menü", "42nd", "ünïcode key", "KEY"):
        assert [x.id for x in (await client.memory_search(A, q)).entries] == [e.id], q
    for q in ("caf", "42", "café_menü ", "strass"):
        hits = [x.id for x in (await client.memory_search(A, q)).entries]
        assert hits == ([e.id] if q == "café_menü " else []), q


async def test_memory_survives_a_restart_and_ids_continue(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    storage = SqliteStorage(path, synchronous="FULL")
    async with running(storage) as srv, srv.client(timeout=10.0) as client:
        a = await client.memory_append(A, "durable fact", about=["dur"], request_id="append-a")
        b = await client.memory_append(A, "to forget")
        assert (await client.memory_pin(A, a.id)).pinned
        assert await client.memory_forget(A, b.id)
    await storage.close()
    storage = SqliteStorage(path, synchronous="FULL")
    try:
        async with running(storage) as srv, srv.client(timeout=10.0) as client:
            assert await ids_of_list(client) == [a.id]
            assert [e.id for e in (await client.memory_pinned(A)).entries] == [a.id]
            retry = await client.memory_append(A, "durable fact", about=["dur"], request_id="append-a")
            assert retry.id == a.id  # the lane remembers the request id across the restart
            c = await client.memory_append(A, "after restart")
            assert c.id not in (a.id, b.id) and c.id == "mem-3"
    finally:
        await storage.close()


async def test_about_caps_count_after_cleaning(client: fencepost.AsyncClient) -> None:
    twelve = [f"k{i:02d}" for i in range(12)]
    assert len((await client.memory_append(A, "ok", about=twelve + [" K00 ", "", "  "])).about) == 12
    with pytest.raises(errors.AboutTooLarge):
        await client.memory_append(A, "no", about=twelve + ["k12"])
    exact = ["a" * 256, "b" * 256]
    assert list((await client.memory_append(A, "ok", about=exact)).about) == exact
    with pytest.raises(errors.AboutTooLarge) as err:
        await client.memory_append(A, "no", about=["a" * 256, "b" * 257])
    assert err.value.metadata["limit"] == "512" and err.value.metadata["size"] == "513"
    assert (await client.memory_append(A, "é" * 2048)).content == "é" * 2048  # 4096 bytes
    with pytest.raises(errors.ContentTooLarge):
        await client.memory_append(A, "é" * 2048 + "x")


async def test_injection_topics_keep_whole_lines_within_4096_bytes(client: fencepost.AsyncClient) -> None:
    for i in range(40):
        await client.memory_append(A, f"fact {i}", about=[f"topic-{i:02d}-" + "t" * 100])
    topics = await client.memory_topics(A)
    assert len(topics) == 40  # the Topics RPC returns every topic
    inj = await client.memory_injection(A)
    lines = inj.topics_text.splitlines(keepends=True)
    assert 0 < len(inj.topics) == len(lines) < 40
    assert len(inj.topics_text.encode()) <= 4096
    assert [t.name for t in inj.topics] == [t.name for t in topics[: len(inj.topics)]]
    assert all(t.name in line for t, line in zip(inj.topics, lines))
    assert [e.content for e in inj.recent] == [f"fact {i}" for i in range(32, 40)]



async def test_a_skipped_duplicate_does_not_lend_its_forgotten_mark_to_the_imported_entry(
        client: fencepost.AsyncClient) -> None:
    """Within one call a repeated id is skipped; the entry imported is the
    first one, as it was sent: a later duplicate marked `forgotten` must not
    tombstone it (nor an unmarked duplicate revive a forgotten one)."""
    live = imported("dup", "kept live")
    gone = imported("dup", "kept live", forgotten=True)
    res = await client.memory_import(A, [live, gone])
    assert res.imported == 1 and list(res.skipped) == ["dup"]
    assert await ids_of_list(client) == ["dup"]
    res = await client.memory_import("other", [gone, live])
    assert res.imported == 1 and list(res.skipped) == ["dup"]
    assert [e.id for e in (await client.memory_list("other")).entries] == []
    assert [(e.id, e.forgotten) for e in (await client.memory_audit("other")).entries] == [("dup", True)]


async def test_an_entry_with_only_the_required_fields_is_recalled_and_injected(
        client: fencepost.AsyncClient) -> None:
    bare = pb.MemoryEntry(id="bare-1", content="the bare minimum", agent_id="anyone")
    bare.created_at.FromDatetime(datetime(2023, 3, 4, tzinfo=timezone.utc))
    assert (await client.memory_import(A, [bare])).imported == 1
    [found] = (await client.memory_search(A, "minimum")).entries
    assert (found.id, found.agent_id, found.provenance.trust, found.kind) == (
        "bare-1", A, pb.MEMORY_TRUST_UNKNOWN, pb.MEMORY_KIND_UNSPECIFIED)
    assert found.validity == pb.MEMORY_VALIDITY_CURRENT and found.usage.recall_count == 1
    assert [e.id for e in (await client.memory_injection(A)).recent] == ["bare-1"]
    assert (await client.memory_pin(A, "bare-1")).pinned


async def test_injection_recent_skips_pins_and_keeps_its_bounds(client: fencepost.AsyncClient) -> None:
    ids = [(await client.memory_append(A, f"note {i}")).id for i in range(10)]
    for pinned in ids[-2:]:
        assert (await client.memory_pin(A, pinned)).pinned
    inj = await client.memory_injection(A)
    assert [e.id for e in inj.pinned] == ids[-2:]
    assert [e.id for e in inj.recent] == ids[:8]  # eight newest unpinned, oldest first
    big = [(await client.memory_append("bytes", c * 1500)).id for c in "abcd"]
    inj = await client.memory_injection("bytes")
    assert [e.id for e in inj.recent] == big[2:]  # a third 1500-byte entry would pass 4096 bytes


class _Model:
    """spec/memory.md written out plainly: liveness, supersession, the pin
    budget's prefix rule, topics. The server must agree after every step."""

    def __init__(self) -> None:
        self.entries: dict[str, dict] = {}  # type: ignore[type-arg]
        self.order: list[str] = []
        self.tombstoned: set[str] = set()
        self.pins: list[str] = []

    def superseded(self, eid: str) -> bool:
        return any(e["supersedes"] == eid and e["current"] and i not in self.tombstoned
                   for i, e in self.entries.items())

    def live(self, eid: str) -> bool:
        return eid in self.entries and eid not in self.tombstoned and not self.superseded(eid)

    def budget(self) -> tuple[list[str], list[str], int]:
        effective, inert, total = [], [], 0
        for pid in self.pins:
            if pid in self.tombstoned:
                continue
            size = self.entries[pid]["bytes"]
            if not inert and total + size <= 2048:
                effective.append(pid)
                total += size
            else:
                inert.append(pid)
        return effective, inert, total


async def test_a_random_history_agrees_with_the_spec_model(client: fencepost.AsyncClient, scaled: object) -> None:
    import random

    rng = random.Random(20240501)
    now = datetime.now(timezone.utc)
    model = _Model()
    steps = scaled(160, 50)  # type: ignore[operator]
    for _ in range(steps):
        op = rng.choice(["append", "append", "supersede", "forget", "pin", "pin", "unpin"])
        known = model.order or ["mem-404"]
        if op in ("append", "supersede"):
            window = rng.choice(["open", "open", "expired", "future", "bounded"])
            kw: dict = {"about": rng.sample(["red", "Blue", "green"], rng.randint(0, 2))}  # type: ignore[type-arg]
            if window == "expired":
                kw["valid_until"] = now - timedelta(hours=1)
            elif window == "future":
                kw["valid_from"] = now + timedelta(hours=1)
            elif window == "bounded":
                kw["valid_from"], kw["valid_until"] = now - timedelta(hours=1), now + timedelta(hours=1)
            target = rng.choice(known) if op == "supersede" else None
            content = "c" * rng.choice([1, 100, 500, 900, 1500])
            if target is not None and not model.live(target):
                with pytest.raises(errors.SupersedesInvalid):
                    await client.memory_append(A, content, supersedes=target, **kw)
                continue
            e = await client.memory_append(A, content, supersedes=target, **kw)
            model.entries[e.id] = {"bytes": len(content), "supersedes": target,
                                   "current": window not in ("expired", "future"), "about": kw["about"]}
            model.order.append(e.id)
        elif op == "forget":
            target = rng.choice(known)
            expected = model.live(target)
            assert await client.memory_forget(A, target) is expected
            if expected:
                model.tombstoned.add(target)
        elif op == "pin":
            target = rng.choice(known)
            if not model.live(target):
                with pytest.raises(errors.EntryNotFound):
                    await client.memory_pin(A, target)
                continue
            effective, inert, total = model.budget()
            res = await client.memory_pin(A, target)
            if target in effective:
                assert res.pinned
            elif inert:
                assert not res.pinned and res.blocking_id == inert[0]
            elif total + model.entries[target]["bytes"] > 2048:
                assert not res.pinned and "2048-byte cap" in res.reason and res.bytes == total
            else:
                assert res.pinned
                model.pins.append(target)
        else:
            target = rng.choice(known)
            expected = target in model.pins
            assert await client.memory_unpin(A, target) is expected
            if expected:
                model.pins.remove(target)
        live = [i for i in model.order if model.live(i)]
        current = [i for i in live if model.entries[i]["current"]]
        assert [e.id for e in (await client.memory_list(A, all_validity=True, page_size=1000)).entries] == live
        assert [e.id for e in (await client.memory_list(A, page_size=1000)).entries] == current
        effective, _, total = model.budget()
        alloc = await client.memory_pinned(A, allocated=True)
        assert [e.id for e in alloc.entries] == effective and alloc.allocated_bytes == total
        assert [e.id for e in (await client.memory_pinned(A)).entries] == [i for i in effective if i in current]
        counts: dict[str, int] = {}
        for i in current:
            for key in model.entries[i]["about"]:
                counts[key.lower()] = counts.get(key.lower(), 0) + 1
        assert {t.name.lower(): t.count for t in await client.memory_topics(A)} == counts


async def test_audit_then_import_reproduces_every_view(client: fencepost.AsyncClient) -> None:
    now = datetime.now(timezone.utc)
    a = await client.memory_append(A, "v1 of the plan", about=["plan"], kind="semantic", trust="user",
                                   metadata={"n": 1}, session_id="s", channel="cli")
    b = await client.memory_append(A, "v2 of the plan", about=["Plan"], supersedes=a.id)
    c = await client.memory_append(A, "v3 of the plan", supersedes=b.id, valid_from=now + timedelta(days=1))
    d = await client.memory_append(A, "old news", valid_until=now - timedelta(days=1), about=["news"])
    e = await client.memory_append(A, "a secret", about=["plan"])
    f = await client.memory_append(A, "retired then released", trust="external")
    g = await client.memory_append(A, "successor that goes", supersedes=f.id)
    assert await client.memory_forget(A, e.id) and await client.memory_forget(A, g.id)
    assert await client.memory_reassert_trust(A, b.id, "own")
    audit = [x async for x in _audit_all(client, A)]
    assert (await client.memory_import("moved", audit)).imported == 7
    assert (await client.memory_import("moved", audit)).imported == 0

    def shape(entries: list[pb.MemoryEntry]) -> list[tuple]:  # type: ignore[type-arg]
        return [(x.id, x.content, x.created_at.ToMicroseconds(), x.kind, tuple(x.about), x.supersedes,
                 dict(x.metadata), x.provenance.trust, x.provenance.session_id, x.provenance.channel,
                 x.validity, x.forgotten, x.superseded) for x in entries]

    for kw in ({}, {"all_validity": True}):
        assert shape(list((await client.memory_list("moved", **kw)).entries)) == shape(
            list((await client.memory_list(A, **kw)).entries))
    moved = [x async for x in _audit_all(client, "moved")]
    assert [(x.id, x.forgotten, x.superseded) for x in moved] == [(x.id, x.forgotten, x.superseded) for x in audit]
    assert [(t.name, t.count, t.trust) for t in await client.memory_topics("moved")] == [
        (t.name, t.count, t.trust) for t in await client.memory_topics(A)]
    assert {x.id for x in (await client.memory_list("moved")).entries} == {b.id, f.id}
    assert c.id and d.id
    assert (await client.memory_append("moved", "next")).id == "mem-8"


async def _audit_all(client: fencepost.AsyncClient, agent: str):  # type: ignore[no-untyped-def]
    token = ""
    while True:
        page = await client.memory_audit(agent, page_size=3, page_token=token)
        for x in page.entries:
            yield x
        token = page.next_page_token
        if not token:
            return


async def test_losing_the_usage_index_loses_statistics_never_memories(storage: Storage) -> None:
    from fencepost_server.domain.prefix import delete_prefix

    async with running(storage) as srv, srv.client(timeout=10.0) as client:
        e = await client.memory_append(A, "remember the usage")
        assert (await client.memory_search(A, "usage")).entries[0].usage.recall_count == 1
        assert (await client.memory_search(A, "usage")).entries[0].usage.recall_count == 2
        usage_keys = [k for k in await storage.list_keys("default/", None, 1000) if "/memory/usage/" in k]
        assert usage_keys
        await delete_prefix(storage, usage_keys[0].rsplit("/", 1)[0] + "/")
        [found] = (await client.memory_search(A, "usage")).entries
        assert found.id == e.id and found.usage.recall_count == 1
        assert [x.id for x in (await client.memory_list(A)).entries] == [e.id]
