"""No session is ever half erased: while an agent or tenant erasure runs, a
session of its scope cannot be created (OpenSession, Deliver by key, Fork);
one created before the operation began is fenced whole (docs/lifecycle.md)."""

from __future__ import annotations

import asyncio
import json

import pytest

from fencepost import reasons
from fencepost_server.domain.erasure import OPS_PREFIX, Eraser, OperationView
from fencepost_server.domain.errors import DomainError, FailedPrecondition, NotFound
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.ledger.erasing import SHARDS, creation_checks, marker_ops, marker_prefix
from fencepost_server.storage import Storage
from fencepost_server.storage.counting import CountingStorage
from tests.domain.test_ledger import FakeClock
from tests.raw_store import raw_keys_naming

T = "tenant"


class Pause(Exception):
    pass


async def run_steps(eraser: Eraser, n: int) -> None:
    """Run `n` steps of the pending operations, then stop as a replica would
    between two steps (the claim stays this replica's: the next call goes on)."""
    real, taken = Eraser._step, 0

    async def step(state, *held):  # type: ignore[no-untyped-def]
        nonlocal taken
        if taken == n:
            raise Pause
        taken += 1
        await real(eraser, state, *held)

    eraser._step = step  # type: ignore[method-assign]
    try:
        await eraser.run_pending()
    except Pause:
        pass
    finally:
        del eraser._step


async def refused(call: object, op: OperationView) -> None:
    with pytest.raises(FailedPrecondition) as info:
        await call  # type: ignore[misc]
    assert info.value.reason == reasons.ERASURE_IN_PROGRESS
    assert info.value.metadata["operation"] == op.name


async def whole_session(ledger: Ledger, agent: str, key: str) -> str:
    """Open a session, commit to it and read it all back."""
    view, created = await ledger.open(T, agent, key)
    assert created
    lease = await ledger.acquire(T, view.session_id, "h", ttl=30)
    await ledger.commit(T, view.session_id, lease.generation, 0, [b"a", b"b"])
    pages = [p async for p in ledger.read_log(T, view.session_id)]
    assert [data for page in pages for _, data in page] == [b"a", b"b"]
    return view.session_id


async def test_agent_erasure_refuses_new_sessions_of_the_agent_until_done(storage: Storage) -> None:
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    old = [(await ledger.open(T, "doomed", f"k{i}"))[0].session_id for i in range(3)]
    other = (await ledger.open(T, "other", "k"))[0].session_id
    op = await eraser.start(T, "doomed", "rid")
    phases = []
    while not (await eraser.get(T, op.name)).done:
        phases.append((await eraser.get(T, op.name)).phase)
        await refused(ledger.open(T, "doomed", "new"), op)
        await refused(ledger.deliver(T, agent="doomed", session_key="by-deliver", payload=b"e"), op)
        try:
            await refused(ledger.fork(T, old[2], 0, "child"), op)
        except NotFound:
            pass  # the parent was fenced already
        await ledger.open(T, "other", f"during-{len(phases)}")  # another agent is not in scope
        await run_steps(eraser, 1)
    assert {"fence", "sweep", "directory"} <= set(phases)
    assert (await eraser.get(T, op.name)).sessions_fenced == 3
    assert raw_keys_naming(storage, "/agentkit/v1/doomed/", *old) == []
    assert (await ledger.get(T, other)).session_id == other

    sid = await whole_session(ledger, "doomed", "new")
    assert sid not in old
    assert await eraser.run_pending() == 0
    assert (await ledger.get(T, sid)).seq == 2
    await ledger.deliver(T, agent="doomed", session_key="by-deliver", payload=b"e")
    assert (await ledger.fork(T, sid, 1, "child")).seed_length == 1


