"""Ledger rules on every backend, without a server (fake clock, counted calls, faults)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import DomainError
from fencepost_server.domain.ledger import Ledger, LedgerConfig
from fencepost_server.storage import BackendUnavailable, Storage
from fencepost_server.storage.counting import CountingStorage, ObservedStorage
from fencepost_server.storage.dynamodb import DynamoStorage
from fencepost_server.storage.dynamodb.table import VALUE, VERSION
from tests.faults import FaultyStorage

T = "tenant"


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reason(exc: pytest.ExceptionInfo[DomainError]) -> str:
    return exc.value.reason


async def _session(ledger: Ledger, key: str = "k") -> str:
    view, _ = await ledger.open(T, "agent", key)
    return view.session_id


async def test_paused_holder_is_fenced_everywhere(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sid = await _session(ledger)
    a = await ledger.acquire(T, sid, "A", ttl=10)
    d = await ledger.deliver(T, session_id=sid, payload=b"e1")
    clock.now += 11  # A is paused past its TTL
    b = await ledger.acquire(T, sid, "B", ttl=10)
    assert b.generation == a.generation + 1
    with pytest.raises(DomainError) as commit:
        await ledger.commit(T, sid, a.generation, 0, [b"late"], commit_id="a1")
    assert reason(commit) == reasons.LEASE_FENCED
    with pytest.raises(DomainError) as drain:
        await ledger.commit(T, sid, a.generation, 0, [], [d.inbox_id], commit_id="a2")
    assert reason(drain) == reasons.LEASE_FENCED
    with pytest.raises(DomainError) as renew:
        await ledger.renew(T, sid, a.generation, 10, "A")
    assert reason(renew) == reasons.LEASE_FENCED
    with pytest.raises(DomainError) as watch:
        async for _ in ledger.watch_inbox(T, sid, a.generation):
            pass
    assert reason(watch) == reasons.LEASE_FENCED
    # nothing of A's landed; B drains the event
    out = await ledger.commit(T, sid, b.generation, 0, [b"b"], [d.inbox_id], commit_id="b1")
    assert (out.seq, out.pending) == (1, 0)
    assert [p async for p in ledger.read_log(T, sid)] == [[(1, b"b")]]


async def test_expired_but_untaken_lease_still_renews(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sid = await _session(ledger)
    a = await ledger.acquire(T, sid, "A", ttl=10)
    clock.now += 30
    renewed = await ledger.renew(T, sid, a.generation, 10, "A")
    assert renewed.generation == a.generation and renewed.expires == clock.now + 10
    with pytest.raises(DomainError) as held:
        await ledger.acquire(T, sid, "B", ttl=10)
    assert reason(held) == reasons.LEASE_HELD


async def test_commit_retry_applies_once_and_renew_retry_succeeds(storage: Storage) -> None:
    ledger = Ledger(storage)
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=10)).generation
    d = await ledger.deliver(T, session_id=sid, payload=b"e")
    first = await ledger.commit(T, sid, g, 0, [b"r1", b"r2"], [d.inbox_id], commit_id="c1")
    again = await ledger.commit(T, sid, g, 0, [b"r1", b"r2"], [d.inbox_id], commit_id="c1")
    assert (first.seq, again.seq, again.replayed) == (2, 2, True)
    assert [r for p in [p async for p in ledger.read_log(T, sid)] for r in p] == [(1, b"r1"), (2, b"r2")]
    with pytest.raises(DomainError) as reused:
        await ledger.commit(T, sid, g, 0, [b"other"], commit_id="c1")
    assert reused.value.field == "commit_id"
    await ledger.renew(T, sid, g, 10, "A")
    await ledger.renew(T, sid, g, 10, "A")  # the retry after an ambiguous failure
    with pytest.raises(DomainError) as mismatch:
        await ledger.commit(T, sid, g, 1, [b"x"], commit_id="c2")
    assert reason(mismatch) == reasons.SEQUENCE_MISMATCH
    with pytest.raises(DomainError) as gone:
        await ledger.commit(T, sid, g, 2, [b"x"], [d.inbox_id], commit_id="c3")
    assert reason(gone) == reasons.INBOX_ENTRY_GONE
    assert (await ledger.get(T, sid)).seq == 2


async def test_release_refuses_while_pending_and_keeps_generation(storage: Storage) -> None:
    ledger = Ledger(storage)
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=10)).generation
    d = await ledger.deliver(T, session_id=sid, payload=b"e")
    with pytest.raises(DomainError) as refused:
        await ledger.release(T, sid, g)
    assert reason(refused) == reasons.INBOX_NOT_EMPTY and refused.value.metadata["pending"] == "1"
    await ledger.commit(T, sid, g, 0, [b"r"], [d.inbox_id], commit_id="c")
    await ledger.release(T, sid, g)
    await ledger.release(T, sid, g)  # idempotent
    with pytest.raises(DomainError) as after:
        await ledger.commit(T, sid, g, 1, [b"late"], commit_id="c2")
    assert reason(after) == reasons.LEASE_FENCED
    assert (await ledger.acquire(T, sid, "B", ttl=10)).generation == g + 1
    await ledger.deliver(T, session_id=sid, payload=b"e2")
    assert await ledger.release(T, sid, g + 1, force=True) == 1


async def test_dedupe_parks_once_also_after_consumed(storage: Storage) -> None:
    ledger = Ledger(storage)
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=10)).generation
    first = await ledger.deliver(T, session_id=sid, payload=b"e", dedupe_key="src-1")
    second = await ledger.deliver(T, session_id=sid, payload=b"e", dedupe_key="src-1")
    assert second.duplicate and second.inbox_id == first.inbox_id
    assert len((await ledger.list_inbox(T, sid))[0]) == 1
    await ledger.commit(T, sid, g, 0, [b"r"], [first.inbox_id], commit_id="c")
    third = await ledger.deliver(T, session_id=sid, payload=b"e", dedupe_key="src-1")
    assert third.duplicate and third.inbox_id == first.inbox_id
    assert (await ledger.list_inbox(T, sid))[0] == []


async def test_large_payloads_go_to_blobs_and_orphans_are_swept(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, config=LedgerConfig(inline_event_bytes=16, orphan_grace=5), clock=clock)
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=100)).generation
    d = await ledger.deliver(T, session_id=sid, payload=b"x" * 1000)
    events, _ = await ledger.list_inbox(T, sid)
    assert events[0].payload == b"x" * 1000
    await ledger.commit(T, sid, g, 0, [b"r"], [d.inbox_id], commit_id="c")
    sk = ledger.keys(T, sid)
    assert await storage.get(sk.blob_key(d.inbox_id)) is not None
    clock.now += 10
    await ledger.janitor.scan()
    assert await storage.get(sk.blob_key(d.inbox_id)) is None
    assert ledger.janitor.stats.blobs_swept == 1


async def test_blobs_of_a_tenant_with_a_hashed_key_segment_are_swept(storage: Storage) -> None:
    """A tenant name too long for its key segment is stored hashed; the
    janitor finds the inbox entry from the blob's key all the same."""
    clock = FakeClock()
    ledger = Ledger(storage, config=LedgerConfig(inline_event_bytes=16, orphan_grace=5), clock=clock)
    tenant = "t" * 300
    sid = (await ledger.open(tenant, "agent", "k"))[0].session_id
    g = (await ledger.acquire(tenant, sid, "A", ttl=100)).generation
    kept = await ledger.deliver(tenant, session_id=sid, payload=b"k" * 1000)
    done = await ledger.deliver(tenant, session_id=sid, payload=b"x" * 1000)
    await ledger.commit(tenant, sid, g, 0, [b"r"], [done.inbox_id], commit_id="c")
    sk = ledger.keys(tenant, sid)
    assert sk.blobs.split("/")[4].startswith("sha256:")
    clock.now += 10
    await ledger.janitor.scan()
    assert await storage.get(sk.blob_key(done.inbox_id)) is None
    assert await storage.get(sk.blob_key(kept.inbox_id)) is not None  # still pending: kept
    assert ledger.janitor.stats.blobs_swept == 1


