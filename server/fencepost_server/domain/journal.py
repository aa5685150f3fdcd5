"""The server-owned turn-memory journal (spec/journal.md, docs/journal.md).

Key layout under one agent (`{tenant}/sys/agentkit/v1/{agent}/journal/`):

    tail/{record id}             one appended record (written blind, never read-modify-written)
    seg/{gen:08d}/{seq:010d}     a flushed segment of generation `gen` (immutable)
    head                         {"gen", "seq", "bytes", "records"}: the live generation
    lease                        {"owner", "until"}: the flush lease (CAS-elected)
    archive/{name}               {"gen", "bytes", "records", "rotated"}: a rotated generation

A flush step is ONE transaction: put the segment (absent before), put the head
(at the version read), delete every tail item the segment holds (each present),
and on rotation put the archive marker. So a record is in the tail or in
exactly one segment at every instant; every step before the transaction only
reads, and a step re-run after a crash starts from whatever state it finds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fencepost import reasons
from fencepost.journal import (
    MEMORY_APPEND,
    MEMORY_READ,
    PROTOCOL_VERSIONS,
    WIRE_NAMES,
    agent_name_problem,
    compact_json,
    merge_parts,
)

from ..storage import Delete, Expect, Item, Put, Storage, Write
from .errors import InvalidArgument, NotFound, backend_unavailable, limit_error
from .keys import TenantKeys
from .limits import Limits
from .paging import PageTokens, page_size
from .prefix import delete_prefix
from .requests import RequestLog, check_request_id
from .throttled_log import ThrottledWarning

log = logging.getLogger("fencepost.journal")

#: tail items folded per flush transaction (segment + head + archive + deletes <= 100 ops)
MAX_BATCH = 96
#: flush steps a read runs at most (the read includes unflushed records anyway)
READ_FLUSH_STEPS = 16
#: flush steps one background flush runs at most
BACKGROUND_FLUSH_STEPS = 1024
_LIST_PAGE = 1000
_READ_ATTEMPTS = 8


@dataclass(frozen=True)
class JournalConfig:
    flush_seconds: float = 30.0  # flush a tail older than this
    flush_bytes: int = 64 * 1024  # ... or larger than this
    max_journal_bytes: int = 5 * 1024 * 1024  # rotate the live journal at this size
    segment_bytes: int = 192 * 1024  # stored bytes per segment item (well under 256 KiB / 400 KB)
    lease_seconds: float = 30.0  # flush lease time to live


@dataclass(frozen=True, slots=True)
class Entry:
    """One journaled record: its id, its request id ("" if none), its JSON line."""

    id: str
    rid: str
    json: bytes

    def encode(self) -> bytes:
        return b"%s\t%s\t%s" % (self.id.encode(), compact_json(self.rid), self.json)

    @classmethod
    def decode(cls, raw: bytes) -> Entry:
        rid_at = raw.index(b"\t")
        json_at = raw.index(b"\t", rid_at + 1)
        return cls(raw[:rid_at].decode(), json.loads(raw[rid_at + 1:json_at]), raw[json_at + 1:])


def decode_segment(raw: bytes) -> list[Entry]:
    return [Entry.decode(line) for line in raw.split(b"\n") if line]


@dataclass(frozen=True, slots=True)
class JournalView:
    """A journal's bytes (JSONL, id order) with its size and record count."""

    data: bytes
    records: int

    @property
    def size(self) -> int:
        return len(self.data)

    def chunks(self, target: int = 64 * 1024) -> Iterator[bytes]:
        """Whole-line chunks of about `target` bytes (at least one, maybe empty)."""
        data, start = self.data, 0
        if not data:
            yield b""
            return
        while start < len(data):
            end = min(start + target, len(data))
            if end < len(data):
                nl = data.rfind(b"\n", start, end)
                end = nl + 1 if nl >= start else data.index(b"\n", end) + 1
            yield data[start:end]
            start = end


@dataclass(frozen=True, slots=True)
class ArchiveInfo:
    name: str
    size: int
    records: int
    rotated_ms: int