async def test_tenant_erasure_refuses_new_sessions_of_every_agent_until_done(storage: Storage) -> None:
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    old = (await ledger.open(T, "a1", "k"))[0].session_id
    elsewhere = (await ledger.open("other-tenant", "a1", "k"))[0].session_id
    op = await eraser.start(T, None, "")
    steps = 0
    while not (await eraser.get(T, op.name)).done:
        for agent in ("a1", "a2"):
            await refused(ledger.open(T, agent, "new"), op)
        await ledger.open("other-tenant", "a1", f"during-{steps}")
        await run_steps(eraser, 1)
        steps += 1
    assert steps > 3
    assert raw_keys_naming(storage, old) == []
    assert [k for k in raw_keys_naming(storage, T + "/") if k.startswith(T + "/")] == []
    assert (await ledger.get("other-tenant", elsewhere)).session_id == elsewhere
    await whole_session(ledger, "a1", "new")
    await whole_session(ledger, "a2", "new")


async def test_an_agent_erasure_within_a_tenant_erasure_keeps_the_tenant_refused(storage: Storage) -> None:
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    tenant_op = await eraser.start(T, None, "t")
    agent_op = await eraser.start(T, "a1", "a")
    await eraser._run(await storage.get(OPS_PREFIX + agent_op.name.rsplit("-", 1)[1]))  # type: ignore[arg-type]
    assert (await eraser.get(T, agent_op.name)).done
    await refused(ledger.open(T, "a1", "new"), tenant_op)
    await eraser.run_pending()
    await whole_session(ledger, "a1", "new")


async def test_two_erasures_of_one_scope_refuse_until_both_are_done(storage: Storage) -> None:
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    first = await eraser.start(T, "doomed", "one")
    second = await eraser.start(T, "doomed", "two")
    assert first.name != second.name
    await eraser._run(await storage.get(OPS_PREFIX + first.name.rsplit("-", 1)[1]))  # type: ignore[arg-type]
    assert (await eraser.get(T, first.name)).done and not (await eraser.get(T, second.name)).done
    await refused(ledger.open(T, "doomed", "new"), second)
    # a retried start of the finished one returns it and blocks nothing more
    assert (await eraser.start(T, "doomed", "one")).done
    await eraser.run_pending()
    await whole_session(ledger, "doomed", "new")


