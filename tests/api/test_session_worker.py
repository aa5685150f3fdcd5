"""`fencepost.SessionWorker` through a real server: follow-up turns under one
lease, a taken-over worker stops without committing, INBOX_NOT_EMPTY on
release drains, and a killed worker's events are served by claim_orphans."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost import InboxEvent, Session
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import RunningServer, running


@pytest.fixture(params=["memory", "sqlite"])
async def srv(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunningServer]:
    storage = MemoryStorage() if request.param == "memory" else SqliteStorage(tmp_path / "w.db", synchronous="NORMAL")
    async with running(storage, ledger_janitor_seconds=0.2, ledger_orphan_grace_seconds=0.2) as s:
        yield s


@pytest.fixture
async def fp(srv: RunningServer) -> AsyncIterator[fencepost.AsyncClient]:
    async with srv.client(timeout=10.0) as c:
        yield c


class Turns:
    """A turn function that records (generation, payloads) per turn and commits one record per event."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[bytes]]] = []
        self.hooks: list[Any] = []

    async def __call__(self, s: Session, events: list[InboxEvent]) -> list[bytes]:
        self.seen.append((s.generation, [e.payload for e in events]))
        if self.hooks:
            await self.hooks.pop(0)(s, events)
        return [b"did " + e.payload for e in events]


async def log(fp: fencepost.AsyncClient, sid: str) -> list[bytes]:
    return [r.data async for r in fp.read_log(sid)]


async def test_event_delivered_while_holding_is_served_in_a_follow_up_turn(fp: fencepost.AsyncClient) -> None:
    turns = Turns()
    worker = fencepost.SessionWorker(fp, turns, holder_id="pod-a", idle=0)
    late: list[fencepost.Delivery] = []

    async def during_first_turn(s: Session, events: list[InboxEvent]) -> None:
        # another source delivers while pod-a holds the lease: it walks away
        late.append(await fp.deliver(b"second", agent="ag", session_key="k", try_lease="pod-b"))

    turns.hooks.append(during_first_turn)
    result = await worker.deliver(b"first", agent="ag", session_key="k")
    assert late[0].lease_granted is False
    assert result.served and result.released and not result.fenced
    assert result.turns == 2 and result.consumed == 2
    assert turns.seen == [(result.generation, [b"first"]), (result.generation, [b"second"])]
    assert await log(fp, result.session_id) == [b"did first", b"did second"]
    head = await fp.get_session(result.session_id)
    assert head.pending == 0 and head.lease.released and head.lease.generation == result.generation


async def test_watch_inbox_push_while_idle_runs_another_turn(fp: fencepost.AsyncClient) -> None:
    turns = Turns()
    worker = fencepost.SessionWorker(fp, turns, holder_id="pod-a", idle=60)
    first_done = asyncio.Event()

    async def mark(s: Session, events: list[InboxEvent]) -> None:
        first_done.set()

    async def then_stop(s: Session, events: list[InboxEvent]) -> None:
        worker.stop()  # finish this turn, then release (idle is long: only stop ends it)

    turns.hooks += [mark, then_stop]
    task = asyncio.create_task(worker.deliver(b"one", agent="ag", session_key="idle"))
    await first_done.wait()
    d = await fp.deliver(b"two", agent="ag", session_key="idle", try_lease="pod-b")
    assert d.lease_granted is False
    result = await task
    assert result.released and result.turns == 2
    assert [payloads for _, payloads in turns.seen] == [[b"one"], [b"two"]]
    assert {g for g, _ in turns.seen} == {result.generation}
    assert await log(fp, result.session_id) == [b"did one", b"did two"]


async def test_taken_over_worker_stops_without_committing(fp: fencepost.AsyncClient) -> None:
    go = asyncio.Event()
    taken: list[fencepost.Lease] = []

    async def slow_turn(s: Session, events: list[InboxEvent]) -> list[bytes]:
        # while this turn runs, the lease is forced away and taken by another holder
        await fp.release_lease(s.session_id, s.generation, force=True)
        taken.append(await fp.acquire_lease(s.session_id, "thief", ttl=30))
        go.set()
        return [b"stale write"]

    worker = fencepost.SessionWorker(fp, slow_turn, holder_id="pod-a", idle=60)
    result = await worker.deliver(b"e", agent="ag", session_key="fenced")
    assert go.is_set() and result.served
    assert result.fenced and not result.released and result.turns == 0 and result.consumed == 0
    assert taken[0].generation > result.generation
    assert await log(fp, result.session_id) == []
    head = await fp.get_session(result.session_id)
    assert head.pending == 1 and head.lease.holder_id == "thief" and head.lease.live


class DeliverOnFirstRelease:
    """The client, except that the first release is preceded by a delivery
    (an event parked between the worker's last look and its release)."""

    def __init__(self, client: fencepost.AsyncClient) -> None:
        self._client = client
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def release_lease(self, session_id: str, generation: int, **kw: Any) -> int:
        if not self.raced:
            self.raced = True
            await self._client.deliver(b"raced", session_id=session_id)
        return await self._client.release_lease(session_id, generation, **kw)


