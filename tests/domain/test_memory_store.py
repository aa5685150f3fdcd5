"""MemoryStore over every backend (the `storage` fixture), with a test clock."""

from __future__ import annotations

import asyncio

import pytest

from fencepost_server.domain.errors import InvalidArgument, NotFound
from fencepost_server.domain.memory import Entry, MemoryStore, NewEntry
from fencepost_server.domain.memory import rules
from fencepost_server.storage import Storage

T, A, B = "tenant", "agent-a", "agent-b"


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        self.now += 1  # every write gets its own created_at
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def mem(storage: Storage, clock: Clock) -> MemoryStore:
    return MemoryStore(storage, clock=clock)


async def lane_len(storage: Storage) -> int:
    return len(await storage.list_keys("", None, 10_000))


async def ids(mem: MemoryStore, agent: str = A, **kw: object) -> list[str]:
    return [v.entry.id for v in (await mem.list(T, agent, **kw)).entries]  # type: ignore[arg-type]


async def test_caps_refuse_and_write_nothing(mem: MemoryStore, storage: Storage) -> None:
    before = await lane_len(storage)
    for content, options, reason in [
        ("x" * 4097, NewEntry(), "CONTENT_TOO_LARGE"),
        ("ok", NewEntry(about=[f"k{i}" for i in range(13)]), "ABOUT_TOO_LARGE"),
        ("ok", NewEntry(about=["a" * 300, "b" * 213]), "ABOUT_TOO_LARGE"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            await mem.append(T, A, content, options)
        assert err.value.reason == reason
    assert await lane_len(storage) == before
    # cleaning happens before the cap: 13 spellings of 12 keys fit
    e = await mem.append(T, A, "ok", NewEntry(about=[" Deploy ", "deploy", *[f"k{i}" for i in range(11)], ""]))
    assert e.about == ("Deploy", *[f"k{i}" for i in range(11)])


async def test_list_search_order_and_forget(mem: MemoryStore, clock: Clock) -> None:
    a = await mem.append(T, A, "the deploy uses postgres")
    b = await mem.append(T, A, "Deploy window is Friday")
    c = await mem.append(T, A, "unrelated")
    assert await ids(mem) == [a.id, b.id, c.id]
    found = await mem.search(T, A, "deploy")
    assert [v.entry.id for v in found.entries] == [b.id, a.id] and found.strategy == "recency"
    assert (await mem.search(T, A, "...")).entries == []
    assert await mem.forget(T, A, a.id)
    assert not await mem.forget(T, A, a.id)
    assert not await mem.forget(T, A, "mem-999")
    assert await ids(mem) == [b.id, c.id]
    audit = (await mem.audit(T, A)).entries
    assert [(v.entry.id, v.forgotten) for v in audit] == [(a.id, True), (b.id, False), (c.id, False)]


async def test_relevance_and_hybrid_orders(mem: MemoryStore) -> None:
    strong = await mem.append(T, A, "postgres postgres postgres tuning")  # oldest, strongest
    mid = [await mem.append(T, A, f"note {i} names the database postgres once") for i in range(3)]
    weak = await mem.append(T, A, "a long note that mentions postgres once among a great many other words here")
    await mem.append(T, A, "lunch at noon")

    async def order(strategy: str | None) -> list[str]:
        found = await mem.search(T, A, "postgres", strategy=strategy)
        assert found.strategy == (strategy or "recency")
        return [v.entry.id for v in found.entries]

    assert await order(None) == [weak.id, mid[2].id, mid[1].id, mid[0].id, strong.id]
    # equal scores (the three notes) keep the recency order
    assert await order("relevance") == [strong.id, mid[2].id, mid[1].id, mid[0].id, weak.id]
    # reciprocal-rank fusion: the newest and the strongest tie and sit between the notes
    assert await order("hybrid") == [mid[2].id, weak.id, strong.id, mid[1].id, mid[0].id]
    # one length, one query: the entry with more of the rarer query term wins
    for i in range(6):
        await mem.append(T, A, f"common filler {i}")
    rare_heavy = await mem.append(T, A, "rare rare common pad")
    common_heavy = await mem.append(T, A, "rare common common pad")  # newer
    found = await mem.search(T, A, "rare common", strategy="relevance")
    assert [v.entry.id for v in found.entries] == [rare_heavy.id, common_heavy.id]
    both = await mem.search(T, A, "tuning postgres", strategy="relevance")
    assert [v.entry.id for v in both.entries] == [strong.id]  # every token must still match


async def test_search_ties_and_usage(mem: MemoryStore, storage: Storage) -> None:
    await mem.import_entries(T, A, [Entry("z", "same time", 500), Entry("y", "same time", 500), Entry("x", "same", 400)])
    first = await mem.search(T, A, "same")
    assert [v.entry.id for v in first.entries] == ["y", "z", "x"]
    assert [v.usage.recall_count for v in first.entries if v.usage] == [1, 1, 1]
    again = await mem.search(T, A, "time", limit=1)
    assert [v.entry.id for v in again.entries] == ["y"] and again.truncated
    assert again.entries[0].usage and again.entries[0].usage.recall_count == 2
    # losing the usage index loses statistics, never memories
    for key in await storage.list_keys("", None, 1000):
        if "/usage/" in key:
            await storage.delete(key)
    fresh = MemoryStore(storage)
    assert [v.entry.id for v in (await fresh.search(T, A, "same")).entries] == ["y", "z", "x"]


async def test_validity_current_list_and_search_marks(mem: MemoryStore, clock: Clock) -> None:
    now = clock.now
    past = await mem.append(T, A, "fact expired", NewEntry(valid_until=now + 5))
    future = await mem.append(T, A, "fact future", NewEntry(valid_from=now + 1000))
    always = await mem.append(T, A, "fact always")
    clock.now = now + 10
    assert await ids(mem) == [always.id]
    assert await ids(mem, validity="all") == [past.id, future.id, always.id]
    marks = {v.entry.id: v.validity for v in (await mem.search(T, A, "fact")).entries}
    assert marks == {past.id: "expired", future.id: "not-yet-valid", always.id: "current"}
    clock.now = now + 1000 - 1  # `now` is read as +1: exactly valid_from
    assert future.id in await ids(mem)


async def test_supersession_at_an_instant(mem: MemoryStore, clock: Clock) -> None:
    old = await mem.append(T, A, "works at Acme")
    start = clock.now + 100
    new = await mem.append(T, A, "works at Initech", NewEntry(supersedes=old.id, valid_from=start))
    assert await ids(mem, validity="all") == [old.id, new.id]  # successor not current yet: old stands
    clock.now = start
    assert await ids(mem, validity="all") == [new.id]
    assert [v.entry.id for v in (await mem.search(T, A, "works")).entries] == [new.id]
    # the retired entry is not mutable
    assert not await mem.forget(T, A, old.id)
    # forgetting the successor releases it
    assert await mem.forget(T, A, new.id)
    assert await ids(mem) == [old.id]


async def test_two_successors_both_retire(mem: MemoryStore) -> None:
    old = await mem.append(T, A, "v1")
    s1 = await mem.append(T, A, "v2", NewEntry(supersedes=old.id))
    with pytest.raises(InvalidArgument) as err:  # old is no longer live
        await mem.append(T, A, "v3", NewEntry(supersedes=old.id))
    assert err.value.reason == "SUPERSEDES_INVALID"
    # a second successor written while both are live (import keeps it verbatim)
    await mem.import_entries(T, A, [Entry("s2", "v3", 10**18, supersedes=old.id)])
    assert await ids(mem) == [s1.id, "s2"]
    assert await mem.forget(T, A, s1.id)
    assert await ids(mem) == ["s2"]  # s2 still retires it
    assert await mem.forget(T, A, "s2")
    assert await ids(mem) == [old.id]


async def test_supersedes_another_agents_id_is_refused(mem: MemoryStore, storage: Storage) -> None:
    await mem.append(T, A, "mine")
    theirs = await mem.import_entries(T, B, [Entry("b-secret", "b's fact", 5)])
    assert theirs.imported == 1
    before = await lane_len(storage)
    with pytest.raises(InvalidArgument) as err:
        await mem.append(T, A, "takeover", NewEntry(supersedes="b-secret"))
    assert err.value.reason == "SUPERSEDES_INVALID"
    assert await lane_len(storage) == before
    assert await ids(mem, B) == ["b-secret"]
    # nor in another tenant under the same agent name
    await mem.append("other", A, "x")
    with pytest.raises(InvalidArgument):
        await mem.append("other", A, "y", NewEntry(supersedes="b-secret"))


async def test_pins_cap_inert_never_evict_repin(mem: MemoryStore, storage: Storage) -> None:
    big = await mem.append(T, A, "a" * 1500)
    mid = await mem.append(T, A, "b" * 500)
    small = await mem.append(T, A, "c" * 100)
    assert (await mem.pin(T, A, big.id)).pinned
    assert (await mem.pin(T, A, mid.id)).bytes == 2000
    before = await lane_len(storage)
    refused = await mem.pin(T, A, small.id)
    assert not refused.pinned and "2048-byte cap" in refused.reason and refused.bytes == 2000
    assert await lane_len(storage) == before  # nothing recorded
    again = await mem.pin(T, A, big.id)  # re-pin: no move, no record
    assert again.pinned and await lane_len(storage) == before
    views, allocated = await mem.pinned(T, A)
    assert [v.entry.id for v in views] == [big.id, mid.id] and allocated == 2000
    with pytest.raises(NotFound):
        await mem.pin(T, A, "mem-999")


async def test_pin_refused_after_inert_pin_names_blocking_id(mem: MemoryStore, storage: Storage) -> None:
    a = await mem.append(T, A, "a" * 1500)
    b = await mem.append(T, A, "b" * 1000)
    tiny = await mem.append(T, A, "t")
    # two writers that both read an empty budget and appended blind (the race
    # the replay rule resolves): b's pin is recorded but inert
    folded = await mem.fold(T, A)
    for pos, eid in ((folded.head + 1, a.id), (folded.head + 2, b.id)):
        await storage.put_if_absent(
            f"{mem._lane(T, A)}{pos:020d}", f'{{"t":"p","id":"{eid}"}}'.encode()
        )
    out = await mem.pin(T, A, tiny.id)
    assert not out.pinned and out.blocking_id == b.id and b.id in out.reason
    views, _ = await mem.pinned(T, A)
    assert [v.entry.id for v in views] == [a.id]
    assert await mem.unpin(T, A, b.id)  # an inert pin can be unpinned
    assert (await mem.pin(T, A, tiny.id)).pinned


async def test_pinned_current_vs_allocated(mem: MemoryStore, clock: Clock) -> None:
    old = await mem.append(T, A, "old fact")
    brief = await mem.append(T, A, "brief", NewEntry(valid_until=clock.now + 50))
    for e in (old, brief):
        assert (await mem.pin(T, A, e.id)).pinned
    await mem.append(T, A, "new fact", NewEntry(supersedes=old.id))
    clock.now += 100
    current, allocated_bytes = await mem.pinned(T, A)
    allocated, _ = await mem.pinned(T, A, "allocated")
    assert current == []
    assert [v.entry.id for v in allocated] == [old.id, brief.id]
    assert allocated_bytes == len("old fact") + len("brief")
    assert [v.superseded for v in allocated] == [True, False]


async def test_topics_over_entries_true_now(mem: MemoryStore, clock: Clock) -> None:
    await mem.append(T, A, "1", NewEntry(about=["Deploy"], trust="own"))
    await mem.append(T, A, "2", NewEntry(about=["deploy", "DB"], trust="user"))
    await mem.append(T, A, "3", NewEntry(about=["db"], trust="external", valid_until=clock.now + 2))
    clock.now += 10
    topics = await mem.topics(T, A)
    assert [(t.name, t.count, t.trust) for t in topics] == [("Deploy", 2, "user"), ("DB", 1, "user")]


async def test_injection_blocks(mem: MemoryStore) -> None:
    pinned = await mem.append(T, A, "core fact", NewEntry(about=["core"]))
    assert (await mem.pin(T, A, pinned.id)).pinned
    recent = [await mem.append(T, A, f"recent {i}") for i in range(10)]
    inj = await mem.build_injection(T, A)
    assert [e.id for e in inj.pinned] == [pinned.id]
    assert [e.id for e in inj.recent] == [e.id for e in recent[-8:]]
    assert [t.name for t in inj.topics] == ["core"] and "core" in inj.topics_text


async def test_import_rerun_is_noop_and_minting_skips_imported(mem: MemoryStore, storage: Storage) -> None:
    batch = [Entry("mem-1", "one", 10, kind="semantic"), Entry("mem-3", "three", 30), Entry("ext", "x", 5)]
    first = await mem.import_entries(T, A, batch)
    assert first.imported == 3 and first.skipped == []
    size = await lane_len(storage)
    again = await mem.import_entries(T, A, batch)
    assert again.imported == 0 and again.skipped == ["mem-1", "mem-3", "ext"]
    assert await lane_len(storage) == size
    minted = await mem.append(T, A, "new")
    assert minted.id == "mem-4"
    # another replica with a cold cache agrees
    assert (await MemoryStore(storage).append(T, A, "newer")).id == "mem-5"
    # a refused import writes nothing
    with pytest.raises(InvalidArgument) as err:
        await mem.import_entries(T, A, [Entry("ok", "fine", 1), Entry("bad", "x" * 4097, 1)])
    assert err.value.reason == "CONTENT_TOO_LARGE" and err.value.field == "entries[1].content"
    assert "ok" not in await ids(mem)


async def test_import_over_a_chunk(mem: MemoryStore) -> None:
    batch = [Entry(f"i{n:04d}", f"fact {n}", 1000 + n) for n in range(250)]
    assert (await mem.import_entries(T, A, batch)).imported == 250
    page = await mem.list(T, A, size=100)
    seen = [v.entry.id for v in page.entries]
    while page.next_page_token:
        page = await mem.list(T, A, size=100, token=page.next_page_token)
        seen += [v.entry.id for v in page.entries]
    assert seen == [e.id for e in batch]


async def test_request_id_applies_once(mem: MemoryStore, storage: Storage) -> None:
    e1 = await mem.append(T, A, "hello", request_id="r1")
    other = MemoryStore(storage)  # a replica that never saw r1
    e2 = await other.append(T, A, "hello", request_id="r1")
    assert e1.id == e2.id and await ids(mem) == [e1.id]
    with pytest.raises(InvalidArgument) as err:
        await other.append(T, A, "different", request_id="r1")
    assert err.value.reason == "REQUEST_ID_REUSED"


async def test_concurrent_appends_on_two_replicas_never_share_ids(storage: Storage) -> None:
    r1, r2 = MemoryStore(storage), MemoryStore(storage)
    made = await asyncio.gather(*(r.append(T, A, f"f{i}") for i in range(10) for r in (r1, r2)))
    assert len({e.id for e in made}) == 20
    assert len(await ids(MemoryStore(storage))) == 20


async def test_concurrent_pins_near_cap_one_effective_set(storage: Storage) -> None:
    """Two replicas (separate caches, both warm at the same head) pin near the
    cap at once: the lane linearizes them, exactly one is accepted, and every
    reader agrees on the effective set."""
    setup = MemoryStore(storage)
    base = await setup.append(T, A, "b" * 1000)
    assert (await setup.pin(T, A, base.id)).pinned
    x = await setup.append(T, A, "x" * 900)
    y = await setup.append(T, A, "y" * 900)
    r1, r2 = MemoryStore(storage), MemoryStore(storage)
    await r1.fold(T, A), await r2.fold(T, A)
    out1, out2 = await asyncio.gather(r1.pin(T, A, x.id), r2.pin(T, A, y.id))
    assert [out1.pinned, out2.pinned].count(True) == 1
    loser = out2 if out1.pinned else out1
    assert "2048-byte cap" in loser.reason
    sets = []
    for reader in (r1, r2, setup, MemoryStore(storage)):
        views, allocated = await reader.pinned(T, A)
        sets.append(([v.entry.id for v in views], allocated))
    winner = x.id if out1.pinned else y.id
    assert all(s == ([base.id, winner], 1900) for s in sets)


async def test_import_validates_validity_and_supersedes_as_append_does(mem: MemoryStore, storage: Storage) -> None:
    """An imported entry whose window is empty (valid_until not after
    valid_from) would never be current, and one that supersedes itself would
    retire itself for good (never listed, never forgettable): both are refused
    naming the entry, as Append refuses them, and nothing of the call lands."""
    before = await lane_len(storage)
    for bad, field in [
        (Entry("w", "window", 10, valid_from=200, valid_until=100), "entries[1].valid_until"),
        (Entry("w", "window", 10, valid_from=200, valid_until=200), "entries[1].valid_until"),
        (Entry("s", "self", 10, supersedes="s"), "entries[1].supersedes"),
    ]:
        with pytest.raises(InvalidArgument) as err:
            await mem.import_entries(T, A, [Entry("ok", "fine", 1), bad])
        assert (err.value.reason, err.value.field) == ("FIELD_INVALID", field)
    assert await lane_len(storage) == before
    # a window with one open bound, and a successor naming another entry, load
    done = await mem.import_entries(
        T, A, [Entry("old", "old", 1), Entry("new", "new", 2, valid_until=10**18, supersedes="old")]
    )
    assert done.imported == 2 and await ids(mem) == ["new"]


async def test_a_replica_folded_before_an_erasure_does_not_serve_erased_entries(storage: Storage) -> None:
    """The agent's lane is erased (every record deleted) and refilled through
    another replica past the old head: a replica whose fold predates the
    erasure starts over, never mixing erased entries into the new lane."""
    r1, r2 = MemoryStore(storage), MemoryStore(storage)
    for fact in ("erased one", "erased two", "erased three"):
        await r1.append(T, A, fact)
    assert len(await ids(r1)) == 3  # r1's fold is warm at head 3
    lane = MemoryStore._root(T, A)
    for key in await storage.list_keys(lane, None, 100):  # what an agent erasure sweeps
        await storage.delete(key)
    fresh = [await r2.append(T, A, f"new {i}") for i in range(4)]  # positions 1..4 again
    listed = (await r1.list(T, A)).entries
    assert [v.entry.content for v in listed] == [e.content for e in fresh]
    assert (await r1.search(T, A, "erased")).entries == []

async def test_a_replica_folded_before_an_erasure_starts_over_when_the_refill_ends_with_the_same_record(
    storage: Storage,
) -> None:
    """Erased, then refilled by an import whose record at the old head's
    position is byte for byte the one erased there (an import record holds
    the entry and nothing of when it was written): a replica whose fold
    predates the erasure still starts over, never serving an erased fact in
    place of the one imported after it."""
    r1, r2 = MemoryStore(storage), MemoryStore(storage)
    await r1.import_entries(T, A, [Entry("fact", "erased fact", 1), Entry("kept", "kept fact", 2)])
    assert await ids(r1) == ["fact", "kept"]  # r1's fold is warm at head 2
    for key in await storage.list_keys(MemoryStore._root(T, A), None, 100):  # what an agent erasure sweeps
        await storage.delete(key)
    done = await r2.import_entries(T, A, [Entry("fixed", "corrected fact", 1), Entry("kept", "kept fact", 2)])
    assert done.imported == 2
    assert [v.entry.content for v in (await r1.list(T, A)).entries] == ["corrected fact", "kept fact"]
    assert (await r1.search(T, A, "erased")).entries == []



async def test_content_is_required(mem: MemoryStore, storage: Storage) -> None:
    """content is one of the four required fields: an empty fact is refused
    (FIELD_INVALID), on Append and on Import, and nothing is written."""
    before = await lane_len(storage)
    with pytest.raises(InvalidArgument) as err:
        await mem.append(T, A, "")
    assert (err.value.reason, err.value.field) == ("FIELD_INVALID", "content")
    with pytest.raises(InvalidArgument) as err:
        await mem.import_entries(T, A, [Entry("ok", "fine", 1), Entry("empty", "", 2)])
    assert (err.value.reason, err.value.field) == ("FIELD_INVALID", "entries[1].content")
    assert await lane_len(storage) == before
    assert (await mem.append(T, A, " ")).content == " "  # verbatim: only absence is refused


async def test_a_pin_retried_with_its_request_id_reports_the_first_outcome(mem: MemoryStore, storage: Storage) -> None:
    """The first attempt pinned the entry: a retry with the same request id
    says so (pinned, no refusal) and records nothing, even after the pin was
    removed or the entry forgotten in between."""
    e = await mem.append(T, A, "fact")
    first = await mem.pin(T, A, e.id, request_id="pin-1")
    assert first.pinned and first.reason == ""
    assert await mem.unpin(T, A, e.id)
    size = await lane_len(storage)
    retry = await mem.pin(T, A, e.id, request_id="pin-1")
    assert (retry.pinned, retry.reason, retry.blocking_id) == (True, "", "")
    assert await lane_len(storage) == size
    assert await mem.forget(T, A, e.id)
    assert (await MemoryStore(storage).pin(T, A, e.id, request_id="pin-1")).pinned  # another replica agrees


async def test_minting_past_the_largest_18_digit_id_keeps_counting(mem: MemoryStore, storage: Storage) -> None:
    """An imported `mem-999999999999999999` puts the next minted id at 19
    digits; those count as minted too, so a cold fold starts after them
    instead of probing every id taken since."""
    await mem.import_entries(T, A, [Entry("mem-999999999999999999", "top", 10)])
    made = [(await mem.append(T, A, f"n{i}")).id for i in range(3)]
    assert made == [f"mem-{10**18 + i}" for i in range(3)]
    assert rules.minted_number(made[-1]) == 10**18 + 2
    cold = MemoryStore(storage)
    assert (await cold.append(T, A, "after")).id == f"mem-{10**18 + 3}"


async def test_a_minted_id_is_never_one_an_imported_successor_names(mem: MemoryStore, storage: Storage) -> None:
    """An imported entry may supersede an id the import did not carry (the
    source agent's mem-5). A fact appended later must not be minted as mem-5:
    the imported successor would retire it at birth (never listed, never
    forgettable, never pinnable)."""
    await mem.import_entries(T, A, [Entry("ext-1", "moved to Berlin", 10, supersedes="mem-5")])
    made = [await mem.append(T, A, f"fact {i}") for i in range(6)]
    assert "mem-5" not in [e.id for e in made]
    assert await ids(mem) == ["ext-1", *(e.id for e in made)]
    assert await ids(MemoryStore(storage)) == await ids(mem)  # a cold replica mints and folds alike


async def test_an_audit_import_round_trip_keeps_forgotten_entries_forgotten(mem: MemoryStore) -> None:
    """Audit returns forgotten entries marked so; Import ignored the mark and
    brought them back live in the target agent (a forgotten fact revived)."""
    kept = await mem.append(T, A, "keep this")
    gone = await mem.append(T, A, "forget this")
    assert await mem.forget(T, A, gone.id)
    audit = (await mem.audit(T, A)).entries
    # over a chunk: a forgotten entry takes two records of a transaction
    extra = [Entry(f"x{n:03d}", f"filler {n}", 10 + n) for n in range(120)]
    out = await mem.import_entries(T, B, [v.entry for v in audit] + extra,
                                   forgotten=[v.entry.id for v in audit if v.forgotten] + ["x050"])
    assert out.imported == 122 and out.skipped == []
    live = await ids(mem, B, size=1000)
    assert kept.id in live and gone.id not in live and "x050" not in live and "x051" in live
    marks = {v.entry.id: v.forgotten for v in (await mem.audit(T, B, size=1000)).entries}
    assert marks[gone.id] and marks["x050"] and not marks[kept.id]
    assert not await mem.forget(T, B, gone.id)  # nothing live to forget
    again = await mem.import_entries(T, B, [v.entry for v in audit], forgotten=[gone.id])
    assert again.imported == 0 and sorted(again.skipped) == sorted([kept.id, gone.id])


@pytest.mark.parametrize("agent", [pytest.param("a" * 65_537, id="over-64KiB")])
async def test_an_agent_that_erase_agent_refuses_holds_no_memory(mem: MemoryStore, storage: Storage, agent: str) -> None:
    """Memory took any non-empty agent_id, but AdminService.EraseAgent refuses
    a name over 64 KiB: such an agent's memory could be written and never
    erased agent-wide (spec/lifecycle.md). Refused alike, nothing written.
    (NUL is fine for both: tests/lifecycle/test_erasure_operations.py.)"""
    from fencepost_server.domain.erasure import Eraser

    before = await lane_len(storage)
    with pytest.raises(InvalidArgument) as err:
        await mem.append(T, agent, "a fact")
    assert err.value.reason == "FIELD_INVALID" and err.value.field == "agent_id"
    with pytest.raises(InvalidArgument):
        await mem.import_entries(T, agent, [Entry(id="x", content="c", created_at=5)])
    with pytest.raises(InvalidArgument):
        await Eraser(storage, None).start(T, agent)  # type: ignore[arg-type]
    assert await lane_len(storage) == before
