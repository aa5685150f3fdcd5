"""ScheduleService through a real server on loopback, on every backend."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost_server.storage import Storage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import Drained, running
from tests.faults import FaultyStorage


class FakeClock:
    """An injectable wall clock that counts how often the server read it."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    async def read_more(self, times: int = 3) -> None:
        """Wait until the server has read the clock `times` more times."""
        start = self.reads
        while self.reads < start + times:
            await asyncio.sleep(0.01)


async def _held(c: fencepost.AsyncClient, key: str, holder: str = "A") -> tuple[str, int]:
    sid = (await c.open_session("agent", key)).session_id
    return sid, (await c.acquire_lease(sid, holder, ttl=60)).generation


async def _take_over(c: fencepost.AsyncClient, sid: str, generation: int) -> int:
    await c.release_lease(sid, generation, force=True)
    return (await c.acquire_lease(sid, "B", ttl=60)).generation


async def test_create_list_due_dispatch_and_fencing(storage: Storage) -> None:
    clock = FakeClock()
    async with running(storage, schedule_clock=clock) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "s1")
        made = await c.create_reminder(sid, gen, "  check the build  ", after_seconds=60)
        assert (made.id, made.prompt, made.status, made.delivery_mode) == (
            "rem_1", "check the build", "scheduled", "session-local")
        assert made.scheduled_at == pytest.approx(clock.now + 60)
        assert [(r.id, r.status) async for r in c.list_reminders(sid)] == [("rem_1", "scheduled")]
        assert [r async for r in c.due_reminders(sid)] == []

        clock.now -= 3600  # moved back: never due early
        assert [r async for r in c.due_reminders(sid)] == []
        clock.now += 3600 + 61  # moved forward past the target: overdue at once
        assert [(r.id, r.status) async for r in c.list_reminders(sid)] == [("rem_1", "overdue")]
        assert [r.id async for r in c.due_reminders(sid)] == ["rem_1"]

        # the runtime's own records share the log and are skipped by the fold
        head = (await c.get_session(sid)).seq
        await c.commit(sid, gen, head, [b'{"stream":"chat/turn"}', b"\x00raw"])
        assert [r.id async for r in c.due_reminders(sid)] == ["rem_1"]

        # a fenced generation may not dispatch (nor create, nor delete)
        new = await _take_over(c, sid, gen)
        with pytest.raises(errors.LeaseFenced):
            await c.dispatch_reminder(sid, gen, "rem_1")
        with pytest.raises(errors.LeaseFenced):
            await c.create_reminder(sid, gen, "late", after_seconds=1)
        with pytest.raises(errors.LeaseFenced):
            await c.delete_reminder(sid, gen, "rem_9")  # even when there is nothing to write
        assert [r.id async for r in c.due_reminders(sid)] == ["rem_1"]

        assert await c.dispatch_reminder(sid, new, "rem_1") is True
        assert await c.dispatch_reminder(sid, new, "rem_1") is False  # terminal
        assert [r async for r in c.due_reminders(sid)] == []
        assert [r async for r in c.list_reminders(sid)] == []


async def test_rules_and_input_are_validated(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "s2")
        for rule in ({"at": time.time() + 60}, {"every_seconds": 60}, {"cron": "* * * * *"}):
            with pytest.raises(errors.RuleUnsupported) as exc:
                await c.create_reminder(sid, gen, "p", **rule)  # type: ignore[arg-type]
            assert exc.value.metadata["rule"] == next(iter(rule))
        with pytest.raises(errors.RuleUnsupported):
            await c.create_reminder(sid, gen, "p", after_seconds=5, time_zone="Europe/Paris")
        # 2**53 - 1 seconds is past 9999-12-31: an instant no Timestamp (or JSON reader) holds exactly
        for bad in ({"after_seconds": 0}, {"after_seconds": -1}, {"after_seconds": 2**53},
                    {"after_seconds": 2**53 - 1}, {}):
            with pytest.raises(errors.ReminderInvalid):
                await c.create_reminder(sid, gen, "p", **bad)  # type: ignore[arg-type]
        with pytest.raises(errors.ReminderInvalid):
            await c.create_reminder(sid, gen, " \n\t ", after_seconds=5)
        for bad_id in ("", "rem_0", "rem_01", "1", "rem_x", "rem_1 "):
            with pytest.raises(errors.ReminderInvalid):
                await c.delete_reminder(sid, gen, bad_id)
        assert (await c.get_session(sid)).seq == 0  # nothing was written
        far = await c.create_reminder(sid, gen, "far", after_seconds=200_000_000_000)  # year ~8300
        assert far.status == "scheduled"
        assert await c.delete_reminder(sid, gen, far.id) is True
        assert await c.delete_reminder(sid, gen, far.id) is False
        assert (await c.create_reminder(sid, gen, "next", after_seconds=1)).id == "rem_2"  # never reused


