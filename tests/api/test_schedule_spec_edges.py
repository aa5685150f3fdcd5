"""spec/schedule.md statement by statement over gRPC, on every backend:
orders, terminal transitions, fencing and WatchDue's pushes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fencepost import errors
from fencepost_server.storage import Storage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.api.test_schedule_api import FakeClock, _held, _take_over
from tests.conftest import Drained, running


async def test_reminders_list_in_id_order_and_due_by_the_clock(storage: Storage) -> None:
    clock = FakeClock()
    async with running(storage, schedule_clock=clock) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "order")
        made = [await c.create_reminder(sid, gen, f"p{i}", after_seconds=100 - i) for i in range(1, 12)]
        ids = [f"rem_{i}" for i in range(1, 12)]
        assert [m.id for m in made] == ids
        assert [m.seq for m in made] == list(range(1, 12))
        page = await c.list_reminders_page(sid)
        assert [r.id for r in page.reminders] == ids  # id order: rem_2 before rem_10
        assert page.seq == 11 and page.read_time == pytest.approx(clock.now)
        clock.now += 95  # rem_5 (target +95) .. rem_11 (+89) are due
        due = [r.id async for r in c.due_reminders(sid)]
        assert due == [f"rem_{i}" for i in range(5, 12)]
        first = await c.list_reminders_page(sid, due=True, page_size=3)
        assert [r.id for r in first.reminders] == ["rem_5", "rem_6", "rem_7"] and first.next_page_token
        assert all(r.status == "overdue" for r in first.reminders)
        # ended reminders are neither listed nor due; ends are terminal
        assert await c.delete_reminder(sid, gen, "rem_5") is True
        assert await c.dispatch_reminder(sid, gen, "rem_5") is False
        assert await c.dispatch_reminder(sid, gen, "rem_6") is True
        assert await c.delete_reminder(sid, gen, "rem_6") is False
        assert await c.dispatch_reminder(sid, gen, "rem_99") is False
        head = (await c.get_session(sid)).seq
        assert head == 13  # the no-ops wrote nothing
        assert [r.id async for r in c.due_reminders(sid)] == [f"rem_{i}" for i in range(7, 12)]
        assert len([r async for r in c.list_reminders(sid)]) == 9
        for bad in (-1,):
            with pytest.raises(errors.FencepostError) as refused:
                await c.list_reminders_page(sid, page_size=bad)
            assert (refused.value.code, refused.value.reason) == ("INVALID_ARGUMENT", "PAGE_SIZE_INVALID")
        with pytest.raises(errors.SessionNotFound):
            await c.list_reminders_page("nope." + sid.split(".")[1])


async def test_watch_due_pushes_earliest_first_skips_ended_and_repeats_on_a_new_stream(storage: Storage) -> None:
    clock = FakeClock()
    async with running(storage, schedule_clock=clock, schedule_watch_seconds=0.05) as srv, \
            srv.client(timeout=10) as c:
        sid, gen = await _held(c, "watch-order")
        await c.create_reminder(sid, gen, "late", after_seconds=50)     # rem_1
        await c.create_reminder(sid, gen, "early", after_seconds=10)    # rem_2
        await c.create_reminder(sid, gen, "tie", after_seconds=10)      # rem_3
        await c.create_reminder(sid, gen, "deleted", after_seconds=5)   # rem_4
        assert await c.delete_reminder(sid, gen, "rem_4") is True
        clock.now += 60
        seen: list[str] = []
        async for r in c.watch_due(sid, gen):
            seen.append(r.id)
            assert r.status == "overdue"
            if len(seen) == 3:
                break
        assert seen == ["rem_2", "rem_3", "rem_1"]
        assert await c.dispatch_reminder(sid, gen, "rem_2") is True
        again: list[str] = []

        async def watch() -> None:
            async for r in c.watch_due(sid, gen):
                again.append(r.id)

        task = asyncio.create_task(watch())
        while len(again) < 2:
            await asyncio.sleep(0.01)
        # a reminder created while watching is pushed once its target passes
        made = await c.create_reminder(sid, gen, "new", after_seconds=30)
        await clock.read_more(3)
        assert again == ["rem_3", "rem_1"]
        clock.now += 30
        while len(again) < 3:
            await asyncio.sleep(0.01)
        assert again == ["rem_3", "rem_1", made.id]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_watch_due_by_a_fenced_generation_ends_at_once(storage: Storage) -> None:
    async with running(storage, schedule_watch_seconds=0.05) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "watch-fenced")
        await c.create_reminder(sid, gen, "p", after_seconds=1)
        new = await _take_over(c, sid, gen)
        with pytest.raises(errors.LeaseFenced) as fenced:
            async for _ in c.watch_due(sid, gen):
                pass
        assert fenced.value.metadata["current_generation"] == str(new)
        await c.release_lease(sid, new)
        with pytest.raises(errors.LeaseFenced):  # released: nobody holds it
            async for _ in c.watch_due(sid, new):
                pass
        with pytest.raises(errors.LeaseFenced):
            await c.dispatch_reminder(sid, new, "rem_1")


async def test_schedule_writes_wait_for_nothing_and_share_the_head(storage: Storage) -> None:
    """Reminder writes land at the head whatever the holder committed; the
    holder's own commit at a stale head is the one told SEQUENCE_MISMATCH."""
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "share")
        await c.commit(sid, gen, 0, [b"turn-1"])
        made = await c.create_reminder(sid, gen, "p", after_seconds=60)
        assert made.seq == 2
        with pytest.raises(errors.SequenceMismatch):
            await c.commit(sid, gen, 1, [b"turn-2"])
        assert (await c.commit(sid, gen, 2, [b"turn-2"])).seq == 3
        assert [r.seq async for r in c.list_reminders(sid)] == [2]
        child = await c.fork(sid, 3, "child")
        assert [r async for r in c.list_reminders(child.session_id)] == []
        assert [r.id async for r in c.due_reminders(child.session_id)] == []
        # a prompt trimmed as JavaScript trims: U+FEFF goes, U+0085 stays
        odd = await c.create_reminder(sid, gen, "\ufeff\u00a0 hi \u0085", after_seconds=5)
        assert odd.prompt == "hi \u0085"