async def test_duplicate_large_delivery_leaves_no_blob(storage: Storage) -> None:
    ledger = Ledger(storage, config=LedgerConfig(inline_event_bytes=16), clock=FakeClock())
    sid = await _session(ledger)
    first = await ledger.deliver(T, session_id=sid, payload=b"x" * 1000, dedupe_key="src-1")
    again = await ledger.deliver(T, session_id=sid, payload=b"x" * 1000, dedupe_key="src-1")
    assert again.duplicate and again.inbox_id == first.inbox_id
    # the duplicate's own blob is removed at once, not left for the janitor
    blobs = await storage.list(ledger.keys(T, sid).blobs, None, 10)
    assert [b.key for b in blobs] == [ledger.keys(T, sid).blob_key(first.inbox_id)]


async def test_janitor_finds_orphans_and_sweeps_stale_pending(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, config=LedgerConfig(orphan_grace=5), clock=clock)
    busy, idle = await _session(ledger, "busy"), await _session(ledger, "idle")
    gb = (await ledger.acquire(T, busy, "dead", ttl=10)).generation
    gi = (await ledger.acquire(T, idle, "A", ttl=10)).generation
    await ledger.deliver(T, session_id=busy, payload=b"e")
    d = await ledger.deliver(T, session_id=idle, payload=b"e")
    await ledger.commit(T, idle, gi, 0, [], [d.inbox_id], commit_id="c")
    clock.now += 12  # expired, but within the grace
    await ledger.janitor.scan()
    assert await ledger.janitor.claim(T, "W", 10, 0) is None
    assert await storage.get(ledger.keys(T, idle).pending) is None  # stale entry swept
    clock.now += 5
    await ledger.janitor.scan()
    claimed = await ledger.janitor.claim(T, "W", 10, 0)
    assert claimed is not None and claimed.session_id == busy
    assert claimed.lease.holder == "W" and claimed.lease.generation == gb + 1
    assert await ledger.janitor.claim(T, "W2", 10, 0) is None  # never granted twice
    assert ledger.janitor.stats.orphans_recovered == 1