async def test_concurrent_writes_by_the_holder_each_land(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=20) as c:
        sid, gen = await _held(c, "s3")
        made = await asyncio.gather(*(c.create_reminder(sid, gen, f"p{i}", after_seconds=600) for i in range(4)))
        assert sorted(r.id for r in made) == ["rem_1", "rem_2", "rem_3", "rem_4"]
        assert sorted({r.seq for r in made}) == [1, 2, 3, 4]
        page = await c.list_reminders_page(sid, page_size=3)
        rest = await c.list_reminders_page(sid, page_size=3, page_token=page.next_page_token)
        assert [r.id for r in page.reminders + rest.reminders] == ["rem_1", "rem_2", "rem_3", "rem_4"]
        assert rest.next_page_token == ""


async def test_fork_does_not_inherit_active_reminders(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "parent")
        await c.create_reminder(sid, gen, "parent's", after_seconds=1)
        child = await c.fork(sid, 1, "child")
        assert [r async for r in c.list_reminders(child.session_id)] == []
        cgen = (await c.acquire_lease(child.session_id, "C", ttl=60)).generation
        assert await c.dispatch_reminder(child.session_id, cgen, "rem_1") is False
        mine = await c.create_reminder(child.session_id, cgen, "child's", after_seconds=1)
        assert mine.id == "rem_2"  # ids are not reused across the inherited prefix either
        assert [r.id async for r in c.list_reminders(sid)] == ["rem_1"]


async def test_malformed_schedule_records_are_reported(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "s4")
        await c.create_reminder(sid, gen, "p", after_seconds=1)
        bad = b'{"record":{"v":2,"type":"dispatch","id":"rem_1"},"stream":"schedule/change"}'
        await c.commit(sid, gen, 1, [bad])
        page = await c.list_reminders_page(sid)
        assert [r.id for r in page.reminders] == ["rem_1"]
        assert [(x.seq, "version" in x.reason) for x in page.rejected] == [(2, True)]


async def test_restart_keeps_an_overdue_reminder_due_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "schedule.db"
    clock = FakeClock()
    async with running(SqliteStorage(path, synchronous="FULL"), schedule_clock=clock) as srv, \
            srv.client(timeout=10) as c:
        sid, gen = await _held(c, "restart")
        await c.create_reminder(sid, gen, "wake up", after_seconds=30)
        await c.create_reminder(sid, gen, "later", after_seconds=3600)
    clock.now += 31  # the target passes while the process is down
    async with running(SqliteStorage(path, synchronous="FULL"), schedule_clock=clock) as srv, \
            srv.client(timeout=10) as c:
        due = [r async for r in c.due_reminders(sid)]
        assert [(r.id, r.prompt, r.status) for r in due] == [("rem_1", "wake up", "overdue")]
        gen = (await c.acquire_lease(sid, "A", ttl=60)).generation  # the restarted holder: a new generation
        assert await c.dispatch_reminder(sid, gen, "rem_1") is True
    async with running(SqliteStorage(path, synchronous="FULL"), schedule_clock=clock) as srv, \
            srv.client(timeout=10) as c:
        assert [r async for r in c.due_reminders(sid)] == []
        assert [r.id async for r in c.list_reminders(sid)] == ["rem_2"]


