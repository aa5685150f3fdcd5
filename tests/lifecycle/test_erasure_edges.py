"""Erasure at its edges, through a real server on every backend, proven on the
raw store: another tenant's caller, concurrent and repeated deletes, listings
continued with a page token taken before the delete, an orphan, hashed
(long) agent and tenant names."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost.keys import author_kv, encode_segment
from fencepost_server.app import App
from fencepost_server.domain.ledger import activity
from fencepost_server.domain.ledger import commits as ledger_commits
from fencepost_server.storage import Storage
from tests.conftest import Drained
from tests.lifecycle.test_erase_scopes import erasure_app
from tests.raw_store import data_only, raw_items, raw_keys_naming

LONG_TENANT = "tenant-" + "é" * 200  # encoded past 256 bytes: keys hold its sha256
TOKENS = {
    "op-a": ("tenant-a", "operator"),
    "svc-a": ("tenant-a", "service"),
    "op-b": ("tenant-b", "operator"),
    "svc-b": ("tenant-b", "service"),
    "op-long": (LONG_TENANT, "operator"),
}
TURN = {"at": "2026-11-29T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}


@pytest.fixture
async def app(tmp_path: Path, storage: Storage) -> AsyncIterator[App]:
    async with erasure_app(tmp_path, storage, TOKENS, ledger_janitor_seconds=0.1,
                           ledger_orphan_grace_seconds=0.1) as started:
        yield started


def connect(app: App, token: str) -> fencepost.AsyncClient:
    return fencepost.AsyncClient(f"127.0.0.1:{app.port}", token=token, timeout=30, retry=fencepost.NO_RETRY)


async def everything(c: fencepost.AsyncClient, agent: str) -> list[str]:
    """One agent's data in every service; its sessions (a parent and a fork)."""
    await c.put(author_kv(agent)("setting"), b"author-kv", request_id=f"kv-{hash(agent)}")
    sid = (await c.open_session(agent, "chan")).session_id
    lease = await c.acquire_lease(sid, "holder", ttl=600)
    d = await c.deliver(b"event", session_id=sid, dedupe_key="d1")
    await c.commit(sid, lease.generation, 0, [b"r1", b"r2"], consume=[d.inbox_id], commit_id="c1")
    await c.create_reminder(sid, lease.generation, "ping", after_seconds=3600)
    await c.deliver(b"B" * (70 * 1024), session_id=sid)
    child = (await c.fork(sid, 2, "child")).session_id
    for i in range(30):
        await c.append_turn(agent, {**TURN, "sessionId": f"t{i:02d}"})
    await c.read_journal(agent)
    entry = await c.memory_append(agent, "a fact to forget", about=["Core"], trust="operator")
    await c.memory_pin(agent, entry.id)
    await c.put_eval_run(agent, "run-1", {"score": 1}, request_id=f"ev-{hash(agent)}")
    await c.put_ab_sample(agent, "exp", sid, {"reward": 1.0})
    await c.put_ab_snapshot(agent, {"arms": 2})
    return [sid, child]


def under(items: dict[str, bytes], root: str) -> dict[str, bytes]:
    return {k: v for k, v in items.items() if root in k}


async def test_another_tenant_deletes_and_erases_nothing_of_ours(storage: Storage, app: App) -> None:
    """DeleteSession of A's session id by B (whatever flags), B's erasure of an
    agent of the same name and of its own tenant: A's items unchanged byte
    for byte, and B learns nothing (SESSION_NOT_FOUND, as for any unknown id)."""
    async with connect(app, "op-a") as a, connect(app, "svc-b") as b, connect(app, "op-b") as ob:
        sids = await everything(a, "agent")
        await everything(ob, "other")
        mine = {k: v for k, v in data_only(raw_items(storage)).items() if "tenant-a" in k}
        for force, descendants in ((False, False), (True, True)):
            for sid in sids:
                with pytest.raises(errors.SessionNotFound):
                    await b.delete_session(sid, force=force, delete_descendants=descendants)
        op = await ob.erase_agent("agent", request_id="same")
        assert (await ob.wait_operation(op.name)).done
        with pytest.raises(errors.OperationNotFound):
            await a.get_operation(op.name)
        op = await ob.erase_tenant(request_id="same")
        assert (await ob.wait_operation(op.name)).done
        after = {k: v for k, v in data_only(raw_items(storage)).items() if "tenant-a" in k}
        assert after == mine
        assert raw_keys_naming(storage, "tenant-b") == []
        assert (await a.get_session(sids[0])).seq == 3