async def test_a_session_created_before_the_operation_began_is_fenced_whole(storage: Storage) -> None:
    """The creation commits before the marker: every list the fence makes
    afterwards sees it, so it is tombstoned (SESSION_NOT_FOUND) and swept,
    never left with some of its keys."""
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    real_start = storage.transact
    sid = ""

    async def open_just_before(checks, writes, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal sid
        if not sid and any(w.key.startswith("#/ops/erase/") for w in writes):
            sid = await whole_session(ledger, "doomed", "racer")
        return await real_start(checks, writes, *args, **kwargs)

    storage.transact = open_just_before  # type: ignore[method-assign]
    try:
        op = await eraser.start(T, "doomed", "")
    finally:
        del storage.transact
    assert sid
    await eraser.run_pending()
    assert (await eraser.get(T, op.name)).sessions_fenced == 1
    with pytest.raises(NotFound):
        await ledger.get(T, sid)
    assert raw_keys_naming(storage, sid) == []


async def test_refusal_writes_nothing(storage: Storage) -> None:
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    op = await eraser.start(T, "doomed", "")
    await refused(ledger.open(T, "doomed", "new"), op)
    assert [k for k in raw_keys_naming(storage, "/agentkit/v1/doomed/") if k.startswith(T + "/")] == []
    with pytest.raises(DomainError):
        await ledger.resolve(T, "doomed", "new")


async def test_erasures_of_one_scope_started_at_once_are_all_in_its_marker(storage: Storage) -> None:
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    ops = await asyncio.gather(*(eraser.start(T, "doomed", f"r{i}") for i in range(3)))
    shards = await storage.list(marker_prefix(T, "doomed"), None, 100)
    assert len(shards) == SHARDS
    for shard in shards:
        assert sorted(marker_ops(shard)) == sorted(op.name.rsplit("-", 1)[1] for op in ops)
    await eraser.run_pending()
    assert await storage.list(marker_prefix(T, "doomed"), None, 100) == []
    await whole_session(ledger, "doomed", "new")


async def test_a_replica_taken_over_before_done_leaves_the_marker_to_the_new_claimer(storage: Storage) -> None:
    """A replica whose claim expired may finish its last step while the new
    claimer is still sweeping: taking the marker out then would let a session
    be created under that sweep. Only the replica whose saved version is
    still current takes it out."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    slow = Eraser(storage, ledger, clock=clock, claim_seconds=30)
    op = await slow.start(T, "doomed", "")
    await ledger.open(T, "kept", "k")
    real_step = Eraser._step
    taker = Eraser(storage, ledger, clock=clock, claim_seconds=30)

    async def taken_over_at_the_end(state, *held):  # type: ignore[no-untyped-def]
        await real_step(slow, state, *held)
        if state["phase"] == "done":  # the other replica claims meanwhile
            clock.now += 31
            item = await storage.get(OPS_PREFIX + op.name.rsplit("-", 1)[1])
            assert item is not None
            assert await taker._save(item.key, item.version, json.loads(item.value), claimed=True)

    slow._step = taken_over_at_the_end  # type: ignore[method-assign]
    assert await slow.run_pending() == 0
    assert not (await slow.get(T, op.name)).done
    await refused(ledger.open(T, "doomed", "new"), op)
    del slow._step
    assert await slow.run_pending() == 0  # the other replica's claim is live
    assert await taker.run_pending() == 1
    assert (await taker.get(T, op.name)).done
    await whole_session(ledger, "doomed", "new")


async def test_the_markers_cost_a_session_creation_no_backend_call(storage: Storage) -> None:
    """The checks ride in the creating transaction: OpenSession of a new key
    is one identity read and one transaction, Fork three reads (the parent),
    one identity read and one transaction, as without them."""
    counting = CountingStorage(storage)
    ledger = Ledger(counting)
    await ledger.open(T, "agent", "warm")  # not counted: first touches of the agent
    counting.reset()
    parent, created = await ledger.open(T, "agent", "k")
    assert created and dict(counting.calls) == {"get": 1, "transact": 1}
    counting.reset()
    await ledger.fork(T, parent.session_id, 0, "child")
    assert dict(counting.calls) == {"get": 4, "transact": 1}


def test_creations_of_one_agent_or_tenant_spread_over_the_shards() -> None:
    """Concurrent creations seldom name the same marker item (on DynamoDB a
    transaction naming an item another one names is cancelled)."""
    by_key = {creation_checks(T, "agent", f"k{i}")[0].key for i in range(2000)}
    by_agent = {creation_checks(T, f"a{i}", "k")[1].key for i in range(2000)}
    assert len(by_key) == len(by_agent) == SHARDS
    assert all(key.startswith(marker_prefix(T, "agent")) for key in by_key)
    assert all(key.startswith(marker_prefix(T, None)) for key in by_agent)


@pytest.mark.parametrize("phase", ["fence", "sweep"])
async def test_a_replica_stalled_past_its_claim_deletes_nothing_written_after_done(
    storage: Storage, phase: str,
) -> None:
    """A replica that stalls in the middle of a step (a long pause, a frozen
    VM) past its claim, while another replica finishes the operation, used to
    go on with its step when it woke: walk the scope (fence) or list it again
    (sweep) and erase what was written after `done` — here a session opened
    once the marker was gone. Both check the claim between listing and erasing."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    stalled_storage = _StallingStorage(storage)
    stalled = Eraser(stalled_storage, Ledger(stalled_storage, clock=clock), clock=clock, claim_seconds=0.3)
    for i in range(3):
        await ledger.open(T, "doomed", f"old{i}")
    op = await stalled.start(T, "doomed", "")
    real_step = Eraser._step

    async def stall_in_the_phase(state, *held):  # type: ignore[no-untyped-def]
        stalled_storage.armed = state["phase"] == phase
        await real_step(stalled, state, *held)

    stalled._step = stall_in_the_phase  # type: ignore[method-assign]
    run = asyncio.create_task(stalled.run_pending())
    await asyncio.wait_for(stalled_storage.stalled.wait(), 30)
    clock.now += 31  # its claim has expired for everyone else
    taker = Eraser(storage, ledger, clock=clock, claim_seconds=30)
    assert await taker.run_pending() == 1
    assert (await taker.get(T, op.name)).done
    sid = await whole_session(ledger, "doomed", "after-done")
    await asyncio.sleep(0.3)  # past the stalled replica's claim on its own clock too
    stalled_storage.release.set()
    assert await asyncio.wait_for(run, 30) == 0  # it noticed, recorded nothing
    pages = [p async for p in ledger.read_log(T, sid)]
    assert [data for page in pages for _, data in page] == [b"a", b"b"]


class _StallingStorage(CountingStorage):
    """Stalls the first list of keys (the fence's, or the sweep's with their
    versions) made while armed until released."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.armed = False
        self.stalled, self.release = asyncio.Event(), asyncio.Event()

    async def _stall(self) -> None:
        if self.armed and not self.stalled.is_set():
            self.stalled.set()
            await self.release.wait()

    async def list_keys(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        await self._stall()
        return await super().list_keys(*args, **kwargs)

    async def list_versions(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        await self._stall()
        return await super().list_versions(*args, **kwargs)

    async def put_if_version(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        if self.stalled.is_set():  # a frozen process renews no claim either
            await self.release.wait()
        return await super().put_if_version(*args, **kwargs)




async def test_a_sweep_round_sent_late_deletes_no_key_written_again_after_done(storage: Storage) -> None:
    """A round lists in time, then its deletes go out late (a pause right
    after the check, or a DynamoDB transaction resent after timeouts): a key
    the operation erased and a writer put again after `done` (a KV key, a
    journal item: their names are not random) must survive."""
    from fencepost_server.domain.keys import TenantKeys

    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    late = _LateDeleteStorage(storage)
    stalled = Eraser(late, Ledger(late, clock=clock), clock=clock, claim_seconds=0.3)
    key = TenantKeys(T).agent("doomed") + "notes/n1"
    await storage.put(key, b"old")
    await stalled.start(T, "doomed", "")
    real_step = Eraser._step

    async def late_in_the_sweep(state, *held):  # type: ignore[no-untyped-def]
        late.armed = state["phase"] == "sweep"
        await real_step(stalled, state, *held)

    stalled._step = late_in_the_sweep  # type: ignore[method-assign]
    run = asyncio.create_task(stalled.run_pending())
    await asyncio.wait_for(late.stalled.wait(), 30)
    clock.now += 31
    taker = Eraser(storage, ledger, clock=clock, claim_seconds=30)
    assert await taker.run_pending() == 1
    await storage.put(key, b"new")
    await asyncio.sleep(0.3)  # the resend comes after the claim ran out on the stalled replica's clock too
    late.release.set()
    await asyncio.wait_for(run, 30)
    item = await storage.get(key)
    assert item is not None and item.value == b"new"


class _LateDeleteStorage(CountingStorage):
    """Holds the first delete transaction made while armed until released."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.armed = False
        self.stalled, self.release = asyncio.Event(), asyncio.Event()

    async def transact(self, checks, writes, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        if self.armed and not self.stalled.is_set() and writes and all(type(w).__name__ == "Delete" for w in writes):
            self.stalled.set()
            await self.release.wait()
        return await super().transact(checks, writes, *args, **kwargs)

    async def put_if_version(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        if self.stalled.is_set():  # a frozen process renews no claim either
            await self.release.wait()
        return await super().put_if_version(*args, **kwargs)


async def test_a_step_longer_than_the_claim_keeps_it_and_counts_every_item(storage: Storage) -> None:
    """A fence step sweeping a large session can take longer than the claim
    (DynamoDB under load): the runner renews its claim while the step runs,
    so no other replica takes the operation over mid-step and the items that
    step deleted are counted."""
    ledger = Ledger(storage)
    for i in range(2):
        await whole_session(ledger, "doomed", f"k{i}")
    slow_storage = _SlowDeletes(storage)
    slow = Eraser(slow_storage, Ledger(slow_storage), claim_seconds=0.6)
    other = Eraser(storage, ledger, claim_seconds=0.6)
    op = await slow.start(T, "doomed", "")
    slow_storage.delay = 0.5  # each delete transaction: one step takes well over the claim
    run = asyncio.create_task(slow.run_pending())
    key = OPS_PREFIX + op.name.rsplit("-", 1)[1]
    while not json.loads((await storage.get(key)).value)["claim"]:  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
    while not run.done():
        assert await other.run_pending() == 0  # never taken over
        await asyncio.sleep(0.1)
    assert run.result() == 1
    view = await slow.get(T, op.name)
    assert view.done and view.sessions_fenced == 2
    assert view.items_erased >= 2 * 2  # both sessions' records at least, none lost to a takeover


class _SlowDeletes(CountingStorage):
    """Delete transactions take `delay` seconds."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.delay = 0.0

    async def transact(self, checks, writes, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        if self.delay and writes and all(type(w).__name__ == "Delete" for w in writes):
            await asyncio.sleep(self.delay)
        return await super().transact(checks, writes, *args, **kwargs)


async def test_a_marker_naming_a_finished_or_unrecorded_operation_is_taken_out(storage: Storage) -> None:
    """A store restored from a logical read of a live table can hold a marker
    read before its operation finished and the record read after (or no
    record): such a marker refused every session of its scope forever. A
    running operation's marker stays."""
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    finished = await eraser.start(T, "restored", "")
    await eraser.run_pending()
    stale = await storage.list(marker_prefix(T, "restored"), None, 100)
    assert stale == []
    done_id, missing_id = finished.name.rsplit("-", 1)[1], "0" * 32
    for key in [f"{marker_prefix(T, 'restored')}{n:02x}" for n in range(SHARDS)]:
        await storage.put(key, json.dumps({"ops": [done_id]}).encode())
    for key in [f"{marker_prefix(T, None)}{n:02x}" for n in range(SHARDS)]:
        await storage.put(key, json.dumps({"ops": [missing_id]}).encode())
    running = await eraser.start(T, "running", "")
    with pytest.raises(FailedPrecondition):
        await ledger.open(T, "restored", "k")
    assert await Eraser(storage, ledger).forget_stale_markers() == 2 * SHARDS
    await whole_session(ledger, "restored", "k")
    await refused(ledger.open(T, "running", "k"), running)
    assert await Eraser(storage, ledger).forget_stale_markers() == 0


async def test_a_stall_the_monotonic_clock_did_not_count_still_ends_the_claim(storage: Storage) -> None:
    """Linux's monotonic clock does not advance while the machine is
    suspended (and a paused VM's may not either), but the other replicas'
    clocks, by which the claim expires, do: the claim is held only while
    both the monotonic clock and the operation's own clock say so."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    stalled_storage = _StallingStorage(storage)
    stalled = Eraser(stalled_storage, Ledger(stalled_storage, clock=clock), clock=clock, claim_seconds=30)
    for i in range(3):
        await ledger.open(T, "doomed", f"old{i}")
    await stalled.start(T, "doomed", "")
    real_step = Eraser._step

    async def stall_in_the_fence(state, *held):  # type: ignore[no-untyped-def]
        stalled_storage.armed = state["phase"] == "fence"
        await real_step(stalled, state, *held)

    stalled._step = stall_in_the_fence  # type: ignore[method-assign]
    run = asyncio.create_task(stalled.run_pending())
    await asyncio.wait_for(stalled_storage.stalled.wait(), 30)
    clock.now += 31  # a suspended machine: no monotonic time passed
    taker = Eraser(storage, ledger, clock=clock, claim_seconds=30)
    assert await taker.run_pending() == 1
    sid = await whole_session(ledger, "doomed", "after-done")
    stalled_storage.release.set()
    assert await asyncio.wait_for(run, 30) == 0
    assert (await ledger.get(T, sid)).seq == 2


async def test_a_replica_stalled_past_its_claim_forgets_no_request_id_marker_after_done(storage: Storage) -> None:
    """A tenant erasure's first sweep step drops the request-id markers kept
    with the tenant's items (SQLite) before it deletes them; a replica that
    stalled just before, past its claim, would drop those of writes made
    after `done` (a retry of one would apply again)."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    stalled_storage = _ForgetSpy(storage)
    stalled = Eraser(stalled_storage, Ledger(stalled_storage, clock=clock), clock=clock, claim_seconds=0.3)
    await ledger.open(T, "a1", "old")
    op = await stalled.start(T, None, "")
    real_step = Eraser._step

    async def stall_in_the_sweep(state, *held):  # type: ignore[no-untyped-def]
        stalled_storage.armed = state["phase"] == "sweep"
        await real_step(stalled, state, *held)

    stalled._step = stall_in_the_sweep  # type: ignore[method-assign]
    run = asyncio.create_task(stalled.run_pending())
    await asyncio.wait_for(stalled_storage.stalled.wait(), 30)
    clock.now += 31
    taker = Eraser(storage, ledger, clock=clock, claim_seconds=30)
    assert await taker.run_pending() == 1
    assert (await taker.get(T, op.name)).done
    await asyncio.sleep(0.3)
    stalled_storage.release.set()
    assert await asyncio.wait_for(run, 30) == 0
    assert stalled_storage.forgotten_after_release == 0


class _ForgetSpy(_StallingStorage):
    """Counts the markers forgotten once released."""

    forgotten_after_release = 0

    async def forget_markers(self, prefix: str) -> None:
        if self.release.is_set():
            self.forgotten_after_release += 1
        await self.inner.forget_markers(prefix)


async def test_a_pass_moves_past_keys_rewritten_after_it_listed_them(storage: Storage) -> None:
    """Keys rewritten between the sweep's list and its conditional deletes
    hold data written after the erasure began (what they held then is gone):
    the pass moves on past them instead of listing them again and again (a
    busy loop, then an erasure held back for as long as a writer kept up).
    Keys at their listed version are deleted, the rewritten ones only."""
    from fencepost_server.domain.prefix import erase_prefix

    for i in range(5):
        await storage.put(f"{T}/hot/k{i}", b"v")
    rounds = 0

    async def rewritten(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal rounds
        rounds += 1
        listed = await real_list(*args, **kwargs)
        for key, _ in listed:
            if key.endswith(("k1", "k3")):
                await storage.put(key, b"again")  # a writer racing the sweep
        return listed

    real_list = storage.list_versions
    storage.list_versions = rewritten  # type: ignore[method-assign]
    try:
        removed, after, ended = await asyncio.wait_for(
            erase_prefix(storage, f"{T}/hot/", None, 10_000, lambda: True), 10)
    finally:
        del storage.list_versions
    assert (removed, after, ended, rounds) == (3, f"{T}/hot/k4", True, 2)
    assert [(i.key, i.value) for i in await storage.list(f"{T}/hot/")] == [
        (f"{T}/hot/k1", b"again"), (f"{T}/hot/k3", b"again")]
    # the next pass, from the start, finds them at the versions it lists
    assert await erase_prefix(storage, f"{T}/hot/", None, 10_000, lambda: True) == (2, f"{T}/hot/k3", True)
    assert await erase_prefix(storage, f"{T}/hot/", None, 10_000, lambda: True) == (0, None, True)