async def test_watch_due_follows_the_clock_and_ends_on_takeover(storage: Storage) -> None:
    clock = FakeClock()
    async with running(storage, schedule_clock=clock, schedule_watch_seconds=0.05) as srv, \
            srv.client(timeout=10) as c:
        sid, gen = await _held(c, "watch")
        await c.create_reminder(sid, gen, "soon", after_seconds=30)
        watch = Drained(c.watch_due(sid, gen))
        seen = watch.seen
        await clock.read_more(5)
        clock.now -= 3600  # moved back: still not due
        await clock.read_more(5)
        assert seen == []
        clock.now += 3600 + 30  # exactly at the target
        while not seen:
            await asyncio.sleep(0.01)
        assert [(r.id, r.status) for r in seen] == [("rem_1", "overdue")]
        # pushed once per stream, not again on later wakes (until dispatched)
        await clock.read_more(5)
        assert len(seen) == 1
        await _take_over(c, sid, gen)
        await watch.end()
        assert len(watch.ended) == 1 and isinstance(watch.ended[0], errors.LeaseFenced) and len(seen) == 1


async def test_watch_due_with_the_real_clock(storage: Storage) -> None:
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "real")
        made = await c.create_reminder(sid, gen, "one second", after_seconds=1)
        async for r in c.watch_due(sid, gen):
            assert time.time() >= made.scheduled_at  # never early (an ordering, not a duration)
            assert (r.id, r.status) == ("rem_1", "overdue")
            break
        assert await c.dispatch_reminder(sid, gen, r.id) is True


async def test_unknown_durability_answers_persistence_uncertain(storage: Storage) -> None:
    faulty = FaultyStorage(storage, 1, fail=0.0, timeout=0.0, lose=1.0, only={"transact"})
    faulty.armed = False
    async with running(faulty) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "uncertain")
        faulty.armed = True  # the commit applies, its response is lost
        with pytest.raises(errors.PersistenceUncertain):
            await c.create_reminder(sid, gen, "maybe", after_seconds=60)
        faulty.armed = False
        assert [r.prompt async for r in c.list_reminders(sid)] == ["maybe"]  # how the caller learns it landed


async def test_used_up_reminder_ids_refuse_a_create_instead_of_losing_it(storage: Storage) -> None:
    """A record of the log named the largest reminder id there is: the next
    id cannot be written as one, so CreateReminder is refused (nothing is
    written) rather than acknowledging a reminder its own fold rejects."""
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "ids")
        top = b'{"record":{"v":1,"type":"dispatch","id":"rem_9999999999999999999"},"stream":"schedule/change"}'
        await c.commit(sid, gen, 0, [top])
        with pytest.raises(errors.ReminderIdsExhausted) as exc:
            await c.create_reminder(sid, gen, "lost?", after_seconds=5)
        assert exc.value.metadata["last_id"] == "rem_9999999999999999999"
        assert (await c.get_session(sid)).seq == 1  # nothing was written
        page = await c.list_reminders_page(sid)
        assert list(page.reminders) == [] and len(page.rejected) == 1


async def test_a_target_in_the_last_second_of_9999_is_answered_exactly(storage: Storage) -> None:
    """scheduled_at may be any millisecond up to 9999-12-31T23:59:59.999Z (a
    Timestamp holds it): the answer carries the stored target, not one cut
    back to the whole second (which reads as earlier than the real target)."""
    clock = FakeClock(1_700_000_000.5)
    async with running(storage, schedule_clock=clock) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "last-second")
        after = (253_402_300_799_500 - 1_700_000_000_500) // 1000
        made = await c.create_reminder(sid, gen, "at the very end", after_seconds=after)
        assert made.scheduled_at == 253_402_300_799.5
        [listed] = [r async for r in c.list_reminders(sid)]
        assert listed.scheduled_at == 253_402_300_799.5