async def test_concurrent_deletes_of_one_session(storage: Storage, app: App) -> None:
    """Five DeleteSession calls at once: each succeeds or says SESSION_NOT_FOUND
    (or TXN_CONTENDED, retryable), at least one succeeds, nothing is left, and
    the key opens a new session whose lease starts over."""
    async with connect(app, "svc-a") as c:
        sid = (await c.open_session("agent", "k")).session_id
        lease = await c.acquire_lease(sid, "h", ttl=600)
        await c.commit(sid, lease.generation, 0, [b"r%d" % i for i in range(50)], commit_id="c1")
        await c.deliver(b"B" * (70 * 1024), session_id=sid, dedupe_key="dd")

        async def delete() -> str:
            try:
                out = await c.delete_session(sid, force=True)
                assert out.session_ids == [sid]
                return "deleted"
            except errors.SessionNotFound:
                return "gone"
            except errors.TxnContended:
                return "contended"

        outcomes = await asyncio.gather(*(delete() for _ in range(5)))
        assert "deleted" in outcomes, outcomes
        assert raw_keys_naming(storage, sid) == []
        with pytest.raises(errors.SessionNotFound):
            await c.delete_session(sid, force=True)
        fresh = await c.open_session("agent", "k")
        assert fresh.session_id != sid and fresh.seq == 0
        with pytest.raises((errors.LeaseFenced, errors.SessionNotFound)):
            await c.commit(sid, lease.generation, 50, [b"late"])
        d = await c.deliver(b"again", session_id=fresh.session_id, dedupe_key="dd")
        assert [e.inbox_id async for e in c.list_inbox(fresh.session_id)] == [d.inbox_id]
        l2 = await c.acquire_lease(fresh.session_id, "h", ttl=600)
        out = await c.commit(fresh.session_id, l2.generation, 0, [b"new"], commit_id="c1")
        assert out.seq == 1  # the old commit id's marker is gone with the old session


async def test_listings_continued_after_a_delete_show_nothing_of_it(storage: Storage, app: App) -> None:
    async with connect(app, "svc-a") as c:
        sids = [(await c.open_session("agent", f"k{i}")).session_id for i in range(4)]
        page, token = await c.list_sessions_page("agent", page_size=1)
        assert len(page) == 1 and token
        rest = [s for s in sids if s != page[0].session_id]
        for sid in rest[:2]:
            await c.delete_session(sid)
        listed: list[str] = []
        while token:
            page, token = await c.list_sessions_page("agent", page_size=1, page_token=token)
            listed += [s.session_id for s in page]
        assert not set(listed) & set(rest[:2])
        assert rest[2] in listed

        # an inbox and a reminder listing continued with a token from before
        sid = sids[0] if sids[0] not in rest[:2] else rest[2]
        lease = await c.acquire_lease(sid, "h", ttl=600)
        for i in range(3):
            await c.deliver(b"e%d" % i, session_id=sid)
            await c.create_reminder(sid, lease.generation, f"r{i}", after_seconds=3600)
        _, inbox_token = await _inbox_page(c, sid)
        reminders_token = (await c.list_reminders_page(sid, page_size=1)).next_page_token
        assert inbox_token and reminders_token
        await c.delete_session(sid, force=True)
        with pytest.raises(errors.SessionNotFound):
            await _inbox_page(c, sid, inbox_token)
        with pytest.raises(errors.SessionNotFound):
            await c.list_reminders_page(sid, page_size=1, page_token=reminders_token)
        with pytest.raises(errors.SessionNotFound):
            [r async for r in c.due_reminders(sid)]


async def _inbox_page(c: fencepost.AsyncClient, sid: str, token: str = "") -> tuple[list[str], str]:
    from fencepost.v1 import ledger_pb2 as pb

    res = await c._caller.call(c._ledger.ListInbox, pb.ListInboxRequest(session_id=sid, page_size=1, page_token=token),
                               safe=True)
    return [e.inbox_id for e in res.events], res.next_page_token