async def test_release_refused_with_inbox_not_empty_drains_first(fp: fencepost.AsyncClient) -> None:
    turns = Turns()
    racing = DeliverOnFirstRelease(fp)
    worker = fencepost.SessionWorker(racing, turns, holder_id="pod-a", idle=0)  # type: ignore[arg-type]
    result = await worker.deliver(b"first", agent="ag", session_key="race")
    assert racing.raced and result.released
    assert [p for _, p in turns.seen] == [[b"first"], [b"raced"]]
    assert await log(fp, result.session_id) == [b"did first", b"did raced"]
    assert (await fp.get_session(result.session_id)).pending == 0


async def test_killed_workers_events_are_served_by_claim_orphans(srv: RunningServer, fp: fencepost.AsyncClient) -> None:
    started = asyncio.Event()

    async def hangs(s: Session, events: list[InboxEvent]) -> list[bytes]:
        started.set()
        await asyncio.Event().wait()  # never finishes: the process is killed here
        return []

    async with srv.client(timeout=10.0) as doomed_client:
        doomed = fencepost.SessionWorker(doomed_client, hangs, holder_id="doomed", ttl=0.3, idle=60)
        task = asyncio.create_task(doomed.deliver(b"orphaned", agent="ag", session_key="kill"))
        await started.wait()
        await fp.deliver(b"also pending", agent="ag", session_key="kill")
        task.cancel()  # killed: no commit, no release, no more renewals
        with pytest.raises(asyncio.CancelledError):
            await task
    sid = (await fp.resolve_session("ag", "kill")).session_id
    assert (await fp.get_session(sid)).pending == 2

    turns = Turns()
    rescuer = fencepost.SessionWorker(fp, turns, holder_id="rescuer", ttl=30, idle=0)

    async def stop_after(s: Session, events: list[InboxEvent]) -> None:
        rescuer.stop()

    turns.hooks.append(stop_after)
    results = await asyncio.wait_for(rescuer.claim_orphans(agent="ag", wait=1.0), 60)
    assert [(r.session_id, r.released, r.consumed) for r in results] == [(sid, True, 2)]
    assert turns.seen == [(results[0].generation, [b"orphaned", b"also pending"])]
    assert await log(fp, sid) == [b"did orphaned", b"did also pending"]
    head = await fp.get_session(sid)
    assert head.pending == 0 and head.lease.released and head.lease.generation == results[0].generation


async def test_deliver_to_a_held_session_walks_away(fp: fencepost.AsyncClient) -> None:
    sid = (await fp.open_session("ag", "held")).session_id
    await fp.acquire_lease(sid, "other", ttl=30)
    turns = Turns()
    result = await fencepost.SessionWorker(fp, turns, holder_id="pod-a").deliver(b"x", session_id=sid)
    assert not result.served and result.delivery is not None and not result.delivery.lease_granted
    assert turns.seen == [] and (await fp.get_session(sid)).pending == 1


async def test_an_event_delivered_through_the_serving_worker_is_a_follow_up_turn(fp: fencepost.AsyncClient) -> None:
    """One worker (one holder id) receives a second event for the session it
    is serving: it walks away from its own delivery, and its loop serves the
    event in a follow-up turn; the turn in progress is not fenced and no turn
    runs twice."""
    turns = Turns()
    worker = fencepost.SessionWorker(fp, turns, holder_id="pod-a", idle=0)
    inner: list[fencepost.WorkerResult] = []

    async def during_first_turn(s: Session, events: list[InboxEvent]) -> None:
        inner.append(await worker.deliver(b"second", agent="ag", session_key="same-pod"))

    turns.hooks.append(during_first_turn)
    result = await worker.deliver(b"first", agent="ag", session_key="same-pod")
    assert not inner[0].served
    assert result.served and result.released and not result.fenced
    assert turns.seen == [(result.generation, [b"first"]), (result.generation, [b"second"])]
    assert await log(fp, result.session_id) == [b"did first", b"did second"]


async def test_a_delivery_whose_granted_answer_was_lost_is_still_served(srv: RunningServer) -> None:
    """The first Deliver parks the event and grants this worker the lease, but
    its answer is lost (UNAVAILABLE / PERSISTENCE_UNCERTAIN); the SDK resends
    it under its dedupe key, and the resend finds the lease live under this
    worker's own holder id: not granted again. The worker must serve the
    session it holds, not walk away leaving the event to wait out the TTL."""
    from tests.api.test_sdk_retry_safety import _uncertain

    async with srv.client(timeout=10.0, retry=fencepost.RetryPolicy(initial_backoff=0.001)) as fp:
        real = fp._ledger  # type: ignore[attr-defined]

        class _LostAnswer:
            lost = False

            def __getattr__(self, name: str) -> Any:
                method = getattr(real, name)
                if name != "Deliver":
                    return method

                async def deliver(request: Any, **kw: Any) -> Any:
                    out = await method(request, **kw)
                    if not _LostAnswer.lost:
                        _LostAnswer.lost = True
                        raise _uncertain()
                    return out

                return deliver

        fp._ledger = _LostAnswer()  # type: ignore[attr-defined]
        turns = Turns()
        result = await fencepost.SessionWorker(fp, turns, holder_id="pod-a", idle=0).deliver(
            b"x", agent="ag", session_key="lost-answer", dedupe_key="evt-1"
        )
        assert _LostAnswer.lost and result.delivery is not None and result.delivery.duplicate
        assert result.served and result.consumed == 1 and result.released, result
        assert await log(fp, result.session_id) == [b"did x"]
