"""ScheduleService: decode, call the domain, encode."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf import timestamp_pb2

from fencepost.v1 import schedule_pb2 as pb
from fencepost.v1 import schedule_pb2_grpc

from ..domain.schedule import Listing, Reminder, Schedule
from ..domain.schedule.records import MAX_SCHEDULED_AT_MS
from .base import Authenticator, RpcObserver, ServicerBase, caller, server_stream, unary

# 9999-12-31T23:59:59.999Z: the last millisecond a Timestamp holds (its nanos
# go up to .999999999), so every target a record may hold is answered exactly
_MAX_TS_MS = MAX_SCHEDULED_AT_MS


def _ts(ms: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(max(0, min(ms, _MAX_TS_MS)))
    return ts


def _reminder(r: Reminder, now_ms: int) -> pb.Reminder:
    status = pb.REMINDER_STATUS_OVERDUE if r.due(now_ms) else pb.REMINDER_STATUS_SCHEDULED
    return pb.Reminder(
        id=r.id, prompt=r.prompt, after_seconds=r.after_seconds, scheduled_at=_ts(r.scheduled_at_ms),
        status=status, delivery_mode=pb.DELIVERY_MODE_SESSION_LOCAL, seq=r.seq,
    )


def _listing(out: Listing) -> dict[str, object]:
    return {
        "reminders": [_reminder(r, out.now_ms) for r in out.reminders],
        "next_page_token": out.next_page_token,
        "seq": out.seq,
        "read_time": _ts(out.now_ms),
        "rejected_records": [pb.RejectedRecord(seq=s, reason=why) for s, why in out.rejected],
    }


class ScheduleServicer(ServicerBase, schedule_pb2_grpc.ScheduleServiceServicer):
    def __init__(self, schedule: Schedule, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.schedule = schedule

    @unary
    async def CreateReminder(
        self, request: pb.CreateReminderRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateReminderResponse:
        rule = request.WhichOneof("rule")
        unsupported = tuple(r for r in (rule,) if r is not None and r != "after_seconds")
        if request.time_zone:
            unsupported += ("time_zone",)
        after = request.after_seconds if rule == "after_seconds" else None
        reminder, seq = await self.schedule.create(
            caller().tenant, request.session_id, request.generation, request.prompt, after, unsupported
        )
        return pb.CreateReminderResponse(reminder=_reminder(reminder, self.schedule.now_ms()), seq=seq)

    @unary
    async def DeleteReminder(
        self, request: pb.DeleteReminderRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteReminderResponse:
        found, seq = await self.schedule.delete(caller().tenant, request.session_id, request.generation, request.id)
        return pb.DeleteReminderResponse(found=found, seq=seq)

    @unary
    async def ListReminders(
        self, request: pb.ListRemindersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRemindersResponse:
        out = await self.schedule.list(
            caller().tenant, request.session_id, size=request.page_size, token=request.page_token
        )
        return pb.ListRemindersResponse(**_listing(out))  # type: ignore[arg-type]

    @unary
    async def DueReminders(
        self, request: pb.DueRemindersRequest, context: grpc.aio.ServicerContext
    ) -> pb.DueRemindersResponse:
        out = await self.schedule.list(
            caller().tenant, request.session_id, due_only=True, size=request.page_size, token=request.page_token
        )
        return pb.DueRemindersResponse(**_listing(out))  # type: ignore[arg-type]

    @unary
    async def Dispatch(self, request: pb.DispatchRequest, context: grpc.aio.ServicerContext) -> pb.DispatchResponse:
        done, seq = await self.schedule.dispatch(caller().tenant, request.session_id, request.generation, request.id)
        return pb.DispatchResponse(dispatched=done, seq=seq)

    @server_stream
    async def WatchDue(
        self, request: pb.WatchDueRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchDueResponse]:
        async for r in self.schedule.watch_due(
            caller().tenant, request.session_id, request.generation, self.still_allowed(context)
        ):
            # pushed because the clock read at that wake made it due: overdue,
            # whatever a clock read now (it may have stepped back) would say
            yield pb.WatchDueResponse(reminder=_reminder(r, r.scheduled_at_ms))