async def test_an_erased_orphan_is_never_claimed(storage: Storage, app: App) -> None:
    """An orphan (lease released with an event pending) deleted with force:
    no ClaimOrphan hands it out afterwards."""
    async with connect(app, "svc-a") as c:
        sid = (await c.open_session("agent", "orphan")).session_id
        lease = await c.acquire_lease(sid, "h", ttl=600)
        await c.deliver(b"pending", session_id=sid)
        await c.release_lease(sid, lease.generation, force=True)
        await c.delete_session(sid, force=True)
        assert await c.claim_orphan("w", ttl=5, wait=1.0) is None
        assert raw_keys_naming(storage, sid) == []


async def test_a_watch_open_across_the_delete_ends(storage: Storage, app: App) -> None:
    """A holder watching its inbox when the session is deleted learns it (the
    stream ends with SESSION_NOT_FOUND or LEASE_FENCED), instead of waiting on
    a session that no longer exists."""
    async with connect(app, "svc-a") as c:
        sid = (await c.open_session("agent", "watched")).session_id
        lease = await c.acquire_lease(sid, "h", ttl=600)
        await _ends_when_deleted(c, sid, c.watch_inbox(sid, lease.generation, timeout=20))


async def _ends_when_deleted(c: fencepost.AsyncClient, sid: str, stream: AsyncIterator[object]) -> None:
    """`stream`, open on `sid`, ends with SESSION_NOT_FOUND or LEASE_FENCED once the session is deleted."""
    watch = Drained(stream)
    await asyncio.sleep(0.5)
    await c.delete_session(sid)
    await watch.end()
    assert len(watch.ended) == 1, "the stream ended without an error"
    assert isinstance(watch.ended[0], (errors.SessionNotFound, errors.LeaseFenced)), watch.ended


async def test_a_long_agent_name_is_erased_everywhere(storage: Storage, app: App) -> None:
    """An agent whose encoded name is hashed in keys (over 256 bytes)."""
    agent = "agent-" + "ü" * 100  # 206 UTF-8 bytes, 606 percent-encoded
    async with connect(app, "op-a") as a:
        sids = await everything(a, agent)
        await everything(a, "kept")
        hashed = encode_segment(agent)
        assert hashed.startswith("sha256:")
        before = data_only(raw_items(storage))
        assert raw_keys_naming(storage, hashed)
        op = await a.erase_agent(agent, request_id="r")
        done = await a.wait_operation(op.name)
        assert done.done and done.sessions_fenced == 2
        assert raw_keys_naming(storage, hashed, *sids) == []
        after = data_only(raw_items(storage))
        gone = {k for k in before if hashed in k or any(s in k or s.encode() in before[k] for s in sids)}
        kept = {k: v for k, v in before.items() if k not in gone and not k.startswith(("#/ops/", "#/erasing/"))}
        assert {k: after.get(k) for k in kept} == kept
        assert [e async for e in a.memory_list_all(agent)] == []
        assert await a.read_journal(agent) is None
        with pytest.raises(errors.EvalRunNotFound):
            await a.get_eval_run(agent, "run-1")


async def test_a_long_tenant_name_is_erased_everywhere(storage: Storage, app: App) -> None:
    async with connect(app, "op-long") as t, connect(app, "op-a") as a:
        sids = await everything(t, "agent")
        await everything(a, "agent")
        enc = encode_segment(LONG_TENANT)
        assert enc.startswith("sha256:") and raw_keys_naming(storage, enc)
        others = {k: v for k, v in data_only(raw_items(storage)).items() if "tenant-a" in k}
        op = await t.erase_tenant(request_id="r")
        assert (await t.wait_operation(op.name)).sessions_fenced == 2
        assert raw_keys_naming(storage, enc, *sids) == []
        assert {k: v for k, v in data_only(raw_items(storage)).items() if "tenant-a" in k} == others


async def test_same_request_id_at_once_is_one_operation(storage: Storage, app: App) -> None:
    async with connect(app, "op-a") as a:
        await everything(a, "agent")

        async def start() -> str | None:
            try:
                return (await a.erase_agent("agent", request_id="once")).name
            except errors.TxnContended:
                return None

        names = {n for n in await asyncio.gather(*(start() for _ in range(6))) if n}
        assert len(names) == 1
        name = names.pop()
        assert (await a.wait_operation(name)).done
        assert (await a.erase_agent("agent", request_id="once")).name == name
        assert raw_keys_naming(storage, "/agentkit/v1/agent/") == []


