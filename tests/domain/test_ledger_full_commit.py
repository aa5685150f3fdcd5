"""A commit at the spec's bounds (64 records, 32 consumed ids, a commit_id)
has no room for its activity-index entries in its one transaction: it is
accepted, the entries follow in a second write, and a crash between the two
leaves the session listed once (at its previous activity) until the next
reader of its act/ item settles it. On every backend."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.journal import Journal
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.ledger.activity import Activity
from fencepost_server.domain.ledger.layout import agent_root, index_prefix
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.retention import Retention, RetentionConfig
from fencepost_server.storage import BackendUnavailable, Storage
from fencepost_server.storage.base import Check, CountKeys, TxnResult, Write
from fencepost_server.storage.counting import CountingStorage, ObservedStorage

from .test_ledger_listing import FakeClock

T = "tenant"
A = "agent"


class IndexWritesFail(ObservedStorage):
    """Fails (before applying) every transaction that writes an activity-index
    entry while `broken`: the crash between a full commit and its second write."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, lambda *_: None)
        self.broken = False
        self.refused = 0

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        if self.broken and any("/durable-session/ix/" in w.key for w in writes):
            self.refused += 1
            raise BackendUnavailable("index write refused")
        return await self.inner.transact(checks, writes, count)


async def _held(ledger: Ledger, clock: FakeClock, key: str = "s") -> tuple[str, int]:
    """A session with one small commit (listed at that time), leased."""
    view, _ = await ledger.open(T, A, key)
    g = (await ledger.acquire(T, view.session_id, "h", ttl=3600)).generation
    await ledger.commit(T, view.session_id, g, 0, [b"x" * 100], commit_id="first")
    clock.now += 10
    return view.session_id, g


async def _inbox(ledger: Ledger, sid: str, n: int) -> list[str]:
    return [(await ledger.deliver(T, session_id=sid, payload=b"e%d" % i)).inbox_id for i in range(n)]


async def _listed(ledger: Ledger) -> list[tuple[str, int, float, int]]:
    out, token = [], ""
    while True:
        page, token = await ledger.list_sessions(T, A, size=2, token=token)
        out += [(s.session_id, s.seq, s.last_activity, s.total_bytes) for s in page]
        if not token:
            return out


async def _entries(storage: Storage, sid: str) -> list[str]:
    prefix = index_prefix(agent_root(T, A))
    return [k for k in await storage.list_keys(prefix, None, 1000) if k.endswith(sid)]


async def test_a_commit_at_every_bound_applies_and_lists_at_its_new_activity(storage: Storage) -> None:
    clock = FakeClock()
    counting = CountingStorage(storage)
    ledger = Ledger(counting, clock=clock)
    sid, g = await _held(ledger, clock)
    ids = await _inbox(ledger, sid, 33)
    committed_at = clock.now
    counting.reset()
    done = await ledger.commit(T, sid, g, 1, [b"r"] * 64, ids[:32], commit_id="full")
    assert (done.seq, done.pending, done.replayed) == (65, 1, False)
    # the commit is one transaction and nothing is read first; its index entries are a second one
    assert counting.calls["transact"] == 2 and counting.calls["get"] == 0
    clock.now += 1
    [(listed, seq, at, size)] = await _listed(ledger)
    assert (listed, seq, size) == (sid, 65, 164)
    assert committed_at <= at < clock.now
    act = await storage.get(ledger.keys(T, sid).act)
    assert act is not None and Activity.decode(act.value).owed is None
    assert len(await _entries(storage, sid)) == 3  # opened, first commit (superseded), the full one
    # a smaller commit stays one transaction with its index entries
    counting.reset()
    assert (await ledger.commit(T, sid, g, 65, [b"s"], [ids[32]])).seq == 66
    assert counting.calls["transact"] == 1


async def test_only_over_the_bounds_is_a_commit_too_large(storage: Storage) -> None:
    ledger = Ledger(storage, clock=FakeClock())
    sid, g = await _held(ledger, FakeClock())
    ids = await _inbox(ledger, sid, 33)
    for records, consume, limit in (([b"r"] * 65, ids[:1], 64), ([b"r"], ids, 32)):
        with pytest.raises(DomainError) as too_large:
            await ledger.commit(T, sid, g, 1, records, consume, commit_id="over")
        assert too_large.value.reason == reasons.COMMIT_TOO_LARGE
        assert (too_large.value.metadata["limit"], too_large.value.metadata["size"]) == (str(limit), str(limit + 1))
    with pytest.raises(DomainError) as too_big:  # 4 MiB: 17 records of 256 KiB
        await ledger.commit(T, sid, g, 1, [b"b" * 256 * 1024] * 17, commit_id="big")
    assert too_big.value.reason == reasons.COMMIT_TOO_LARGE
    assert set(too_big.value.metadata) >= {"limit", "size"}
    view = await ledger.get(T, sid)
    assert (view.seq, view.pending) == (1, 33)