@dataclass(frozen=True, slots=True)
class ArchivePage:
    archives: list[ArchiveInfo]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class FlushOutcome:
    flushed: int  # records moved from the tail into segments
    rotated: int  # archives written
    skipped: bool  # another flusher holds the lease


#: the largest per-millisecond counter an id can carry (its six digits)
_MAX_COUNTER = 999_999


class IdSource:
    """Time-ordered unique record ids: `{ms:013d}-{counter:06d}-{node}`.

    Sortable as strings; within one process strictly increasing (a clock step
    backwards is absorbed by keeping the last millisecond); unique across
    replicas through the random `node` tag. The counter has six digits: the
    id after `999999` in one millisecond takes the next millisecond (counter
    0), since a seventh digit would sort before the ids it follows."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.node = secrets.token_hex(4)
        self._last_ms = 0
        self._counter = 0
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            ms = max(int(self.clock() * 1000), self._last_ms)
            self._counter = self._counter + 1 if ms == self._last_ms else 0
            if self._counter > _MAX_COUNTER:  # borrow the next millisecond (the clock catches up)
                ms, self._counter = ms + 1, 0
            self._last_ms = ms
            return f"{ms:013d}-{self._counter:06d}-{self.node}"


def _head_state(item: Item | None) -> dict[str, int]:
    if item is None:
        return {"gen": 1, "seq": 0, "bytes": 0, "records": 0}
    return dict(json.loads(item.value))


#: what archive_name writes; any other name is no archive (and is not looked
#: up: a long one would be over DynamoDB's key limit, a refusal there)
_ARCHIVE_NAME = re.compile(r"[0-9]{6,19}-[0-9]{8}T[0-9]{6}\.[0-9]{3}Z")


def archive_name(rotated_ms: int, gen: int) -> str:
    """`{generation}-{rotation time, UTC}`: sorts in rotation order even when
    replicas' clocks disagree, and names when it happened."""
    stamp = datetime.fromtimestamp(rotated_ms / 1000, timezone.utc)
    return f"{gen:06d}-{stamp:%Y%m%dT%H%M%S}.{rotated_ms % 1000:03d}Z"


class _Keys:
    __slots__ = ("root", "tail", "head", "lease", "archive")

    def __init__(self, tenant: str, agent: str, *, agent_prefix: str | None = None) -> None:
        # agent_prefix: the agent's stored prefix, for a caller that has only the
        # key (retention: a hashed segment cannot be turned back into the name)
        prefix = agent_prefix if agent_prefix is not None else TenantKeys(tenant).agent(agent)
        self.root = prefix + "journal/"
        self.tail = self.root + "tail/"
        self.head = self.root + "head"
        self.lease = self.root + "lease"
        self.archive = self.root + "archive/"

    def segments(self, gen: int) -> str:
        return f"{self.root}seg/{gen:08d}/"

    def segment(self, gen: int, seq: int) -> str:
        return f"{self.segments(gen)}{seq:010d}"


@functools.lru_cache(maxsize=4096)
def _keys(tenant: str, agent: str) -> _Keys:
    """An agent's journal keys, built once while cached (segment encoding is a
    measurable part of an append); _Keys is never modified after it is built."""
    return _Keys(tenant, agent)


def check_agent(agent: str, field: str) -> None:
    problem = agent_name_problem(agent)
    if problem is not None:
        raise InvalidArgument(reasons.AGENT_NAME_INVALID, problem, {"agent": agent[:300]}, field=field)


def check_envelope(v: int, call: str, payload: str | None) -> None:
    """A store-API envelope's version and call/payload agreement."""
    if v not in PROTOCOL_VERSIONS:
        served = ",".join(str(x) for x in PROTOCOL_VERSIONS)
        raise InvalidArgument(
            reasons.UNSUPPORTED_PROTOCOL_VERSION, f"protocol version {v} is not served (served: {served})",
            {"v": v, "served": served}, field="v",
        )
    expected = {MEMORY_APPEND: "memory_append", MEMORY_READ: "memory_read"}.get(call)
    if expected is None or payload != expected:
        raise InvalidArgument(
            reasons.CALL_PAYLOAD_MISMATCH,
            f"call {call!r} does not match the payload set ({payload or 'none'}); "
            f"calls served: {MEMORY_APPEND}, {MEMORY_READ}",
            {"call": call, "payload": payload or ""}, field="call",
        )