async def test_fork_racing_delete_with_descendants_leaves_no_live_orphan(
    storage: Storage, app: App, scaled: Callable[[int, int], int]
) -> None:
    """A Fork racing DeleteSession(delete_descendants): a fork that exists
    afterwards has a live parent, and a delete that succeeded left nothing
    of any session it names (nor of a fork it raced)."""
    async with connect(app, "svc-a") as c:
        doomed: list[str] = []
        for i in range(scaled(40, 12)):
            parent = (await c.open_session("agent", f"p{i}")).session_id
            lease = await c.acquire_lease(parent, "h", ttl=600)
            await c.commit(parent, lease.generation, 0, [b"a", b"b"])
            first = (await c.fork(parent, 1, f"f{i}")).session_id

            async def fork() -> str | None:
                try:
                    return (await c.fork(parent, 2, f"g{i}")).session_id
                except (errors.SessionNotFound, errors.TxnContended):
                    return None

            async def delete() -> list[str] | None:
                try:
                    return (await c.delete_session(parent, delete_descendants=True)).session_ids
                except errors.TxnContended:
                    return None

            child, deleted = await asyncio.gather(fork(), delete())
            if deleted is None:  # contended: the retry settles it
                deleted = (await c.delete_session(parent, delete_descendants=True)).session_ids
            assert parent in deleted and first in deleted
            if child is not None:
                if child not in deleted:
                    with pytest.raises(errors.SessionNotFound):
                        await c.get_session(child)  # else a live fork outlived its parent
                doomed.append(child)
            doomed += deleted
        assert raw_keys_naming(storage, *doomed) == []


async def test_deleting_a_fork_leaves_its_parent_whole(storage: Storage, app: App) -> None:
    async with connect(app, "svc-a") as c:
        parent = (await c.open_session("agent", "p")).session_id
        lease = await c.acquire_lease(parent, "h", ttl=600)
        await c.commit(parent, lease.generation, 0, [b"a", b"b", b"c"])
        child = (await c.fork(parent, 2, "c")).session_id
        cl = await c.acquire_lease(child, "h", ttl=600)
        await c.commit(child, cl.generation, 2, [b"own"])
        before = {k: v for k, v in data_only(raw_items(storage)).items() if child not in k and child.encode() not in v}
        await c.delete_session(child)
        after = {k: v for k, v in data_only(raw_items(storage)).items()}
        assert raw_keys_naming(storage, child) == []
        # only the parent's fork bookkeeping may change (its `forks` marker, no more fk/ entry)
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        assert all(k.endswith("/forks") for k in changed), changed
        assert [r.data async for r in c.read_log(parent)] == [b"a", b"b", b"c"]
        assert (await c.delete_session(parent)).session_ids == [parent]


async def test_a_descendant_with_pending_events_refuses_before_anything_is_erased(
    storage: Storage, app: App
) -> None:
    async with connect(app, "svc-a") as c:
        parent = (await c.open_session("agent", "p")).session_id
        child = (await c.fork(parent, 0, "c")).session_id
        grandchild = (await c.fork(child, 0, "g")).session_id
        await c.deliver(b"waiting", session_id=grandchild)
        before = data_only(raw_items(storage))
        with pytest.raises(errors.InboxNotEmpty) as refused:
            await c.delete_session(parent, delete_descendants=True)
        assert refused.value.metadata["session_id"] == grandchild
        assert data_only(raw_items(storage)) == before
        with pytest.raises(errors.SessionHasForks) as forks:
            await c.delete_session(parent)
        assert forks.value.metadata["fork_session_ids"] == child
        out = await c.delete_session(parent, delete_descendants=True, force=True)
        assert out.session_ids == [grandchild, child, parent]
        assert raw_keys_naming(storage, parent, child, grandchild) == []


async def test_a_long_session_key_is_erased_and_opens_anew(storage: Storage, app: App) -> None:
    key = "k" * 1000  # kept hashed in store keys
    async with connect(app, "svc-a") as c:
        sid = (await c.open_session("agent", key)).session_id
        await c.deliver(b"x", agent="agent", session_key=key, dedupe_key="d")
        await c.delete_session(sid, force=True)
        assert raw_keys_naming(storage, sid) == []
        assert not [k for k in raw_items(storage) if "/durable-session/id/" in k]
        with pytest.raises(errors.SessionNotFound):
            await c.resolve_session("agent", key)
        d = await c.deliver(b"x", agent="agent", session_key=key, dedupe_key="d")
        assert d.session_id != sid
        assert [e.payload async for e in c.list_inbox(d.session_id)] == [b"x"]