async def test_a_create_committed_by_the_runtime_is_folded_and_its_id_not_reused(storage: Storage) -> None:
    clock = FakeClock()
    async with running(storage, schedule_clock=clock) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "runtime")
        target = int((clock.now - 5) * 1000)
        rec = ('{"record":{"after_seconds":5,"id":"rem_5","kind":"after","prompt":"from the runtime",'
               f'"scheduled_at":{target},"type":"create","v":1}},"stream":"schedule/change"}}').encode()
        await c.commit(sid, gen, 0, [b"turn", rec])
        due = [r async for r in c.due_reminders(sid)]
        assert [(r.id, r.prompt, r.seq, r.status) for r in due] == [("rem_5", "from the runtime", 2, "overdue")]
        assert (await c.create_reminder(sid, gen, "mine", after_seconds=5)).id == "rem_6"
        child = await c.fork(sid, 2, "runtime-child")
        cgen = (await c.acquire_lease(child.session_id, "C", ttl=60)).generation
        pushed = []
        async with asyncio.timeout(5):
            mine = await c.create_reminder(child.session_id, cgen, "child's", after_seconds=1)
            clock.now += 2
            async for r in c.watch_due(child.session_id, cgen):
                pushed.append(r.id)
                break
        assert pushed == [mine.id] and mine.id == "rem_6"  # the parent's rem_5 is not the child's work


async def test_write_responses_carry_the_head(storage: Storage) -> None:
    from fencepost.v1 import schedule_pb2 as spb
    from fencepost.v1 import schedule_pb2_grpc

    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "heads")
        await c.commit(sid, gen, 0, [b"turn"])
        stub = schedule_pb2_grpc.ScheduleServiceStub(c._channel)
        made = await stub.CreateReminder(spb.CreateReminderRequest(
            session_id=sid, generation=gen, prompt="p", after_seconds=60))
        assert made.seq == made.reminder.seq == 2
        assert made.reminder.status == spb.REMINDER_STATUS_SCHEDULED
        assert made.reminder.delivery_mode == spb.DELIVERY_MODE_SESSION_LOCAL
        done = await stub.Dispatch(spb.DispatchRequest(session_id=sid, generation=gen, id="rem_1"))
        assert (done.dispatched, done.seq) == (True, 3)
        noop = await stub.Dispatch(spb.DispatchRequest(session_id=sid, generation=gen, id="rem_1"))
        assert (noop.dispatched, noop.seq) == (False, 3)
        gone = await stub.DeleteReminder(spb.DeleteReminderRequest(session_id=sid, generation=gen, id="rem_7"))
        assert (gone.found, gone.seq) == (False, 3)
        listed = await stub.ListReminders(spb.ListRemindersRequest(session_id=sid))
        assert (list(listed.reminders), listed.seq) == ([], 3)


async def test_watch_due_sees_another_replicas_reminders_and_takeover(tmp_path: Path) -> None:
    path = tmp_path / "replicas.db"
    clock = FakeClock()
    settings = {"schedule_clock": clock, "schedule_watch_seconds": 0.05}
    s1, s2 = SqliteStorage(path, synchronous="NORMAL"), SqliteStorage(path, synchronous="NORMAL")
    async with running(s1, **settings) as a, running(s2, **settings) as b, \
            a.client(timeout=10) as ca, b.client(timeout=10) as cb:
        sid, gen = await _held(ca, "replicas")
        watch = Drained(ca.watch_due(sid, gen), lambda r: r.id)
        made = await cb.create_reminder(sid, gen, "elsewhere", after_seconds=10)
        clock.now += 10
        await watch.until_seen(1)
        await _take_over(cb, sid, gen)
        await watch.end()
        assert watch.seen == [made.id] and len(watch.ended) == 1
        assert isinstance(watch.ended[0], errors.LeaseFenced)


async def test_id_shapes_and_rules_are_refused_before_storage_is_touched(storage: Storage) -> None:
    """No such session, yet the request's own faults are what is answered:
    they are decided before anything is read."""
    async with running(storage) as srv, srv.client(timeout=10) as c:
        missing = "0" * 32 + ".YWdlbnQ"
        with pytest.raises(errors.ReminderInvalid):
            await c.delete_reminder(missing, 1, "rem_01")
        with pytest.raises(errors.ReminderInvalid):
            await c.dispatch_reminder(missing, 1, "reminder")
        with pytest.raises(errors.RuleUnsupported):
            await c.create_reminder(missing, 1, "p", every_seconds=60)
        with pytest.raises(errors.SessionNotFound):
            await c.delete_reminder(missing, 1, "rem_1")