async def test_fork_shares_the_prefix(storage: Storage) -> None:
    ledger = Ledger(storage)
    parent = await _session(ledger, "parent")
    g = (await ledger.acquire(T, parent, "A", ttl=10)).generation
    await ledger.commit(T, parent, g, 0, [b"p1", b"p2", b"p3"], commit_id="c1")
    child = await ledger.fork(T, parent, 2, "child")
    assert (child.seq, child.seed_length, child.parent) == (2, 2, parent)
    gc = (await ledger.acquire(T, child.session_id, "B", ttl=10)).generation
    await ledger.commit(T, child.session_id, gc, 2, [b"c3"], commit_id="c2")
    await ledger.commit(T, parent, g, 3, [b"p4"], commit_id="c3")
    grandchild = await ledger.fork(T, child.session_id, 3, "grandchild")

    async def log(sid: str, start: int = 1) -> list[tuple[int, bytes]]:
        return [r for page in [p async for p in ledger.read_log(T, sid, start)] for r in page]

    assert await log(child.session_id) == [(1, b"p1"), (2, b"p2"), (3, b"c3")]
    assert await log(parent) == [(1, b"p1"), (2, b"p2"), (3, b"p3"), (4, b"p4")]
    assert await log(grandchild.session_id) == [(1, b"p1"), (2, b"p2"), (3, b"c3")]
    assert await log(child.session_id, 2) == [(2, b"p2"), (3, b"c3")]
    # a child has none of the parent's records stored under its own keys
    own = await storage.list_keys(ledger.keys(T, child.session_id).log)
    assert len(own) == 1