async def test_two_erasures_of_one_agent_at_once(storage: Storage, app: App) -> None:
    async with connect(app, "op-a") as a:
        sids = await everything(a, "agent")
        ops = await asyncio.gather(a.erase_agent("agent", request_id="one"), a.erase_agent("agent", request_id="two"))
        assert ops[0].name != ops[1].name
        # (that either one keeps the scope closed while it runs is test_erasure_fence's:
        # checked here it would race the other's end)
        first = await a.wait_operation(ops[0].name)
        second = await a.wait_operation(ops[1].name)
        assert first.done and second.done and first.sessions_fenced + second.sessions_fenced >= 2
        assert raw_keys_naming(storage, "/agentkit/v1/agent/", *sids) == []
        assert not [k for k in raw_items(storage) if k.startswith("#/erasing/") and not k.startswith("[")]
        assert (await a.open_session("agent", "new")).session_id


async def test_a_forks_marker_written_with_the_forks_id_stops_naming_it(storage: Storage, app: App) -> None:
    """A store whose parent's `forks` marker names its last fork (as written
    before the marker held no name): deleting that fork leaves nothing naming it."""
    async with connect(app, "svc-a") as c:
        parent = (await c.open_session("agent", "p")).session_id
        child = (await c.fork(parent, 0, "c")).session_id
        [marker] = [k for k in raw_items(storage) if k.endswith(f"/s/{parent}/forks")]
        await storage.put(marker, child.encode())
        await c.delete_session(child)
        assert raw_keys_naming(storage, child) == []
        assert (await c.delete_session(parent)).session_ids == [parent]


