"""ScheduleService's rules over the ledger (spec/schedule.md).

The session's ledger log is the only authority. Every write is one fenced
ledger commit under the caller's generation, built on the head the server
read itself; when the holder's own concurrent commit moved the head
(SEQUENCE_MISMATCH) the decision is re-made on the new fold and committed
again — safe because only the current generation can commit at all. So a
create, delete or dispatch is durable before it is acknowledged.

Reads fold the log incrementally: records are immutable, so a fold cached in
this process up to seq S is advanced by reading only S+1..head (one `get`
of the head plus one listing when something was committed). The cache holds
no authority: it is a pure function of the immutable records it has seen.

WatchDue keeps no timer for anyone but its own live stream: it sleeps in
bounded segments (at most `watch_segment` seconds), re-reads the clock and
the generation on every wake, and ends with LEASE_FENCED once the lease moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from fencepost import reasons

from ..errors import Aborted, FailedPrecondition, InvalidArgument, limit_error
from ..ledger import Ledger
from ..ledger.layout import gen_value, parse_seq, session_not_found
from ..paging import ENTRY_OVERHEAD, fits, page_size
from .records import (
    MAX_AFTER_SECONDS,
    MAX_SCHEDULED_AT_MS,
    Change,
    Create,
    Delete,
    Dispatch,
    Fold,
    Reminder,
    encode,
    format_id,
    id_number,
    is_safe_positive,
    js_trim,
)

_ATTEMPTS = 16  # re-folds after the holder's own commits moved the head
UNSUPPORTED_RULES = ("at", "every_seconds", "cron", "time_zone")


@dataclass(frozen=True, slots=True)
class Listing:
    """A page of reminders with the log position it was folded at."""

    reminders: list[Reminder]
    seq: int
    now_ms: int
    rejected: list[tuple[int, str]]
    next_page_token: str = ""


def invalid(message: str, field_name: str, metadata: dict[str, object] | None = None) -> InvalidArgument:
    return InvalidArgument(reasons.REMINDER_INVALID, message, metadata, field=field_name)


def check_prompt(prompt: str) -> str:
    trimmed = js_trim(prompt)
    if not trimmed:
        raise invalid("prompt must not be empty (after trimming whitespace)", "prompt")
    return trimmed


def check_after_seconds(after_seconds: int | None) -> int:
    if after_seconds is None:
        raise invalid("after_seconds is required (the only supported rule)", "after_seconds")
    if not is_safe_positive(after_seconds):
        raise invalid(
            f"after_seconds must be an integer in 1..{MAX_AFTER_SECONDS} (got {after_seconds})", "after_seconds",
            {"after_seconds": after_seconds, "max": MAX_AFTER_SECONDS},
        )
    return after_seconds


def check_id(reminder_id: str) -> str:
    if id_number(reminder_id) is None:
        raise invalid(f"{reminder_id!r} is not a reminder id (rem_<n>)", "id", {"id": reminder_id})
    return reminder_id


def unsupported_rule(rule: str) -> InvalidArgument:
    return InvalidArgument(
        reasons.RULE_UNSUPPORTED,
        f"the {rule!r} rule is not supported; use after_seconds (a positive whole number of seconds)",
        {"rule": rule, "supported": "after_seconds"}, field=rule,
    )


class Schedule:
    """Session-local reminders folded from the session's ledger log."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Callable[[], float] = time.time,
        watch_segment: float = 1.0,
        cache_size: int = 10_000,
    ) -> None:
        self.ledger = ledger
        self.storage = ledger.storage
        self.clock = clock
        self.watch_segment = watch_segment
        self.draining = False  # shutdown has begun: open watches end
        self.cache_size = cache_size
        self._folds: OrderedDict[tuple[str, str], Fold] = OrderedDict()
        self._watchers: dict[tuple[str, str], set[asyncio.Event]] = {}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- reading ----------------------------------------------------------------------
    async def fold(self, tenant: str, sid: str) -> Fold:
        """The fold at the current head (advanced from the cached one)."""
        sk = self.ledger.keys(tenant, sid)
        key = (tenant, sid)
        cached = self._folds.get(key)
        head_item = await self.storage.get(sk.head)
        if head_item is None:
            raise session_not_found(sid)
        head = parse_seq(head_item.value)
        if cached is None:
            meta = await self.ledger.read_meta(sk)
            cached = Fold(seed_length=meta.seed_length)
        if head > cached.seq:
            current = cached
            async for page in self.ledger.log_pages(tenant, sid, current.seq + 1, head):
                current = current.apply(page)
            if await self.storage.get(sk.head) is None:  # deleted while its log was read (as ReadLog)
                raise session_not_found(sid)
            cached = replace(current, seq=head)
        self._folds[key] = cached
        self._folds.move_to_end(key)
        while len(self._folds) > self.cache_size:
            self._folds.popitem(last=False)
        return cached

    async def list(self, tenant: str, sid: str, *, due_only: bool = False, size: int = 0,
                   token: str = "") -> Listing:
        limit = page_size(self.ledger.limits, size)
        listing = ("schedule.due" if due_only else "schedule.list", sid)
        after = await self.ledger.pages.resume(tenant, listing, token)
        f = await self.fold(tenant, sid)
        now = self.now_ms()
        items = f.reminders()
        if due_only:
            items = [r for r in items if r.due(now)]
        if after is not None:
            start = int(after)
            items = [r for r in items if (id_number(r.id) or 0) > start]
        page = items[:limit]
        more = len(items) > limit
        # a prompt may be as large as a log record: end the page before it outgrows one response
        cut = fits((len(r.prompt.encode()) + ENTRY_OVERHEAD for r in page), self.ledger.limits.max_page_bytes)
        if cut is not None:
            page, more = page[:cut], True
        nxt = await self.ledger.pages.issue(tenant, listing, str(id_number(page[-1].id))) if more else ""
        rejected = [(r.seq, r.reason) for r in f.rejected] if after is None else []
        return Listing(page, f.seq, now, rejected, nxt)

    # -- writing ----------------------------------------------------------------------
    async def _write(
        self, tenant: str, sid: str, generation: int, decide: Callable[[Fold], Change | None]
    ) -> tuple[Fold, Change | None, int]:
        """Fold, decide, commit under `generation` at the head; re-decide when
        the head moved. Returns the fold decided on, the change (None: nothing
        to write) and the seq it landed at."""
        for _ in range(_ATTEMPTS):
            f = await self.fold(tenant, sid)
            change = decide(f)
            if change is None:
                await self._check_fence(tenant, sid, generation)
                return f, None, f.seq
            try:
                out = await self.ledger.commit(
                    tenant, sid, generation, f.seq, [encode(change)]
                )
            except Exception as exc:
                if getattr(exc, "reason", None) == reasons.SEQUENCE_MISMATCH:
                    continue  # the holder's own commit moved the head: decide again
                raise
            self._wake(tenant, sid)
            return f, change, out.seq
        raise Aborted(reasons.TXN_CONTENDED, "the session log kept moving under the reminder write; retry")

    async def _check_fence(self, tenant: str, sid: str, generation: int) -> None:
        """A no-op write is still answered only to the current holder."""
        sk = self.ledger.keys(tenant, sid)
        item = await self.storage.get(sk.gen)
        if item is None:
            raise session_not_found(sid)
        if item.value != gen_value(generation, True):
            raise await self.ledger.fenced(sk, generation)

    async def create(
        self, tenant: str, sid: str, generation: int, prompt: str, after_seconds: int | None,
        unsupported: tuple[str, ...] = (),
    ) -> tuple[Reminder, int]:
        """A new reminder, durable in the session log before this returns."""
        for rule in unsupported:
            raise unsupported_rule(rule)
        text = check_prompt(prompt)
        after = check_after_seconds(after_seconds)

        def decide(f: Fold) -> Change:
            scheduled = self.now_ms() + after * 1000
            if scheduled > MAX_SCHEDULED_AT_MS:
                raise invalid(
                    f"after_seconds {after} puts the reminder past 9999-12-31, the last instant a reminder can hold",
                    "after_seconds", {"after_seconds": after, "scheduled_at_ms": scheduled,
                                      "max_scheduled_at_ms": MAX_SCHEDULED_AT_MS},
                )
            reminder_id = f.next_id()
            if id_number(reminder_id) is None:
                # past the largest id a record can carry: written anyway, the
                # create would be acknowledged and then rejected by the fold
                last = format_id(f.max_id)
                raise FailedPrecondition(
                    reasons.REMINDER_IDS_EXHAUSTED,
                    f"a record of this session's log named {last}, the largest reminder id: "
                    "no reminder can be created in this session",
                    {"last_id": last},
                )
            change = Create(reminder_id, text, after, scheduled)
            # Checked here so the refusal names the request's field: the
            # ledger's own check names `records`, which this request has not
            # (a prompt grows once JSON-escaped: a control character is 6 bytes).
            size, limit = len(encode(change)), self.ledger.limits.max_value_bytes
            if size > limit:
                raise limit_error(reasons.RECORD_TOO_LARGE, "the prompt's log record", limit, size, field="prompt")
            return change

        _, change, seq = await self._write(tenant, sid, generation, decide)
        assert isinstance(change, Create)
        return Reminder(change.id, change.prompt, change.after_seconds, change.scheduled_at_ms, seq), seq

    async def delete(self, tenant: str, sid: str, generation: int, reminder_id: str) -> tuple[bool, int]:
        """(found, seq): False, nothing written, for unknown or finished ids."""
        check_id(reminder_id)
        _, change, seq = await self._write(
            tenant, sid, generation, lambda f: Delete(reminder_id) if reminder_id in f.active else None
        )
        return change is not None, seq

    async def dispatch(self, tenant: str, sid: str, generation: int, reminder_id: str) -> tuple[bool, int]:
        """(dispatched, seq): False, nothing written, when the id is not active."""
        check_id(reminder_id)
        _, change, seq = await self._write(
            tenant, sid, generation, lambda f: Dispatch(reminder_id) if reminder_id in f.active else None
        )
        return change is not None, seq

    # -- watching ---------------------------------------------------------------------
    async def drain(self) -> None:
        """Shutdown has begun: open watches end now, cleanly (the caller
        re-watches elsewhere), rather than holding the drain for its grace."""
        self.draining = True
        await self.wake_watchers()

    async def wake_watchers(self) -> None:
        """After the identity files were reloaded: open watches identify
        their caller again now (a revoked one ends)."""
        for wakes in self._watchers.values():
            for wake in wakes:
                wake.set()

    def _wake(self, tenant: str, sid: str) -> None:
        for event in self._watchers.get((tenant, sid), ()):
            event.set()

    async def watch_due(
        self, tenant: str, sid: str, generation: int, still_allowed: Callable[[], None] = lambda: None
    ) -> AsyncIterator[Reminder]:
        """Each active reminder once, when it becomes due by the clock read at
        that wake, while `generation` holds the lease; ends with LEASE_FENCED.
        A reminder dispatched or deleted before it is due is never pushed.
        `still_allowed` raises once the caller's credentials were revoked:
        asked on every wake (a reload wakes every watcher)."""
        key = (tenant, sid)
        wake = asyncio.Event()
        self._watchers.setdefault(key, set()).add(wake)
        sent: set[str] = set()
        try:
            while not self.draining:
                wake.clear()
                still_allowed()
                await self._check_fence(tenant, sid, generation)
                f = await self.fold(tenant, sid)
                now = self.now_ms()  # re-read on every wake: never fire early
                waiting = []
                for r in f.by_target():  # earliest target first
                    if r.id in sent:
                        continue
                    if r.due(now):
                        sent.add(r.id)
                        yield r
                    else:
                        waiting.append(r.scheduled_at_ms)
                pause = self.watch_segment
                if waiting:
                    pause = min(pause, max(0.0, (min(waiting) - now) / 1000))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), max(pause, 0.001))
        finally:
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.discard(wake)
                if not watchers:
                    self._watchers.pop(key, None)
