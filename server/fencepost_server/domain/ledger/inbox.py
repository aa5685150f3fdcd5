"""The durable inbox: Deliver parks an event and marks the session pending in
one transaction; ListInbox / WatchInbox read it; commits drain it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fencepost import reasons

from ...storage import Check, Item, Put, StorageError, Write, over_budget
from ..errors import NotFound, limit_error
from ..paging import ENTRY_OVERHEAD, fits, page_size
from .core import ABSENT, PRESENT, bad, check_holder, contended
from .layout import (
    LeaseState,
    SessionKeys,
    decode_event,
    encode_event,
    encode_inline_event,
    gen_value,
    inbox_time,
    pending_value,
    session_not_found,
)
from .leases import LeaseMethods
from .sessions import SessionMethods, check_agent

_ATTEMPTS = 4

#: payload blobs a ListInbox page reads at once
_BLOBS_AT_ONCE = 16


@dataclass(frozen=True, slots=True)
class InboxEvent:
    inbox_id: str
    payload: bytes
    dedupe_key: str
    delivered: float


@dataclass(frozen=True, slots=True)
class Delivery:
    session_id: str
    inbox_id: str
    duplicate: bool
    lease_granted: bool
    lease: LeaseState | None


class InboxMethods(SessionMethods, LeaseMethods):
    async def deliver(
        self,
        tenant: str,
        *,
        agent: str = "",
        session_key: str = "",
        session_id: str = "",
        payload: bytes,
        dedupe_key: str = "",
        try_lease: str = "",
        ttl: float | None = None,
    ) -> Delivery:
        """Park the event (one transaction; the return is the ack, after the
        write is durable), then optionally try the lease (one more)."""
        if len(payload) > self.limits.max_value_bytes:
            raise limit_error(reasons.EVENT_TOO_LARGE, "payload", self.limits.max_value_bytes, len(payload),
                              field="payload")
        if len(dedupe_key) > 1024:
            raise bad("dedupe_key", "dedupe_key is longer than 1024 characters")
        if try_lease:
            ttl = self.ttl(ttl)  # type: ignore[attr-defined]  # refused before anything is parked
            check_holder(try_lease, "try_lease")
        if session_id:
            sid = session_id
            sk = self.keys(tenant, sid)
            inbox_id, duplicate = await self._park(sk, payload, dedupe_key)
        else:
            check_agent(agent)
            sid, _ = await self.open_id(tenant, agent, session_key)
            try:
                inbox_id, duplicate = await self._park(self.keys(tenant, sid), payload, dedupe_key)
            except NotFound:  # a cached identity of a session deleted since: the key opens a new one
                self.forget_identity(tenant, agent, session_key)
                sid, _ = await self.open_id(tenant, agent, session_key)
                inbox_id, duplicate = await self._park(self.keys(tenant, sid), payload, dedupe_key)
            sk = self.keys(tenant, sid)
        self.notify(sid)
        granted, lease = False, None
        if try_lease:
            try:
                # reclaim=False: a worker serving this session right now keeps
                # its generation (its turn in progress drains the event)
                lease = await self.acquire(tenant, sid, try_lease, ttl, reclaim=False)  # type: ignore[attr-defined]
                granted = True
            except Exception as exc:  # LEASE_HELD is an answer here, not an error
                if getattr(exc, "reason", None) != reasons.LEASE_HELD:
                    raise
                item = self.cached_lease(sk.lease)
                lease = LeaseState.decode(item.value) if item is not None else None
        return Delivery(sid, inbox_id, duplicate, granted, lease)

    async def _park(self, sk: SessionKeys, payload: bytes, dedupe_key: str) -> tuple[str, bool]:
        for _ in range(_ATTEMPTS):
            now = self.clock()
            inbox_id = self.arrival_id(now)
            checks = [Check(sk.head, PRESENT)]
            if len(payload) > self.config.inline_event_bytes:
                # Written before the inbox entry; the entry's transaction checks
                # it still exists (the janitor may sweep a blob left too long).
                await self.storage.put(sk.blob_key(inbox_id), payload)
                checks.append(Check(sk.blob_key(inbox_id), PRESENT))
                event = encode_event({"d": dedupe_key, "t": now, "b": 1}, b"")
            else:
                event = encode_inline_event(dedupe_key, now, payload)
            writes: list[Write] = [
                Put(sk.inbox_key(inbox_id), event, ABSENT),
                Put(sk.pending, pending_value(sk.tenant)),
            ]
            if dedupe_key:
                writes.append(Put(sk.dedupe_key(dedupe_key), inbox_id.encode(), ABSENT))
            res = await self.storage.transact(checks, writes)
            if res.applied:
                return inbox_id, False
            if len(payload) > self.config.inline_event_bytes and len(checks) not in res.failed:
                # This attempt's blob has no entry (session gone, duplicate, or
                # blob swept): remove it now rather than at the janitor's grace
                # sweep. Not when the entry's id was taken: that blob is theirs.
                with contextlib.suppress(StorageError):
                    await self.storage.delete(sk.blob_key(inbox_id))
            if 0 in res.failed:
                raise session_not_found(sk.sid)
            if dedupe_key:
                first = await self.storage.get(sk.dedupe_key(dedupe_key))
                if first is not None:
                    return first.value.decode(), True
            # a blob swept or an id collision: try again with a fresh id
        raise contended("Deliver")

    async def _event(self, sk: SessionKeys, item: Item) -> InboxEvent | None:
        """The event of a listed inbox item; None when its payload blob is gone
        (written before the item, so: consumed or erased since it was listed)."""
        header, body = decode_event(item.value)
        inbox_id = item.key[len(sk.inbox):]
        if header.get("b"):
            blob = await self.storage.get(sk.blob_key(inbox_id))
            if blob is None:
                return None
            body = blob.value
        return InboxEvent(inbox_id, body, str(header.get("d", "")), float(header["t"]))  # type: ignore[arg-type]

    async def list_inbox(
        self, tenant: str, sid: str, size: int = 0, token: str = ""
    ) -> tuple[list[InboxEvent], str]:
        sk = self.keys(tenant, sid)
        limit = page_size(self.limits, size)
        listing = ("ledger.list_inbox", sid)
        after = await self.pages.resume(tenant, listing, token)
        budget = self.limits.max_page_bytes
        items, head = await asyncio.gather(
            self.storage.list(sk.inbox, sk.inbox + after if after else None, limit + 1, max_bytes=budget),
            self.storage.get(sk.head),
        )
        if head is None:
            raise session_not_found(sid)
        more = len(items) > limit or over_budget(items, budget)
        items = items[:limit]
        # Payloads over the inline limit are one get each: read side by side, a
        # few at a time, no further than one response holds (1000 blobs are 256 MiB).
        read: list[InboxEvent | None] = []
        spent = 0
        for at in range(0, len(items), _BLOBS_AT_ONCE):
            batch = await asyncio.gather(*(self._event(sk, it) for it in items[at:at + _BLOBS_AT_ONCE]))
            read += batch
            spent += sum(len(e.payload) + ENTRY_OVERHEAD for e in batch if e)
            if spent > budget:
                break
        if len(read) < len(items):
            items, more = items[:len(read)], True
        if None in read and await self.storage.get(sk.head) is None:
            raise session_not_found(sid)  # swept while it was read
        # end the page before it outgrows one response (AIP-158: fewer than asked)
        cut = fits((len(e.payload) + ENTRY_OVERHEAD if e else 0 for e in read), budget)
        if cut is not None:
            items, read, more = items[:cut], read[:cut], True
        events = [e for e in read if e is not None]
        last = items[-1].key[len(sk.inbox):] if more else ""  # listed, even if gone since
        nxt = await self.pages.issue(tenant, listing, last) if last else ""
        return events, nxt

    async def watch_inbox(
        self, tenant: str, sid: str, generation: int, still_allowed: Callable[[], None] = lambda: None
    ) -> AsyncIterator[InboxEvent]:
        """The backlog, then each newly parked event, while `generation` is
        current and held; ends with LEASE_FENCED. Deliveries through this
        process wake the watcher at once; others are seen within watch_poll.
        `still_allowed` raises once the caller's credentials were revoked:
        asked on every wake (a reload wakes every watcher)."""
        sk = self.keys(tenant, sid)
        wake = asyncio.Event()
        self._watchers.setdefault(sid, set()).add(wake)
        seen: set[str] = set()
        try:
            while not self.draining:
                wake.clear()
                still_allowed()
                gen = await self.storage.get(sk.gen)
                if gen is None:
                    raise session_not_found(sid)
                if gen.value != gen_value(generation, True):
                    raise await self.fenced(sk, generation)
                present: set[str] = set()
                start = None
                while True:
                    items = await self.storage.list(sk.inbox, start, 200)
                    for it in items:
                        inbox_id = it.key[len(sk.inbox):]
                        present.add(inbox_id)
                        if inbox_id not in seen and (event := await self._event(sk, it)) is not None:
                            yield event
                    if len(items) < 200:
                        break
                    start = items[-1].key
                seen = present
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.config.watch_poll)
        finally:
            watchers = self._watchers.get(sid)
            if watchers is not None:
                watchers.discard(wake)
                if not watchers:
                    self._watchers.pop(sid, None)


def event_age(inbox_id: str, now: float) -> float:
    return max(0.0, now - inbox_time(inbox_id))