async def test_a_session_of_full_commits_can_still_be_deleted(
    storage: Storage, app: App, scaled: Callable[[int, int], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits that fill their transaction (64 records, 30 consumed events, a
    commit id) left no room to drop superseded listing entries, so they piled
    up past the bound the one tombstone transaction relies on, and the
    session could no longer be deleted (nor erased, nor retired). On the
    emulator (a few hundred requests a second) the bound is lowered instead,
    so a few full commits pass it."""
    commits = scaled(100, 5)
    if commits < 100:
        monkeypatch.setattr(activity, "MAX_KEPT", 2)
        monkeypatch.setattr(ledger_commits, "MAX_KEPT", 2)
    async with connect(app, "svc-a") as c:
        sid = (await c.open_session("agent", "busy")).session_id
        lease = await c.acquire_lease(sid, "h", ttl=600)
        seq = 0
        for i in range(commits):
            ids = [(await c.deliver(b"e", session_id=sid)).inbox_id for _ in range(30)]
            seq = (await c.commit(sid, lease.generation, seq, [b"r"] * 64, consume=ids, commit_id=f"c{i}")).seq
        act = await storage.get(next(k for k in raw_keys_naming(storage, sid) if "/act/" in k))
        assert act is not None and len(activity.Activity.decode(act.value).kept) <= activity.MAX_KEPT
        listed = [s.session_id async for s in c.list_sessions("agent")]
        assert listed == [sid]
        assert (await c.delete_session(sid)).session_ids == [sid]
        assert raw_keys_naming(storage, sid) == []


async def test_a_session_an_earlier_build_left_past_the_kept_bound_can_be_deleted(
    storage: Storage, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Earlier builds let full commits keep more than MAX_KEPT superseded
    listing entries; such a session's tombstone would not fit one transaction
    (TXN_TOO_LARGE, which DeleteSession does not declare). The delete trims
    the kept entries first, then erases everything."""
    async with connect(app, "svc-a") as c:
        sid = (await c.open_session("agent", "legacy")).session_id
        lease = await c.acquire_lease(sid, "h", ttl=600)
        monkeypatch.setattr(activity, "MAX_KEPT", 500)  # the earlier build's growth, quickly
        seq = 0
        for i in range(150):
            seq = (await c.commit(sid, lease.generation, seq, [b"r"], commit_id=f"c{i}")).seq
        monkeypatch.undo()
        act = await storage.get(next(k for k in raw_keys_naming(storage, sid) if "/act/" in k))
        assert act is not None and len(activity.Activity.decode(act.value).kept) > 100
        assert (await c.delete_session(sid)).session_ids == [sid]
        assert raw_keys_naming(storage, sid) == []


async def test_a_due_watch_open_across_the_delete_ends(storage: Storage, app: App) -> None:
    """WatchDue, like WatchInbox, ends once the session it watches is deleted."""
    async with connect(app, "svc-a") as c:
        sid = (await c.open_session("agent", "due-watched")).session_id
        lease = await c.acquire_lease(sid, "h", ttl=600)
        await c.create_reminder(sid, lease.generation, "later", after_seconds=3600)
        await _ends_when_deleted(c, sid, c.watch_due(sid, lease.generation, timeout=20))


async def test_deliver_by_key_racing_a_forced_delete(storage: Storage, app: App) -> None:
    """Deliver by (agent, key) racing DeleteSession(force): the event either
    went into the deleted session (erased with it: the delete was forced) or
    into a new session for the key, where it is pending; never lost otherwise."""
    async with connect(app, "svc-a") as c:
        outcomes: dict[str, int] = {"old": 0, "new": 0, "not_found": 0}
        doomed: list[str] = []
        for i in range(30):
            key = f"race-{i}"
            sid = (await c.open_session("agent", key)).session_id
            d, _ = await asyncio.gather(
                _deliver_or_none(c, key), c.delete_session(sid, force=True))
            doomed.append(sid)
            if d is None:
                outcomes["not_found"] += 1
            elif d.session_id == sid:
                outcomes["old"] += 1
            else:
                outcomes["new"] += 1
                assert [e.inbox_id async for e in c.list_inbox(d.session_id)] == [d.inbox_id]
        assert raw_keys_naming(storage, *doomed) == []
        assert outcomes["not_found"] == 0, outcomes


async def _deliver_or_none(c: fencepost.AsyncClient, key: str):  # type: ignore[no-untyped-def]
    try:
        return await c.deliver(b"event", agent="agent", session_key=key)
    except errors.SessionNotFound:
        return None


async def test_an_agent_erasure_finishes_while_a_writer_keeps_rewriting_a_key(storage: Storage, app: App) -> None:
    """A service keeps rewriting one of the agent's KV keys while the agent is
    erased: the writes are new data (kept), but the operation still finishes
    and everything that existed before it is gone."""
    kv = author_kv("agent")
    async with connect(app, "op-a") as a, connect(app, "svc-a") as w:
        old = [kv(f"old-{i:03d}") for i in range(150)]
        for key in old:
            await a.put(key, b"old")
        await a.put(kv("hot"), b"old")
        stop = asyncio.Event()

        async def writer() -> int:
            n = 0
            while not stop.is_set():
                await w.put(kv("hot"), b"new-%d" % n)
                n += 1
                await asyncio.sleep(0.01)  # a steady writer, not one that saturates the one-request emulator
            return n

        task = asyncio.create_task(writer())
        await asyncio.sleep(0.2)
        op = await a.erase_agent("agent")
        try:
            done = await asyncio.wait_for(a.wait_operation(op.name), 120)  # a loaded CI machine
        finally:
            stop.set()
            writes = await task
        assert done.done and writes > 0
        assert [k for k in old if await a.get_with_version(k) is not None] == []
        entry = await a.get(kv("hot"))
        assert entry is None or entry.value.startswith(b"new-")


async def test_an_agent_and_its_tenant_erased_at_once(storage: Storage, app: App) -> None:
    async with connect(app, "op-a") as a, connect(app, "op-b") as b:
        sids = await everything(a, "agent") + await everything(a, "other")
        await everything(b, "agent")
        kept = {k: v for k, v in data_only(raw_items(storage)).items() if "tenant-b" in k}
        agent_op, tenant_op = await asyncio.gather(a.erase_agent("agent"), a.erase_tenant())
        for op in (agent_op, tenant_op):
            assert (await a.wait_operation(op.name)).done
        assert raw_keys_naming(storage, "tenant-a", *sids) == []
        assert {k: v for k, v in data_only(raw_items(storage)).items() if "tenant-b" in k} == kept
        assert not [k for k in raw_items(storage) if k.startswith("#/erasing/")]
        assert (await a.open_session("agent", "chan")).session_id not in sids