async def test_many_large_rejected_records_do_not_break_the_listing(storage: Storage) -> None:
    """Refused records are reported, but a log full of large ones (another
    writer's: each names a 200 KB id) must not make every ListReminders /
    DueReminders answer larger than a message (RESOURCE_EXHAUSTED forever):
    each reason quotes a bounded excerpt and at most the first 100 are listed."""
    clock = FakeClock()
    async with running(storage, schedule_clock=clock) as srv, srv.client(timeout=30) as c:
        sid, gen = await _held(c, "rejects")
        await c.create_reminder(sid, gen, "still here", after_seconds=1)
        huge = b'{"record":{"v":1,"type":"delete","id":"' + b"x" * 200_000 + b'"},"stream":"schedule/change"}'
        small = b'{"record":{"v":1,"type":"dispatch","id":"rem_7"},"stream":"schedule/change"}'
        seq = 1
        for _ in range(12):  # 48 records of 200 KB: ~9.6 MB of bad ids
            seq = (await c.commit(sid, gen, seq, [huge] * 4)).seq
        seq = (await c.commit(sid, gen, seq, [small] * 64)).seq
        seq = (await c.commit(sid, gen, seq, [small] * 64)).seq
        clock.now += 2  # the reminder is due
        for page in (await c.list_reminders_page(sid), await c.list_reminders_page(sid, due=True)):
            assert [r.prompt for r in page.reminders] == ["still here"]
            assert len(page.rejected) == 100
            assert [x.seq for x in page.rejected] == list(range(2, 102))  # the first ones, in log order
            assert all(len(x.reason) <= 300 for x in page.rejected)


async def test_a_prompt_over_the_record_limit_is_refused_naming_the_prompt(storage: Storage) -> None:
    """RECORD_TOO_LARGE names the request's `prompt` (what the caller can fix),
    not `records`, a field CreateReminderRequest does not have: a 60 KB
    prompt of control characters is a 360 KB record once JSON-escaped."""
    async with running(storage) as srv, srv.client(timeout=10) as c:
        sid, gen = await _held(c, "big")
        with pytest.raises(errors.RecordTooLarge) as exc:
            await c.create_reminder(sid, gen, "a" + "\x01" * 60_000 + "z", after_seconds=5)
        assert list(exc.value.field_violations) == ["prompt"]
        assert exc.value.metadata["limit"] == str(256 * 1024)
        assert (await c.get_session(sid)).seq == 0


class StepBackClock(FakeClock):
    """Moves back an hour right after the first read at or past `target`."""

    def __init__(self, now: float, target: float) -> None:
        super().__init__(now)
        self.target = target

    def __call__(self) -> float:
        value = super().__call__()
        if value >= self.target:
            self.now = self.target - 3600
        return value


async def test_watch_due_pushes_a_reminder_as_overdue_even_if_the_clock_moves_back(storage: Storage) -> None:
    """WatchDue pushes a reminder because the clock read at that wake made it
    due; the pushed record says overdue even when the clock steps back before
    the response is built (it was due: the push is the proof)."""
    clock = StepBackClock(1_700_000_000.0, target=float("inf"))
    async with running(storage, schedule_clock=clock, schedule_watch_seconds=0.05) as srv, \
            srv.client(timeout=10) as c:
        sid, gen = await _held(c, "step-back")
        made = await c.create_reminder(sid, gen, "soon", after_seconds=30)
        seen: list[fencepost.Reminder] = []

        async def watch() -> None:
            async for r in c.watch_due(sid, gen):
                seen.append(r)

        task = asyncio.create_task(watch())
        try:
            await clock.read_more(3)
            clock.target = made.scheduled_at
            clock.now = made.scheduled_at  # the next wake sees the target reached, then the clock steps back
            while not seen:
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
        assert [(r.id, r.status) for r in seen] == [("rem_1", "overdue")]


async def test_a_shutdown_ends_an_open_watch_due_at_once() -> None:
    """The drain ends WatchDue as it ends WatchInbox and ClaimOrphan: the
    stream closes cleanly (the caller re-watches elsewhere) at once, instead
    of holding every shutdown for the whole grace and then being cut."""
    from fencepost_server.app import App
    from fencepost_server.config import Settings
    from fencepost_server.storage.memory import MemoryStorage

    app = App(Settings(listen="127.0.0.1:0"), storage=MemoryStorage())
    await app.start()
    async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=10) as c:
        sid, gen = await _held(c, "s1")
        await c.create_reminder(sid, gen, "later", after_seconds=3600)
        watch = Drained(c.watch_due(sid, gen))
        await asyncio.sleep(0.3)  # the watch is open and waiting
        started = time.monotonic()
        await app.stop(grace=5)
        assert time.monotonic() - started < 2
        await watch.end()
        assert watch.ended == [] and watch.seen == []