class Journal:
    """The journal rules over one backend. Holds no journal state: the
    in-memory `dirty` map only schedules background flushes."""

    def __init__(
        self,
        storage: Storage,
        limits: Limits,
        config: JournalConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        requests: RequestLog | None = None,
        pages: PageTokens | None = None,
        events: Callable[..., None] | None = None,
    ) -> None:
        self.storage = storage
        #: metrics hook: events("journal.flush_lag_seconds", 3.2); no-op by default
        self.events: Callable[..., None] = events or (lambda name, value=1.0: None)
        self.limits = limits
        self.pages = pages or PageTokens.ephemeral()
        self.config = config or JournalConfig()
        self.requests = requests or RequestLog(storage)
        self.clock = clock
        self.ids = IdSource(clock)
        # (tenant, agent) -> [monotonic time the flush is due from, bytes, time of
        # the oldest unflushed append]: a skipped flush is due again a full
        # interval later, and the lag it reports still counts from the oldest
        self.dirty: dict[tuple[str, str], list[float]] = {}
        self._flush_warning = ThrottledWarning(log, "journal flush")
        self._wake = asyncio.Event()
        self._owner = itertools.count()

    # -- append -------------------------------------------------------------
    def encode_record(
        self, fields: Mapping[str, Any], extra: Mapping[str, Any], field: str = "record"
    ) -> bytes:
        """Validate a record and return its journal line (compact JSON)."""
        for name in ("at", "sessionId", "channelId"):
            if not fields.get(name):
                raise InvalidArgument(
                    reasons.FIELD_INVALID, f"{field}.{name} is required", {"field": name}, field=f"{field}.{name}"
                )
        if fields.get("status") not in ("completed", "failed"):
            raise InvalidArgument(
                reasons.FIELD_INVALID, f"{field}.status must be completed or failed",
                {"field": "status"}, field=f"{field}.status",
            )
        shadowed = sorted(k for k in extra if k in WIRE_NAMES)
        if shadowed:
            raise InvalidArgument(
                reasons.FIELD_INVALID, f"{field}.extra repeats typed fields: {', '.join(shadowed)}",
                {"keys": ",".join(shadowed)}, field=f"{field}.extra",
            )
        line = compact_json(merge_parts(fields, extra))
        limit = self.limits.max_journal_record_bytes
        if len(line) > limit:
            raise limit_error(reasons.RECORD_TOO_LARGE, "record", limit, len(line), field=field)
        return line

    async def append(
        self,
        tenant: str,
        agent: str,
        fields: Mapping[str, Any],
        extra: Mapping[str, Any],
        request_id: str = "",
        *,
        field_prefix: str = "",
    ) -> str:
        """Journal one record: validate, then one write. Returns the id.

        Without a request id the write is blind (no read, no condition). With
        one, the tail item and the request-id marker land in one transaction:
        a retry gets the first attempt's record id back, and the same id with a
        different record is REQUEST_ID_REUSED (never acked)."""
        check_agent(agent, field_prefix + "agent")
        line = self.encode_record(fields, extra, field_prefix + "record")
        check_request_id(request_id)
        entry = Entry(self.ids.next(), request_id, line)
        keys = _keys(tenant, agent)
        if not request_id:
            await self.storage.put(keys.tail + entry.id, entry.encode())
        else:
            fingerprint = hashlib.sha256(b"journal.append\x00%s\x00%s" % (agent.encode(), line)).digest()
            result = await self.requests.transact(
                tenant, request_id, fingerprint, [], [Put(keys.tail + entry.id, entry.encode())], note=entry.id
            )
            if result.replayed:
                return result.note
        self._note(tenant, agent, len(line) + 1)
        return entry.id

    def _note(self, tenant: str, agent: str, size: int) -> None:
        slot = self.dirty.get((tenant, agent))
        if slot is None:
            now = time.monotonic()
            self.dirty[(tenant, agent)] = [now, float(size), now]
        else:
            slot[1] += size
            if slot[1] >= self.config.flush_bytes:
                self._wake.set()

    # -- read ---------------------------------------------------------------
    async def _list_all(self, prefix: str) -> list[Item]:
        out: list[Item] = []
        after: str | None = None
        while True:
            page = await self.storage.list(prefix, after, _LIST_PAGE)
            out.extend(page)
            if len(page) < _LIST_PAGE:
                return out
            after = page[-1].key

    async def _segments(self, keys: _Keys, gen: int) -> list[Entry]:
        return [e for item in await self._list_all(keys.segments(gen)) for e in decode_segment(item.value)]

    async def read(self, tenant: str, agent: str, *, flush: bool = True, field: str = "agent") -> JournalView | None:
        """The live journal, or None when the agent never appended.

        Flush-on-read first (skipped when another flusher holds the lease).
        Then: head, tail, the head generation's segments, head again; a
        rotation in between (generation changed) re-runs the read. Records
        are de-duplicated by id and by request id with record, and returned in id order."""
        check_agent(agent, field)
        keys = _keys(tenant, agent)
        # what the background flusher has due for this agent, as it was before the read
        due = self.dirty.get((tenant, agent))
        due_size = due[1] if due is not None else 0.0
        if flush:
            with contextlib.suppress(Exception):  # a failed flush never fails the read
                await self.flush(tenant, agent, max_steps=READ_FLUSH_STEPS)
        for _ in range(_READ_ATTEMPTS):
            head = await self.storage.get(keys.head)
            gen = _head_state(head)["gen"]
            tail = [Entry.decode(item.value) for item in await self._list_all(keys.tail)]
            segments = await self._segments(keys, gen)
            again = await self.storage.get(keys.head)
            if _head_state(again)["gen"] == gen:
                break
        else:  # pragma: no cover - needs a rotation during each of 8 attempts
            raise backend_unavailable("the journal kept rotating during the read; retry")
        if due is not None and not tail and self.dirty.get((tenant, agent)) is due and due[1] == due_size:
            # every append noted before the read was written before it listed
            # the tail, which it found empty (folded, by this read's flush or
            # another's), and none was noted since: nothing left to flush
            del self.dirty[(tenant, agent)]
        if again is None and not tail:
            return None
        return _view([*segments, *tail])

    # -- archives -----------------------------------------------------------
    async def expire_archives(self, tenant: str, agent: str, before_ms: int) -> int:
        """Retention: delete the archives rotated before `before_ms`, segments
        first and the archive marker last, so a crash mid-way leaves a listed
        archive that the next pass deletes again. Returns how many went."""
        return await self._expire(_keys(tenant, agent), before_ms)

    async def expire_archives_under(self, agent_prefix: str, before_ms: int) -> int:
        """expire_archives for the agent whose keys start with `agent_prefix`
        (`{tenant}/sys/agentkit/v1/{agent}/`, segments as stored): retention
        walks keys, and a hashed tenant or agent segment has no name to pass."""
        return await self._expire(_Keys("", "", agent_prefix=agent_prefix), before_ms)

    async def _expire(self, keys: _Keys, before_ms: int) -> int:
        removed = 0
        for item in await self._list_all(keys.archive):
            info = json.loads(item.value)
            if int(info["rotated"]) >= before_ms:
                continue
            await delete_prefix(self.storage, keys.segments(int(info["gen"])))
            await self.storage.delete(item.key)
            removed += 1
        return removed

    async def list_archives(self, tenant: str, agent: str, size: int = 0, token: str = "") -> ArchivePage:
        check_agent(agent, "agent")
        keys = _keys(tenant, agent)
        limit = page_size(self.limits, size)
        listing = ("journal.list_archives", agent)
        after = await self.pages.resume(tenant, listing, token)
        items = await self.storage.list(keys.archive, keys.archive + after if after else None, limit + 1)
        out = [_archive_info(i.key[len(keys.archive):], i.value) for i in items[:limit]]
        nxt = await self.pages.issue(tenant, listing, out[-1].name) if len(items) > limit else ""
        return ArchivePage(out, nxt)

    async def read_archive(self, tenant: str, agent: str, name: str) -> tuple[ArchiveInfo, JournalView]:
        check_agent(agent, "agent")
        keys = _keys(tenant, agent)
        missing = NotFound(reasons.ARCHIVE_NOT_FOUND, f"no archive named {name!r}", {"name": name, "agent": agent})
        item = await self.storage.get(keys.archive + name) if _ARCHIVE_NAME.fullmatch(name) else None
        if item is None:
            raise missing
        gen = json.loads(item.value)["gen"]
        segments = await self._segments(keys, gen)
        # retention deletes the segments, then the marker: read the marker again,
        # so an archive it deleted meanwhile is not found rather than returned in part
        if await self.storage.get(keys.archive + name) is None:
            raise missing
        return _archive_info(name, item.value), _view(segments)

    # -- flush --------------------------------------------------------------
    async def _acquire(self, keys: _Keys) -> tuple[str, str] | None:
        """Take the flush lease; (owner, version) or None when held by another."""
        now = int(self.clock() * 1000)
        owner = f"{self.ids.node}:{next(self._owner)}"
        value = compact_json({"owner": owner, "until": now + int(self.config.lease_seconds * 1000)})
        current = await self.storage.get(keys.lease)
        if current is None:
            res = await self.storage.put_if_absent(keys.lease, value)
        elif json.loads(current.value)["until"] > now:
            return None
        else:
            res = await self.storage.put_if_version(keys.lease, value, current.version)
        return (owner, res.version) if res.applied and res.version else None

    async def _renew(self, keys: _Keys, owner: str, version: str) -> str | None:
        now = int(self.clock() * 1000)
        value = compact_json({"owner": owner, "until": now + int(self.config.lease_seconds * 1000)})
        res = await self.storage.put_if_version(keys.lease, value, version)
        return res.version if res.applied else None

    async def flush(self, tenant: str, agent: str, *, max_steps: int = BACKGROUND_FLUSH_STEPS) -> FlushOutcome:
        """Fold the whole tail into segments under the flush lease.

        An empty tail is seen first with one read, and then nothing is taken
        or written: a read of a folded journal (flush-on-read) stays read-only."""
        keys = _keys(tenant, agent)
        if not await self.storage.list_keys(keys.tail, None, 1):
            return FlushOutcome(0, 0, False)
        held = await self._acquire(keys)
        if held is None:
            return FlushOutcome(0, 0, True)
        owner, version = held
        lease: str | None = version
        flushed = rotated = 0
        try:
            for step in range(max_steps):
                if step:
                    lease = await self._renew(keys, owner, version)
                    if lease is None:
                        break  # lease lost: the new holder carries on
                    version = lease
                moved, rot = await self.flush_step(keys)
                flushed, rotated = flushed + moved, rotated + rot
                if moved == 0:
                    break
        finally:
            if lease is not None:
                with contextlib.suppress(Exception):
                    await self.storage.delete_if_version(keys.lease, lease)
        return FlushOutcome(flushed, rotated, False)

    async def flush_step(self, keys: _Keys) -> tuple[int, int]:
        """One atomic step: up to MAX_BATCH oldest tail records into one new
        segment (rotating first when they would not fit the live journal).
        Returns (records moved, archives written); (0, 0) when the tail is
        empty or another flusher changed the head meanwhile."""
        head_item = await self.storage.get(keys.head)
        head = _head_state(head_item)
        items = await self.storage.list(keys.tail, None, MAX_BATCH)
        if not items:
            return 0, 0
        entries = [Entry.decode(i.value) for i in items]
        writes: list[Write] = []
        rotated = 0
        cap = self.config.max_journal_bytes
        if head["bytes"] > 0 and head["bytes"] + len(entries[0].json) + 1 > cap:
            now = int(self.clock() * 1000)
            info = {"gen": head["gen"], "bytes": head["bytes"], "records": head["records"], "rotated": now}
            name = archive_name(now, head["gen"])
            writes.append(Put(keys.archive + name, compact_json(info), Expect(exists=False)))
            head = {"gen": head["gen"] + 1, "seq": 0, "bytes": 0, "records": 0}
            rotated = 1
        take, stored, added = 0, 0, 0
        for item, entry in zip(items, entries):
            if take and (stored + len(item.value) + 1 > self.config.segment_bytes
                         or head["bytes"] + added + len(entry.json) + 1 > cap):
                break
            take, stored, added = take + 1, stored + len(item.value) + 1, added + len(entry.json) + 1
        segment = b"\n".join(i.value for i in items[:take])
        writes.append(Put(keys.segment(head["gen"], head["seq"]), segment, Expect(exists=False)))
        new_head = {"gen": head["gen"], "seq": head["seq"] + 1, "bytes": head["bytes"] + added,
                    "records": head["records"] + take}
        head_expect = Expect(version=head_item.version) if head_item else Expect(exists=False)
        writes.append(Put(keys.head, compact_json(new_head), head_expect))
        writes.extend(Delete(i.key, Expect(exists=True)) for i in items[:take])
        result = await self.storage.transact((), writes)
        if not result.applied:
            return 0, 0
        return take, rotated

    # -- background ---------------------------------------------------------
    def due(self, now: float) -> list[tuple[str, str]]:
        return [
            k for k, (since, size, _) in self.dirty.items()
            if now - since >= self.config.flush_seconds or size >= self.config.flush_bytes
        ]

    async def flush_due(self) -> int:
        """Flush every agent this replica appended to that is due. Returns how many ran.

        Reports `journal.flush_lag_seconds`: the largest age, at its flush, of
        the oldest unflushed append among the agents whose records this pass
        moved (a skipped or failed flush reports nothing: its records are
        still due; nor does one that found the tail already folded by a read)."""
        ran = 0
        lag: float | None = None
        for tenant, agent in self.due(time.monotonic()):
            slot = self.dirty.pop((tenant, agent), None)
            started = time.monotonic()
            try:
                out = await self.flush(tenant, agent)
            except Exception as exc:
                self._flush_warning.failed(f"{agent!r}: {exc}")
                out = FlushOutcome(0, 0, True)
            else:
                self._flush_warning.ok()
                if out.flushed and slot is not None:  # nothing moved: a read's flush got there first
                    lag = max(lag or 0.0, started - slot[2])
            if out.skipped and slot is not None:  # try again later; keep what was counted
                now = time.monotonic()
                cur = self.dirty.setdefault((tenant, agent), [now, 0.0, now])
                cur[1] += slot[1]
                cur[2] = min(cur[2], slot[2])
            ran += 1
        if lag is not None:
            self.events("journal.flush_lag_seconds", lag)
        return ran

    async def run_flusher(self) -> None:
        """The background loop (AppContext.background)."""
        tick = max(0.05, min(1.0, self.config.flush_seconds / 4))
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=tick)
            self._wake.clear()
            await self.flush_due()


def _archive_info(name: str, raw: bytes) -> ArchiveInfo:
    data = json.loads(raw)
    return ArchiveInfo(name, data["bytes"], data["records"], data["rotated"])


def _view(entries: list[Entry]) -> JournalView:
    """Sort by id; one line per id and per non-empty request id with its record
    (first wins): a retry journaled again past the request-id window repeats
    both, while the same id reused for another record past it was acked anew."""
    by_id = {e.id: e for e in entries}
    seen_requests: set[tuple[str, bytes]] = set()
    lines: list[bytes] = []
    for rid_entry in sorted(by_id.values(), key=lambda e: e.id):
        if rid_entry.rid:
            request = (rid_entry.rid, rid_entry.json)
            if request in seen_requests:
                continue
            seen_requests.add(request)
        lines.append(rid_entry.json)
    data = b"".join(line + b"\n" for line in lines)
    return JournalView(data, len(lines))
