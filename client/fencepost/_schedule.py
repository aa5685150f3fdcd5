"""ScheduleService methods of the async client: session-local reminders."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import timestamp_pb2

from ._call import paged
from .v1 import schedule_pb2 as pb
from .v1 import schedule_pb2_grpc

_STATUS = {pb.REMINDER_STATUS_SCHEDULED: "scheduled", pb.REMINDER_STATUS_OVERDUE: "overdue"}
_MODE = {pb.DELIVERY_MODE_SESSION_LOCAL: "session-local"}


@dataclass(frozen=True, slots=True)
class Reminder:
    id: str
    prompt: str
    after_seconds: int
    scheduled_at: float  # seconds since the epoch (UTC target)
    status: str  # "scheduled" | "overdue", derived from the server's clock at the read
    delivery_mode: str  # always "session-local"
    seq: int  # the log seq of its create record


@dataclass(frozen=True, slots=True)
class RejectedRecord:
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReminderPage:
    reminders: list[Reminder]
    next_page_token: str
    seq: int
    read_time: float
    rejected: list[RejectedRecord]


def _reminder(m: pb.Reminder) -> Reminder:
    return Reminder(
        m.id, m.prompt, m.after_seconds, m.scheduled_at.ToMilliseconds() / 1000, _STATUS.get(m.status, "unspecified"),
        _MODE.get(m.delivery_mode, "unspecified"), m.seq,
    )


def _page(res: Any) -> ReminderPage:
    return ReminderPage(
        [_reminder(r) for r in res.reminders], res.next_page_token, res.seq, res.read_time.ToMilliseconds() / 1000,
        [RejectedRecord(r.seq, r.reason) for r in res.rejected_records],
    )


class ScheduleMethods:
    """Mixed into AsyncClient; `self._caller` and `self._schedule` come from it.

    CreateReminder is not retried (a retry could create a second reminder:
    after UNAVAILABLE, list the reminders to see whether it landed). Delete and
    Dispatch are retried: a repeat finds the id inactive and writes nothing."""

    _caller: Any
    _schedule: schedule_pb2_grpc.ScheduleServiceStub

    async def create_reminder(
        self,
        session_id: str,
        generation: int,
        prompt: str,
        *,
        after_seconds: int | None = None,
        at: float | None = None,
        every_seconds: int | None = None,
        cron: str | None = None,
        time_zone: str | None = None,
        **opts: Any,
    ) -> Reminder:
        """A reminder due `after_seconds` from now. `at`, `every_seconds`,
        `cron` and `time_zone` are sent as asked and refused by the server
        with RuleUnsupported (never silently dropped)."""
        req = pb.CreateReminderRequest(session_id=session_id, generation=generation, prompt=prompt,
                                       time_zone=time_zone or "")
        if after_seconds is not None:
            req.after_seconds = after_seconds
        if at is not None:
            ts = timestamp_pb2.Timestamp()
            ts.FromNanoseconds(int(at * 1e9))
            req.at.CopyFrom(ts)
        if every_seconds is not None:
            req.every_seconds = every_seconds
        if cron is not None:
            req.cron = cron
        res = await self._caller.call(self._schedule.CreateReminder, req, safe=False, **opts)
        return _reminder(res.reminder)

    async def delete_reminder(self, session_id: str, generation: int, reminder_id: str, **opts: Any) -> bool:
        """True when the reminder was active and is now deleted."""
        req = pb.DeleteReminderRequest(session_id=session_id, generation=generation, id=reminder_id)
        return bool((await self._caller.call(self._schedule.DeleteReminder, req, safe=True, **opts)).found)

    async def list_reminders_page(
        self, session_id: str, *, due: bool = False, page_size: int = 0, page_token: str = "", **opts: Any
    ) -> ReminderPage:
        """One page of the active (or, with due=True, the due) reminders."""
        if due:
            req: Any = pb.DueRemindersRequest(session_id=session_id, page_size=page_size, page_token=page_token)
            return _page(await self._caller.call(self._schedule.DueReminders, req, safe=True, **opts))
        req = pb.ListRemindersRequest(session_id=session_id, page_size=page_size, page_token=page_token)
        return _page(await self._caller.call(self._schedule.ListReminders, req, safe=True, **opts))

    async def list_reminders(self, session_id: str, *, page_size: int = 0, **opts: Any) -> AsyncIterator[Reminder]:
        """Active reminders in id order, with their derived status."""
        async for r in paged(lambda token: self._reminders(session_id, False, page_size, token, **opts)):
            yield r

    async def due_reminders(self, session_id: str, *, page_size: int = 0, **opts: Any) -> AsyncIterator[Reminder]:
        """Active reminders whose target has passed by the server's clock."""
        async for r in paged(lambda token: self._reminders(session_id, True, page_size, token, **opts)):
            yield r

    async def _reminders(
        self, session_id: str, due: bool, page_size: int, token: str, **opts: Any
    ) -> tuple[list[Reminder], str]:
        page = await self.list_reminders_page(session_id, due=due, page_size=page_size, page_token=token, **opts)
        return list(page.reminders), page.next_page_token

    async def dispatch_reminder(self, session_id: str, generation: int, reminder_id: str, **opts: Any) -> bool:
        """Record that the follow-up turn was queued. False when the id was not
        active (already dispatched, deleted, unknown); LeaseFenced when the
        caller no longer holds the session."""
        req = pb.DispatchRequest(session_id=session_id, generation=generation, id=reminder_id)
        return bool((await self._caller.call(self._schedule.Dispatch, req, safe=True, **opts)).dispatched)

    async def watch_due(self, session_id: str, generation: int, **opts: Any) -> AsyncIterator[Reminder]:
        """Each reminder once as it becomes due; raises LeaseFenced when the lease is lost."""
        req = pb.WatchDueRequest(session_id=session_id, generation=generation)
        async for res in self._caller.stream(self._schedule.WatchDue, req, **opts):
            yield _reminder(res.reminder)
