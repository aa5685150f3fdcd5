"""LedgerService through a real server on loopback, on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost_server.storage import Storage
from fencepost_server.storage.base import Check, CountKeys, TxnResult, Write
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import RunningServer, running
from tests.faults import FaultyStorage


async def test_two_holders_racing_never_commit_one_seq_twice(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "race")).session_id
    landed: dict[int, str] = {}
    losses = {"LEASE_HELD": 0, "LEASE_FENCED": 0, "SEQUENCE_MISMATCH": 0}

    async def holder(name: str, rounds: int) -> None:
        for i in range(rounds):
            try:
                lease = await client.acquire_lease(sid, name, ttl=0.05)
                head = (await client.get_session(sid)).seq
                out = await client.commit(sid, lease.generation, head, [f"{name}-{i}".encode()])
                assert out.seq not in landed, f"seq {out.seq} committed twice"
                landed[out.seq] = name
                await client.release_lease(sid, lease.generation)
            except (errors.LeaseHeld, errors.LeaseFenced, errors.SequenceMismatch) as exc:
                losses[exc.reason] += 1

    rounds = 200  # on every backend, the emulator included
    await asyncio.gather(holder("A", rounds), holder("B", rounds))
    records = [r async for r in client.read_log(sid)]
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    assert {r.seq: r.data.decode().split("-")[0] for r in records} == landed
    assert losses["LEASE_HELD"] + losses["LEASE_FENCED"] > 0 and len(landed) > 0


async def test_short_ttl_holder_replaced_is_fenced(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "pause")).session_id
    a = await client.acquire_lease(sid, "A", ttl=0.2)
    d = await client.deliver(b"e", session_id=sid)
    await asyncio.sleep(0.3)  # A is paused past its TTL (no timing assertion: only ordering)
    b = await client.acquire_lease(sid, "B", ttl=30)
    for attempt in (
        client.commit(sid, a.generation, 0, [b"late"]),
        client.commit(sid, a.generation, 0, [], consume=[d.inbox_id]),
        client.renew_lease(sid, a.generation, ttl=30),
    ):
        with pytest.raises(errors.LeaseFenced):
            await attempt
    with pytest.raises(errors.LeaseFenced):
        async for _ in client.watch_inbox(sid, a.generation):
            pass
    assert (await client.commit(sid, b.generation, 0, [b"b"], consume=[d.inbox_id])).seq == 1


async def test_commit_and_renew_retries(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "retry")).session_id
    lease = await client.acquire_lease(sid, "A", ttl=30)
    first = await client.commit(sid, lease.generation, 0, [b"one"], commit_id="c-1")
    again = await client.commit(sid, lease.generation, 0, [b"one"], commit_id="c-1")
    assert (first.seq, again.seq, first.replayed, again.replayed) == (1, 1, False, True)
    assert [r.data async for r in client.read_log(sid)] == [b"one"]
    r1 = await client.renew_lease(sid, lease.generation, ttl=30, holder_id="A")
    r2 = await client.renew_lease(sid, lease.generation, ttl=30, holder_id="A")
    assert r1.generation == r2.generation == lease.generation


async def test_a_commit_at_every_bound_over_the_wire(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "full")).session_id
    lease = await client.acquire_lease(sid, "A", ttl=30)
    ids = [(await client.deliver(b"e%d" % i, session_id=sid)).inbox_id for i in range(32)]
    records = [b"r%d" % i for i in range(64)]
    first = await client.commit(sid, lease.generation, 0, records, consume=ids, commit_id="full")
    again = await client.commit(sid, lease.generation, 0, records, consume=ids, commit_id="full")
    assert (first.seq, first.pending, again.seq, again.replayed) == (64, 0, 64, True)
    [listed] = [s async for s in client.list_sessions("agent")]
    assert (listed.session_id, listed.seq) == (sid, 64)
    with pytest.raises(errors.CommitTooLarge):
        await client.commit(sid, lease.generation, 64, [b"r"] * 65, commit_id="over")



async def test_a_commit_at_the_byte_limit_is_commit_too_large_on_every_backend(client: fencepost.AsyncClient) -> None:
    """Sixteen records of (nearly) 256 KiB, the last one shrinking until the
    commit fits: every refusal on the way is COMMIT_TOO_LARGE with its limit
    and size, whichever count refuses it (the ledger's, or a backend's own,
    such as DynamoDB's, which counts attribute names too and refused such a
    commit as TXN_TOO_LARGE, a reason Commit does not declare), and the
    commit that fits lands whole."""
    sid = (await client.open_session("agent", "at-the-limit")).session_id
    lease = await client.acquire_lease(sid, "A", ttl=60)
    big = 256 * 1024
    refusals = 0
    for last in range(big, 0, -512):
        records = [bytes([i]) * big for i in range(15)] + [b"z" * last]
        try:
            out = await client.commit(sid, lease.generation, 0, records)
            break
        except errors.CommitTooLarge as refused:
            assert refused.metadata["limit"] == str(4 * 1024 * 1024)
            assert int(refused.metadata["size"]) > 4 * 1024 * 1024
            refusals += 1
    else:
        raise AssertionError("no commit of sixteen records fitted")
    assert refusals > 0 and out.seq == 16
    logged = [r.data async for r in client.read_log(sid)]
    assert logged == records

async def test_dedupe_through_the_server(client: fencepost.AsyncClient) -> None:
    a = await client.deliver(b"e", agent="agent", session_key="dd", dedupe_key="msg-1")
    b = await client.deliver(b"e", agent="agent", session_key="dd", dedupe_key="msg-1")
    assert b.duplicate and a.inbox_id == b.inbox_id
    lease = await client.acquire_lease(a.session_id, "A", ttl=30)
    await client.commit(a.session_id, lease.generation, 0, [b"r"], consume=[a.inbox_id])
    c = await client.deliver(b"e", agent="agent", session_key="dd", dedupe_key="msg-1")
    assert c.duplicate and c.inbox_id == a.inbox_id
    assert [e async for e in client.list_inbox(a.session_id)] == []


async def test_deliver_racing_release_never_orphans(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "release-race")).session_id
    outcomes = {"granted": 0, "refused": 0, "released_first": 0}
    seq = 0
    rounds = 200  # on every backend, the emulator included
    for i in range(rounds):
        lease = await client.acquire_lease(sid, "holder", ttl=30)

        async def release() -> str:
            try:
                await client.release_lease(sid, lease.generation)
                return "released"
            except errors.InboxNotEmpty:
                return "refused"

        async def deliver() -> fencepost.Delivery:
            return await client.deliver(b"e%d" % i, session_id=sid, try_lease="courier", ttl=30)

        rel, d = await asyncio.gather(release(), deliver())
        if d.lease_granted:
            # the delivery serves the session: the holder must have released first
            assert rel == "released"
            outcomes["granted"] += 1
            owner_gen = d.lease.generation if d.lease else 0
        else:
            # the delivery walked away: the holder must have seen the event
            assert rel == "refused", "event orphaned: release succeeded and the delivery walked away"
            outcomes["refused"] += 1
            owner_gen = lease.generation
        out = await client.commit(sid, owner_gen, seq, [b"r"], consume=[d.inbox_id])
        seq = out.seq
        assert out.pending == 0
        await client.release_lease(sid, owner_gen)
    assert outcomes["granted"] + outcomes["refused"] == rounds


async def test_watch_inbox_pushes_backlog_then_new_events(client: fencepost.AsyncClient) -> None:
    sid = (await client.open_session("agent", "watch")).session_id
    lease = await client.acquire_lease(sid, "A", ttl=30)
    first = await client.deliver(b"backlog", session_id=sid)
    seen: list[bytes] = []

    async def watch() -> None:
        async for event in client.watch_inbox(sid, lease.generation):
            seen.append(event.payload)
            if len(seen) == 2:
                return

    task = asyncio.create_task(watch())
    while not seen:
        await asyncio.sleep(0.01)
    await client.deliver(b"live", session_id=sid)
    await asyncio.wait_for(task, 10)
    assert seen == [b"backlog", b"live"]
    assert first.inbox_id


async def test_session_helper_renews_and_stops_on_fence(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as client:
        sid = (await client.open_session("agent", "helper")).session_id
        # TTLs long enough for a loaded machine: a renewal that takes longer than
        # what is left of the TTL ends the session (its deadline), by design
        async with client.session(sid, "A", ttl=1.5) as s:
            await asyncio.sleep(2.0)  # past the TTL: renewed in the background (ttl/3) meanwhile
            with pytest.raises(errors.LeaseHeld):
                await client.acquire_lease(sid, "B", ttl=30)
            await s.commit([b"one"])
        lease = await client.acquire_lease(sid, "B", ttl=30)  # released on exit
        s2 = client.session(sid, "C", ttl=0.3)
        await client.release_lease(sid, lease.generation)
        await s2.acquire()
        # D takes over once C stops renewing; C's next renew/commit is fenced
        await s2._stop()
        await asyncio.sleep(0.5)
        await client.acquire_lease(sid, "D", ttl=30)
        with pytest.raises(errors.LeaseFenced):
            await s2.commit([b"late"])
        with pytest.raises(errors.LeaseFenced):
            await s2.run(lambda: asyncio.sleep(10))
        assert [r.data async for r in client.read_log(sid)] == [b"one"]


async def test_fork_and_list_sessions_over_the_wire(client: fencepost.AsyncClient) -> None:
    parent = (await client.open_session("agent", "p")).session_id
    lease = await client.acquire_lease(parent, "A", ttl=30)
    await client.commit(parent, lease.generation, 0, [b"1", b"2"])
    child = await client.fork(parent, 1, "c")
    assert [r.data async for r in client.read_log(child.session_id)] == [b"1"]
    await client.commit(parent, lease.generation, 2, [b"3"])
    assert [r.data async for r in client.read_log(child.session_id)] == [b"1"]
    listed = [s.session_id async for s in client.list_sessions("agent", max_sessions=1)]
    assert listed == [parent]
    with pytest.raises(errors.SessionNotFound):
        await client.resolve_session("agent", "missing")


async def test_fork_onto_a_key_of_another_session_is_already_exists(client: fencepost.AsyncClient) -> None:
    parent = (await client.open_session("agent", "p")).session_id
    taken = (await client.open_session("agent", "taken")).session_id
    assert (await client.fork(parent, 0, "c")).session_id == (await client.fork(parent, 0, "c")).session_id
    with pytest.raises(errors.AlreadyExists) as refused:
        await client.fork(parent, 0, "taken")
    # the reason's own class (FieldInvalid) is an InvalidArgument: it used to be
    # raised for this ALREADY_EXISTS status, and `except InvalidArgument` caught it
    assert not isinstance(refused.value, errors.InvalidArgument)
    assert (refused.value.code, refused.value.reason) == ("ALREADY_EXISTS", "FIELD_INVALID")
    assert refused.value.metadata["session_id"] == taken


async def test_orphan_recovered_by_claim(storage: Storage) -> None:
    async with running(
        storage, ledger_janitor_seconds=0.05, ledger_orphan_grace_seconds=0.1
    ) as srv, srv.client(timeout=10) as client:
        sid = (await client.open_session("agent", "orphan")).session_id
        dead = await client.acquire_lease(sid, "dies", ttl=0.2)
        d = await client.deliver(b"e", session_id=sid, try_lease="courier")
        assert not d.lease_granted  # walked away: the holder owns it... and dies
        # long-poll bound = ttl + grace + interval, with a margin for a loaded machine
        claimed = await client.claim_orphan("rescuer", ttl=30, wait=10)
        assert claimed is not None and claimed.session_id == sid
        assert claimed.lease.holder_id == "rescuer" and claimed.lease.generation == dead.generation + 1
        assert claimed.pending == 1
        out = await client.commit(sid, claimed.lease.generation, 0, [b"r"], consume=[d.inbox_id])
        assert out.pending == 0
        assert await client.claim_orphan("other", ttl=30, wait=0.3) is None


async def test_two_servers_sharing_sqlite_grant_each_orphan_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    settings = {"ledger_janitor_seconds": 0.05, "ledger_orphan_grace_seconds": 0.05}
    s1, s2 = SqliteStorage(path, synchronous="NORMAL"), SqliteStorage(path, synchronous="NORMAL")
    async with running(s1, **settings) as a, running(s2, **settings) as b:
        async with a.client(timeout=10) as ca, b.client(timeout=10) as cb:
            sids = []
            for i in range(5):
                sid = (await ca.open_session("agent", f"o{i}")).session_id
                await ca.acquire_lease(sid, "dies", ttl=0.05)
                await ca.deliver(b"e", session_id=sid)
                sids.append(sid)
            grants: list[tuple[str, str]] = []

            async def worker(name: str, c: fencepost.AsyncClient) -> None:
                while True:
                    got = await c.claim_orphan(name, ttl=60, wait=1.5)
                    if got is None:
                        return
                    grants.append((got.session_id, name))

            await asyncio.gather(*(worker(f"w{i}", ca if i % 2 else cb) for i in range(6)))
            assert sorted(s for s, _ in grants) == sorted(sids)  # each exactly once


async def test_acked_deliveries_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "restart.db"
    async with running(SqliteStorage(path, synchronous="FULL")) as srv, srv.client(timeout=10) as c:
        acked = [await c.deliver(b"e%d" % i, agent="agent", session_key="r", dedupe_key=f"k{i}") for i in range(10)]
        sid = acked[0].session_id
        lease = await c.acquire_lease(sid, "A", ttl=30)
        await c.commit(sid, lease.generation, 0, [b"took-0", b"took-1"], consume=[acked[0].inbox_id, acked[1].inbox_id])
    async with running(SqliteStorage(path, synchronous="FULL")) as srv, srv.client(timeout=10) as c:
        pending = [e.inbox_id async for e in c.list_inbox(sid)]
        assert pending == [d.inbox_id for d in acked[2:]]
        again = await c.deliver(b"e0", agent="agent", session_key="r", dedupe_key="k0")
        assert again.duplicate and again.inbox_id == acked[0].inbox_id
        with pytest.raises(errors.InboxNotEmpty):
            await c.release_lease(sid, lease.generation)
        assert [r.data async for r in c.read_log(sid)] == [b"took-0", b"took-1"]


async def test_read_log_streams_pages(
    client: fencepost.AsyncClient, server: RunningServer, scaled: Callable[[int, int], int]
) -> None:
    sid = (await client.open_session("agent", "big")).session_id
    lease = await client.acquire_lease(sid, "A", ttl=60)
    seq = 0
    for _ in range(scaled(20, 6)):
        seq = (await client.commit(sid, lease.generation, seq, [b"r%d" % (seq + i + 1) for i in range(64)])).seq
    pages = 0
    from fencepost.v1 import ledger_pb2

    stub = client._ledger
    limit = min(1000, seq - 99)
    async for page in stub.ReadLog(ledger_pb2.ReadLogRequest(session_id=sid, from_seq=100, limit=limit)):
        pages += 1
        assert len(page.records) <= 256
    assert pages == -(-limit // 256)  # `limit` records in pages of at most 256
    assert len([r async for r in client.read_log(sid, from_seq=seq - 80)]) == 81


class _RacedCreate(FaultyStorage):
    """Runs `before` / `after` around the next transaction (a replica's create)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, 0, fail=0.0, timeout=0.0, lose=0.0)
        self.before: Callable[[], Awaitable[None]] | None = None
        self.after: Callable[[], Awaitable[None]] | None = None

    async def transact(self, checks: Sequence[Check] = (), writes: Sequence[Write] = (),
                       count: CountKeys | None = None) -> TxnResult:
        before, after, self.before, self.after = self.before, self.after, None, None
        if before is not None:
            await before()
        result = await self.inner.transact(checks, writes, count)
        if after is not None:
            await after()
        return result

    async def close(self) -> None:
        pass  # the test closes the shared backend


async def test_open_session_is_session_not_found_when_a_racing_replica_deletes_it(storage: Storage) -> None:
    """OpenSession's one miss: another replica creates the key's session
    between this one's lookup and its create, and deletes it before this one
    reads the winner back. The key names no session then; opening again
    creates one."""
    raced = _RacedCreate(storage)
    async with running(raced) as one, running(storage) as two, \
            one.client(timeout=10) as c1, two.client(timeout=10) as c2:
        created: list[str] = []

        async def create_elsewhere() -> None:
            created.append((await c2.open_session("agent", "raced")).session_id)

        async def delete_elsewhere() -> None:
            await c2.delete_session(created[0])

        raced.before, raced.after = create_elsewhere, delete_elsewhere
        with pytest.raises(errors.SessionNotFound) as missed:
            await c1.open_session("agent", "raced")
        assert missed.value.code == "NOT_FOUND" and created
        again = await c1.open_session("agent", "raced")
        assert again.session_id != created[0]