async def test_list_sessions_honours_every_cap(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sids = []
    for i in range(6):
        sid = await _session(ledger, f"s{i}")
        g = (await ledger.acquire(T, sid, "A", ttl=10)).generation
        await ledger.commit(T, sid, g, 0, [b"x" * 100], commit_id="c")
        sids.append(sid)
        clock.now += 86400  # one day apart; s5 newest
    everything, _ = await ledger.list_sessions(T, "agent")
    assert [s.session_id for s in everything] == sids[::-1]
    assert all(s.total_bytes == 100 for s in everything)
    three, token = await ledger.list_sessions(T, "agent", max_sessions=3)
    assert [s.session_id for s in three] == sids[:2:-1] and token == ""
    recent, _ = await ledger.list_sessions(T, "agent", max_age=2.5 * 86400)
    assert [s.session_id for s in recent] == sids[:2:-1][:2]
    budget, _ = await ledger.list_sessions(T, "agent", max_total_bytes=250)
    assert len(budget) == 2
    page1, token = await ledger.list_sessions(T, "agent", max_sessions=5, size=2)
    page2, token = await ledger.list_sessions(T, "agent", max_sessions=5, size=2, token=token)
    page3, token = await ledger.list_sessions(T, "agent", max_sessions=5, size=2, token=token)
    assert [s.session_id for s in page1 + page2 + page3] == sids[:0:-1] and token == ""


async def _batch_put(storage: DynamoStorage, items: list[tuple[str, bytes]]) -> None:
    """Test set-up only: plain items written with BatchWriteItem."""
    client = await storage.client()
    for start in range(0, len(items), 25):
        requests = []
        for key, value in items[start:start + 25]:
            _, key_attrs = storage.codec.key_attributes(key)
            item = {**key_attrs, VALUE: {"B": value}, VERSION: {"S": f"seed-{start}"}}
            requests.append({"PutRequest": {"Item": item}})
        while requests:
            res = await client.batch_write_item(RequestItems={storage.table: requests})
            requests = res.get("UnprocessedItems", {}).get(storage.table, [])


async def test_read_log_of_100k_records_is_paged(storage: Storage, scaled: Callable[[int, int], int]) -> None:
    counting = CountingStorage(storage)
    ledger = Ledger(counting, config=LedgerConfig(read_page=1000))
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=600)).generation
    n, seq = scaled(100_000, 2_000), 0
    sk = ledger.keys(T, sid)
    if type(storage).__name__ == "MemoryStorage":
        while seq < n:  # through the domain, 64 records a commit
            await ledger.commit(T, sid, g, seq, [b"%d" % (seq + i + 1) for i in range(64)][: n - seq])
            seq = min(seq + 64, n)
    else:  # other backends: the records themselves, written directly, then the head
        from fencepost_server.storage import Put

        if isinstance(storage, DynamoStorage):  # 25-item batches: the emulator does ~150 requests/s
            await _batch_put(storage, [(sk.log_key(s), b"%d" % s) for s in range(1, n + 1)])
            seq = n
        while seq < n:
            batch = [Put(sk.log_key(seq + i + 1), b"%d" % (seq + i + 1)) for i in range(100)]
            await storage.transact((), batch)
            seq += 100
        await storage.put(sk.head, b"%020d" % n)
    counting.reset()
    expect, pages, biggest = 1, 0, 0
    async for page in ledger.read_log(T, sid):
        pages += 1
        biggest = max(biggest, len(page))
        for s, data in page:
            assert s == expect and data == b"%d" % s
            expect += 1
    assert expect == n + 1
    assert biggest == 1000 and pages == n // 1000
    assert counting.calls["list"] == n // 1000 + 1  # one page per call, never the whole log


