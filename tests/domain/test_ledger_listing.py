"""ListSessions from the activity index, on every backend: pages cost a
constant number of backend calls, a listing is a snapshot (sessions that
change between pages are listed once), the caps bind exactly across pages,
and stores written before the index still list."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.ledger import Ledger, LedgerConfig
from fencepost_server.domain.ledger.layout import agent_root, index_prefix, index_ready_key
from fencepost_server.domain.ledger.listing import _SCAN_CALLS
from fencepost_server.storage import Storage
from fencepost_server.storage.counting import CountingStorage
from fencepost_server.storage.memory import MemoryStorage

T = "tenant"
A = "agent"


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Lagging:
    """Another replica's clock: `lag` seconds behind."""

    def __init__(self, clock: FakeClock, lag: float) -> None:
        self.clock, self.lag = clock, lag

    def __call__(self) -> float:
        return self.clock.now - self.lag


async def _populate(ledger: Ledger, clock: FakeClock, n: int, record: bytes = b"x" * 100) -> list[str]:
    """n sessions one second apart, each with one commit (newest last)."""
    sids = []
    for i in range(n):
        view, _ = await ledger.open(T, A, f"s{i}")
        g = (await ledger.acquire(T, view.session_id, "h", ttl=3600)).generation
        await ledger.commit(T, view.session_id, g, 0, [record], commit_id=f"c{i}")
        sids.append(view.session_id)
        clock.now += 1
    return sids


async def _commit(ledger: Ledger, sid: str, data: bytes = b"y" * 10) -> int:
    view = await ledger.get(T, sid)
    g = view.lease.generation
    return (await ledger.commit(T, sid, g, view.seq, [data])).seq


async def _all(ledger: Ledger, size: int, **caps: int) -> list[list[str]]:
    pages, token = [], ""
    while True:
        page, token = await ledger.list_sessions(T, A, size=size, token=token, **caps)
        pages.append([s.session_id for s in page])
        if not token:
            return pages


async def test_each_page_costs_a_constant_number_of_backend_calls(
    storage: Storage, scaled: Callable[[int, int], int]
) -> None:
    clock = FakeClock()
    writer = Ledger(storage, clock=clock)
    n = scaled(600, 120)
    sids = []
    for i in range(n):  # opened only: one index entry each
        sids.append((await writer.open(T, A, f"s{i}"))[0].session_id)
        clock.now += 0.001
    for sid in sids[::3]:  # a third committed since: their opening entries are superseded
        await writer.acquire(T, sid, "h", ttl=3600)
        await _commit(writer, sid)
        clock.now += 0.001
    await writer.list_sessions(T, A, size=1)  # the agent's first listing ever: one scan of act/, once
    counting = CountingStorage(storage)
    reader = Ledger(counting, clock=clock)  # another replica: nothing cached
    listed, token, per_page = [], "", []
    while True:
        counting.reset()
        page, token = await reader.list_sessions(T, A, size=25, token=token)
        per_page.append(dict(counting.calls))
        listed += [s.session_id for s in page]
        if not token:
            break
    expected = sids[::3][::-1] + [s for s in sids[::-1] if s not in set(sids[::3])]
    assert listed == expected  # newest first, each once
    assert per_page[0].pop("get") == 1  # the agent's index-ready marker, once per process
    for calls in per_page:
        assert set(calls) <= {"list", "transact"}
        assert calls.get("list", 0) <= _SCAN_CALLS and calls.get("transact", 0) <= 1
    assert max(c.get("list", 0) for c in per_page) <= 2  # pages of 25 read in one or two lists


async def test_sessions_changing_between_pages_are_listed_once(storage: Storage) -> None:
    clock = FakeClock()
    a = Ledger(storage, clock=clock)
    b = Ledger(storage, clock=Lagging(clock, 5.0))  # a second replica whose clock is behind
    sids = await _populate(a, clock, 30)
    clock.now += 60
    newest_first = sids[::-1]
    seen: list[str] = []
    summaries = {}
    page, token = await a.list_sessions(T, A, size=7, max_sessions=25)
    seen += [s.session_id for s in page]
    summaries.update({s.session_id: s for s in page})
    step = 0
    while token:
        clock.now += 60  # more than the skew between the replicas
        step += 1
        listed = set(seen)
        later = [s for s in newest_first if s not in listed]
        # Between pages: sessions not listed yet move to the top (twice, through
        # both replicas), listed ones move too, and a new session appears.
        for sid in later[:2] + seen[:2]:
            await _commit(a, sid)
            await _commit(b, sid)
        await a.open(T, A, f"new-{step}")
        page, token = await a.list_sessions(T, A, size=7, max_sessions=25, token=token)
        seen += [s.session_id for s in page]
        summaries.update({s.session_id: s for s in page})
    assert seen == newest_first[:25]  # as of the first page: none skipped, none twice
    assert all(s.seq == 1 and s.total_bytes == 100 for s in summaries.values())
    # A new listing sees the moves: every session once, by its latest activity.
    clock.now += 1
    fresh = [sid for page in await _all(a, 7, max_sessions=1000) for sid in page]
    assert len(fresh) == len(set(fresh)) == 30 + step