async def test_a_crash_between_the_two_writes_is_listed_once_then_settled_by_the_next_commit(
    storage: Storage,
) -> None:
    clock = FakeClock()
    faulty = IndexWritesFail(storage)
    ledger = Ledger(faulty, clock=clock)
    sid, g = await _held(ledger, clock)
    other, _ = await _held(ledger, clock, "other")  # newer: listed first
    before = await _listed(ledger)
    assert [s[0] for s in before] == [other, sid]
    ids = await _inbox(ledger, sid, 32)
    faulty.broken = True
    done = await ledger.commit(T, sid, g, 1, [b"r"] * 64, ids, commit_id="full")
    assert done.seq == 65 and faulty.refused == 1  # applied; its index entries were not
    faulty.broken = False
    clock.now += 1
    # a fresh process: listed once, at its previous activity, seq and size
    fresh = Ledger(storage, clock=clock)
    assert await _listed(fresh) == before
    assert (await fresh.get(T, sid)).seq == 65  # GetSession tells the truth meanwhile
    # the retry of the commit replays (and settles the index)
    replay = await fresh.commit(T, sid, g, 1, [b"r"] * 64, ids, commit_id="full")
    assert (replay.seq, replay.replayed) == (65, True)
    clock.now += 1
    listed = await _listed(fresh)
    assert [(s[0], s[1], s[3]) for s in listed] == [(sid, 65, 164), (other, 1, 100)]
    assert len(await _entries(storage, sid)) == 3


async def test_the_next_commit_settles_what_a_crash_left_owed(storage: Storage) -> None:
    clock = FakeClock()
    faulty = IndexWritesFail(storage)
    ledger = Ledger(faulty, clock=clock)
    sid, g = await _held(ledger, clock)
    ids = await _inbox(ledger, sid, 64)
    faulty.broken = True
    await ledger.commit(T, sid, g, 1, [b"r"] * 64, ids[:32], commit_id="full-1")
    clock.now += 1
    # another full commit while the index is still owed: owed again, from the first one's seq
    await ledger.commit(T, sid, g, 65, [b"r"] * 64, ids[32:], commit_id="full-2")
    faulty.broken = False
    clock.now += 1
    assert [(s[1], s[3]) for s in await _listed(Ledger(storage, clock=clock))] == [(1, 100)]
    # a small commit through a replica that never saw the session settles everything
    other = Ledger(storage, clock=clock)
    assert (await other.commit(T, sid, g, 129, [b"z" * 10])).seq == 130
    clock.now += 1
    [(listed, seq, at, size)] = await _listed(other)
    assert (listed, seq, size) == (sid, 130, 100 + 128 + 10)
    assert at >= clock.now - 1
    act = await storage.get(ledger.keys(T, sid).act)
    assert act is not None
    keys = ledger.keys(T, sid).listing_keys(act.value)
    assert set(keys) == set(await _entries(storage, sid))  # every entry derived from act/


async def test_a_listing_in_progress_is_undisturbed_by_the_settling(storage: Storage) -> None:
    clock = FakeClock()
    faulty = IndexWritesFail(storage)
    ledger = Ledger(faulty, clock=clock)
    sids = [(await _held(ledger, clock, f"s{i}")) for i in range(4)]
    sid, g = sids[1]  # listed on the second page (newest first, two a page)
    ids = await _inbox(ledger, sid, 32)
    faulty.broken = True
    await ledger.commit(T, sid, g, 1, [b"r"] * 64, ids, commit_id="full")
    faulty.broken = False
    clock.now += 1
    first, token = await ledger.list_sessions(T, A, size=2)
    assert [s.session_id for s in first] == [sids[3][0], sids[2][0]]
    clock.now += 1
    await Ledger(storage, clock=clock).get(T, sid)  # settles the index now
    rest = []
    while token:
        page, token = await ledger.list_sessions(T, A, size=2, token=token)
        rest += [(s.session_id, s.seq) for s in page]
    assert rest == [(sid, 1), (sids[0][0], 1)]  # once, at the entry current at the listing's start
    clock.now += 1
    assert [s[0] for s in await _listed(ledger)] == [sid, sids[3][0], sids[2][0], sids[0][0]]


async def test_retention_does_not_take_a_lagging_index_for_idleness(storage: Storage) -> None:
    clock = FakeClock()
    faulty = IndexWritesFail(storage)
    ledger = Ledger(faulty, clock=clock)
    sid, g = await _held(ledger, clock)
    clock.now += 3 * 3600  # listed three hours ago; then a full commit whose index write is lost
    ids = await _inbox(ledger, sid, 32)
    faulty.broken = True
    await ledger.commit(T, sid, g, 1, [b"r"] * 64, ids, commit_id="full")
    faulty.broken = False
    await ledger.release(T, sid, g)
    fresh = Ledger(storage, clock=clock)
    retention = Retention(storage, fresh, Journal(storage, Limits()),
                          RetentionConfig(idle_session_seconds=2 * 3600), clock=clock)
    counts = await retention.sweep_pass()
    assert (counts.sessions_erased, counts.sessions_waiting) == (0, 1)
    clock.now += 1
    [(listed, seq, at, _)] = await _listed(fresh)  # settled by the pass
    assert (listed, seq) == (sid, 65) and at >= clock.now - 1
    assert (await retention.sweep_pass()).sessions_erased == 0