async def test_every_acked_delivery_is_pending_or_consumed_once_under_faults(storage: Storage) -> None:
    faulty = FaultyStorage(storage, seed=4, fail=0.15, timeout=0.1, lose=0.1)
    ledger = Ledger(faulty)
    clean = Ledger(storage)
    sid = await _session(clean)
    gen = (await clean.acquire(T, sid, "A", ttl=600)).generation
    rng = random.Random(7)
    acked: dict[str, str] = {}  # dedupe key -> inbox id
    seq = 0

    async def retry(fn):  # type: ignore[no-untyped-def]
        for _ in range(50):
            try:
                return await fn()
            except BackendUnavailable:
                continue
            except DomainError as exc:
                if exc.code.value != "UNAVAILABLE":
                    raise
        raise AssertionError("no progress")

    for step in range(150):
        if rng.random() < 0.6 or not acked:
            key = f"ev-{step}"
            try:
                d = await ledger.deliver(T, session_id=sid, payload=key.encode(), dedupe_key=key)
            except BackendUnavailable:
                if rng.random() < 0.5:
                    continue  # the source gives up: not acked, may or may not be parked
                d = await retry(lambda: ledger.deliver(T, session_id=sid, payload=key.encode(), dedupe_key=key))
            acked[key] = d.inbox_id
        else:
            events, _ = await retry(lambda: ledger.list_inbox(T, sid))
            take = events[: rng.randint(1, 4)]
            rec = [e.payload for e in take]
            cid = f"c-{step}"
            out = await retry(lambda: ledger.commit(T, sid, gen, seq, rec, [e.inbox_id for e in take], cid))
            seq = out.seq
    faulty.armed = False
    assert sum(faulty.injected.values()) > 20
    consumed = [d for page in [p async for p in clean.read_log(T, sid)] for _, d in page]
    pending = {e.inbox_id: e.payload for e in (await clean.list_inbox(T, sid, 1000))[0]}
    assert len(consumed) == len(set(consumed))  # no event consumed twice
    for key, inbox_id in acked.items():
        in_log = consumed.count(key.encode())
        assert in_log + (inbox_id in pending) == 1, key


async def test_cost_targets(storage: Storage) -> None:
    counting = CountingStorage(storage)
    ledger = Ledger(counting)
    sid = await _session(ledger)
    counting.reset()
    g = (await ledger.acquire(T, sid, "A", ttl=30)).generation
    assert counting.total() == 1  # the open remembered the lease item
    counting.reset()
    await ledger.renew(T, sid, g, 30, "A")
    assert dict(counting.calls) == {"transact": 1}
    counting.reset()
    d = await ledger.deliver(T, session_id=sid, payload=b"e")
    assert dict(counting.calls) == {"transact": 1}
    counting.reset()
    extra = await ledger.deliver(T, session_id=sid, payload=b"later")
    counting.reset()
    done = await ledger.commit(T, sid, g, 0, [b"r"], [d.inbox_id], commit_id="c")
    assert dict(counting.calls) == {"transact": 1}  # the pending count rides on the write
    assert done.pending == 1
    counting.reset()
    done = await ledger.commit(T, sid, g, 1, [b"r2"], [extra.inbox_id])
    assert dict(counting.calls) == {"transact": 1} and done.pending == 0
    await ledger.release(T, sid, g)
    counting.reset()
    d2 = await ledger.deliver(T, session_id=sid, payload=b"e", try_lease="B")
    assert d2.lease_granted and dict(counting.calls) == {"transact": 2}


class _CountLost(ObservedStorage):
    """Applies transactions but loses their counts, and cannot list."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, lambda *_: None)
        self.broken = False

    async def transact(self, checks, writes, count=None):  # type: ignore[no-untyped-def]
        result = await self.inner.transact(checks, writes, count)
        return dataclasses.replace(result, count=None) if self.broken else result

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        if self.broken:
            raise BackendUnavailable("listing refused")
        return await self.inner.list_keys(prefix, start_after, limit)


async def test_an_applied_commit_is_never_reported_failed_over_its_count(storage: Storage) -> None:
    lossy = _CountLost(storage)
    ledger = Ledger(lossy)
    sid = await _session(ledger)
    g = (await ledger.acquire(T, sid, "A", ttl=30)).generation
    await ledger.deliver(T, session_id=sid, payload=b"e")
    lossy.broken = True
    done = await ledger.commit(T, sid, g, 0, [b"r"])
    assert (done.seq, done.pending) == (1, 1)  # applied; the count unknown, so "run a follow-up turn"
    lossy.broken = False
    assert [p async for p in ledger.read_log(T, sid)] == [[(1, b"r")]]