async def test_caps_bind_exactly_across_pages_while_sessions_change(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sids = await _populate(ledger, clock, 20)
    order = sids[::-1]  # the model: newest first, and each session's bytes
    size = dict.fromkeys(sids, 100)

    def expected(max_sessions: int = 1000, max_total_bytes: int = 1 << 30) -> list[str]:
        out, used = [], 0
        for sid in order[:max_sessions]:
            if used + size[sid] > max_total_bytes:
                break
            out.append(sid)
            used += size[sid]
        return out

    for caps in ({"max_total_bytes": 2250}, {"max_sessions": 9}, {"max_total_bytes": 1500, "max_sessions": 12}):
        clock.now += 10
        want = expected(**caps)
        seen, token, first = [], "", True
        while first or token:
            page, token = await ledger.list_sessions(T, A, size=4, token=token, **caps)  # type: ignore[arg-type]
            seen += [s.session_id for s in page]
            for sid in (order[-1], order[len(order) // 2]):  # an old one and a middle one move to the top
                await _commit(ledger, sid, b"z" * 300)
                order.remove(sid)
                order.insert(0, sid)
                size[sid] += 300
                clock.now += 1
            first = False
        assert seen == want, caps
    # max_age counts from the first page: only sessions active in the 6.5 s before it.
    clock.now += 100
    recent = order[:3]
    for sid in recent[::-1]:
        await _commit(ledger, sid)
        clock.now += 2
    page, token = await ledger.list_sessions(T, A, size=1, max_age=6.5)
    seen = [s.session_id for s in page]
    while token:
        clock.now += 60
        page, token = await ledger.list_sessions(T, A, size=1, max_age=6.5, token=token)
        seen += [s.session_id for s in page]
    assert seen == recent


async def test_a_session_whose_commits_carry_earlier_clocks_is_listed_once(storage: Storage) -> None:
    clock = FakeClock()
    a = Ledger(storage, clock=clock)
    b = Ledger(storage, clock=Lagging(clock, 3600.0))  # an hour behind
    sids = await _populate(a, clock, 3)
    for _ in range(3):  # alternate replicas: b's timestamps are an hour earlier than a's
        await _commit(b, sids[0])
        await _commit(a, sids[0])
        await _commit(b, sids[0])
    clock.now += 1
    page, token = await a.list_sessions(T, A)
    assert token == "" and [s.session_id for s in page] == [sids[0], sids[2], sids[1]]
    assert page[0].seq == 10 and page[0].total_bytes == 100 + 9 * 10


async def test_superseded_entries_expire_and_are_derived_from_the_act_item(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock, config=LedgerConfig(listing_horizon=30.0))
    (sid,) = await _populate(ledger, clock, 1)
    for _ in range(5):
        await _commit(ledger, sid)
        clock.now += 1
    sk = ledger.keys(T, sid)
    prefix = index_prefix(agent_root(T, A))

    async def entries() -> set[str]:
        return {k for k in await storage.list_keys(prefix, None, 1000) if k.endswith(sid)}

    act = await storage.get(sk.act)
    assert act is not None and set(sk.listing_keys(act.value)) == await entries()
    assert len(await entries()) == 7  # opened, six commits: kept for listings in progress
    clock.now += 60
    await _commit(ledger, sid)
    act = await storage.get(sk.act)
    assert act is not None and set(sk.listing_keys(act.value)) == await entries()
    assert len(await entries()) == 2  # the current entry and the one it just superseded


async def test_a_store_written_before_the_index_still_lists(storage: Storage) -> None:
    clock = FakeClock()
    old = Ledger(storage, clock=clock)
    sids = await _populate(old, clock, 8)
    root = agent_root(T, A)
    # Rewrite what the earlier layout held: act/{sid} = {t, s}, no index, no marker.
    for key in await storage.list_keys(index_prefix(root), None, 1000):
        await storage.delete(key)
    await storage.delete(index_ready_key(root))
    for i, sid in enumerate(sids):
        sk = old.keys(T, sid)
        await storage.put(sk.act, json.dumps({"t": 1_700_000_000.0 + i, "s": 1}).encode())
    clock.now += 60
    new = Ledger(storage, clock=clock)
    pages = await _all(new, 3)
    assert [sid for page in pages for sid in page] == sids[::-1]
    page, _ = await new.list_sessions(T, A)
    assert [s.session_key for s in page] == [f"s{i}" for i in range(8)][::-1]
    assert all(s.total_bytes == 100 and s.seq == 1 for s in page)
    # A commit through a replica that never saw the session completes its act/ item.
    other = Ledger(storage, clock=clock)
    await _commit(other, sids[2], b"q" * 50)
    clock.now += 1
    page, _ = await Ledger(storage, clock=clock).list_sessions(T, A)
    assert [s.session_id for s in page] == [sids[2]] + [s for s in sids[::-1] if s != sids[2]]
    assert page[0].total_bytes == 150 and page[0].seq == 2 and page[0].session_key == "s2"


async def test_deleting_a_session_removes_every_listing_entry(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    doomed, kept = await _populate(ledger, clock, 2)
    for _ in range(4):  # superseded entries kept for listings in progress
        await _commit(ledger, doomed)
        clock.now += 1
    other = Ledger(storage, clock=clock)  # a replica whose memory of the act/ item goes stale
    await _commit(other, doomed)
    page, token = await ledger.list_sessions(T, A, size=1)  # a listing in progress
    await ledger.release(T, doomed, (await ledger.get(T, doomed)).lease.generation)
    await ledger.delete_session(T, doomed)
    prefix = index_prefix(agent_root(T, A))
    assert not [k for k in await storage.list_keys(prefix, None, 1000) if k.endswith(doomed)]
    assert await storage.get(ledger.keys(T, doomed).act) is None
    clock.now += 1
    rest = page + (await ledger.list_sessions(T, A, size=10, token=token))[0]
    assert [s.session_id for s in rest] == [doomed, kept]  # listed before the delete
    fresh, _ = await ledger.list_sessions(T, A)
    assert [s.session_id for s in fresh] == [kept]


async def test_a_token_older_than_the_listing_horizon_is_refused(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock, config=LedgerConfig(listing_horizon=30.0))
    sids = await _populate(ledger, clock, 6)
    clock.now += 1
    page, token = await ledger.list_sessions(T, A, size=2)
    assert [s.session_id for s in page] == sids[:-3:-1] and token
    # A session not listed yet commits twice, the second time past the horizon:
    # that commit deletes the entry the snapshot would have listed it at.
    clock.now += 1
    await _commit(ledger, sids[0])
    clock.now += 60
    await _commit(ledger, sids[0])
    # Resuming used to list the rest without sids[0], silently: now it says to restart.
    with pytest.raises(DomainError) as refused:
        await ledger.list_sessions(T, A, size=2, token=token)
    assert refused.value.reason == reasons.PAGE_TOKEN_INVALID and refused.value.field == "page_token"
    fresh = [sid for page in await _all(ledger, 2) for sid in page]
    assert sorted(fresh) == sorted(sids) and fresh[0] == sids[0]


class _HeldCommit(CountingStorage):
    """A transaction writing `act_key` (a commit of that session) waits for
    `go` once: the commit has dated its activity, its write is in flight."""

    def __init__(self, inner: Storage, act_key: str) -> None:
        super().__init__(inner)
        self.act_key = act_key
        self.reached, self.go = asyncio.Event(), asyncio.Event()

    async def transact(self, checks, writes, count=None):  # type: ignore[no-untyped-def]
        if not self.reached.is_set() and any(w.key == self.act_key for w in writes):
            self.reached.set()
            await self.go.wait()
        return await self.inner.transact(checks, writes, count)


async def test_a_commit_in_flight_across_the_first_page_is_listed_once() -> None:
    """One replica, one clock: a commit dated just before a listing's first
    page whose write lands just after it. Its new entry lies among the
    positions the first page read (it was not there yet) and its previous
    entry then says superseded before T0: with T0 the clock's reading, the
    session was on no page. T0 stays at or before the entries the process is
    still writing, so the session is listed at its previous entry."""
    clock = FakeClock()
    base = MemoryStorage()
    sids = await _populate(Ledger(base, clock=clock), clock, 3)
    held = _HeldCommit(base, Ledger(base).keys(T, sids[0]).act)
    ledger = Ledger(held, clock=clock)
    clock.now += 10
    commit = asyncio.ensure_future(_commit(ledger, sids[0]))  # dated now ...
    await held.reached.wait()
    clock.now += 0.001
    page, token = await ledger.list_sessions(T, A, size=1)  # ... the first page read before it lands
    held.go.set()
    await commit
    seen = [s.session_id for s in page]
    while token:
        page, token = await ledger.list_sessions(T, A, size=1, token=token)
        seen += [s.session_id for s in page]
    assert sorted(seen) == sorted(sids)
    assert not ledger._dating  # nothing left counted in flight: later listings start at now
