"""Work left pending when the store moved carries on on the new store: a
session whose holder's lease expired with events in its inbox is claimable
after a migration (sqlite -> DynamoDB) or a restore, with its events and
generation from before the move; reminders keep their due / dispatched state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fencepost
from fencepost_server.storage import open_backend
from tests.conftest import running

from .test_restore_services import MOVES, move

SETTINGS = {"ledger_janitor_seconds": 0.2, "ledger_orphan_grace_seconds": 0.5}


@pytest.mark.parametrize("route", MOVES)
async def test_an_orphaned_session_is_claimable_after_the_move(tmp_path: Path, route: str) -> None:
    source_url = f"sqlite://{tmp_path / 'source.db'}"
    source = open_backend(source_url)
    try:
        async with running(source, ledger_janitor=False) as srv, srv.client(timeout=30) as c:
            sid = (await c.open_session("agent", "chan")).session_id
            lease = await c.acquire_lease(sid, "gone-holder", ttl=0.3)
            await c.commit(sid, lease.generation, 0, [b"r1"])
            for n in range(3):
                await c.deliver(f"event {n}".encode(), session_id=sid, dedupe_key=f"e{n}")
            events = [e async for e in c.list_inbox(sid)]
            while (await c.get_session(sid)).lease.live:
                await asyncio.sleep(0.1)
    finally:
        await source.close()

    target_url = await move(route, source_url, tmp_path)

    target = open_backend(target_url)
    try:
        async with running(target, **SETTINGS) as srv, fencepost.AsyncClient(srv.target, timeout=30) as c:
            claimed = await c.claim_orphan("new-holder", ttl=60, wait=20, agent="agent")
            assert claimed is not None and claimed.session_id == sid
            assert claimed.lease.generation == lease.generation + 1
            assert [e async for e in c.list_inbox(sid)] == events
            done_seq = await c.commit(sid, claimed.lease.generation, 1, [b"r2"],
                                      consume=[e.inbox_id for e in events])
            assert done_seq.seq == 2 and [e async for e in c.list_inbox(sid)] == []
    finally:
        await target.close()


@pytest.mark.parametrize("route", MOVES)
async def test_due_and_dispatched_reminders_stay_so_after_the_move(tmp_path: Path, route: str) -> None:
    """A reminder dispatched before the move is not due again after it (a
    repeated dispatch writes nothing); one due and not dispatched is still due
    and dispatches once; one not yet due stays active."""
    source_url = f"sqlite://{tmp_path / 'source.db'}"
    source = open_backend(source_url)
    try:
        async with running(source, ledger_janitor=False) as srv, srv.client(timeout=30) as c:
            sid = (await c.open_session("agent", "chan")).session_id
            gen = (await c.acquire_lease(sid, "holder", ttl=3600)).generation
            sent = await c.create_reminder(sid, gen, "already sent", after_seconds=1)
            due = await c.create_reminder(sid, gen, "due", after_seconds=1)
            later = await c.create_reminder(sid, gen, "later", after_seconds=3600)
            while len([r async for r in c.due_reminders(sid)]) < 2:
                await asyncio.sleep(0.2)
            assert await c.dispatch_reminder(sid, gen, sent.id)
            before = ([r async for r in c.list_reminders(sid)], [r.id async for r in c.due_reminders(sid)])
            assert before[1] == [due.id]
    finally:
        await source.close()

    target_url = await move(route, source_url, tmp_path)

    target = open_backend(target_url)
    try:
        async with running(target, ledger_janitor=False) as srv, srv.client(timeout=30) as c:
            assert ([r async for r in c.list_reminders(sid)], [r.id async for r in c.due_reminders(sid)]) == before
            assert not await c.dispatch_reminder(sid, gen, sent.id)  # dispatched before the move
            assert await c.dispatch_reminder(sid, gen, due.id)
            assert not await c.dispatch_reminder(sid, gen, due.id)
            assert [r.id async for r in c.list_reminders(sid)] == [later.id]
    finally:
        await target.close()
