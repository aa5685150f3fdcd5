"""MemoryStore: the memory operations over the storage contract.

Key layout under the agent (`TenantKeys.agent(agent)` + `memory/`):

    lane/{position:020d}    one record per entry / tombstone / pin / unpin /
                            trust change, written only where absent
    usage/{encoded id}      recall statistics, a derived index (losing it
                            loses statistics, never memories)

Every write is decided on a fold that holds every record up to position
`head`, then appended at `head + 1` if absent, while the record at `head` is
still stored at the version folded. When that position is taken (another
coroutine or another replica wrote first), or the lane was erased meanwhile,
the fold catches up and the decision is made again. So the lane is linearized: each record was
decided against exactly the records before it, and a pin that would not fit,
a supersedes that no longer names a live entry, or a retried request id is
seen before anything is appended. Positions never repeat and never leave a
gap.

Reads fold too, from a per-agent cache keyed by the lane head: a read costs
one small `list` after the cached head (usually empty), never a replay.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from fencepost import reasons
from fencepost.keys import encode_segment

from ...storage import Check, Expect, PersistenceUncertain, Put, Storage
from ..errors import Aborted, InvalidArgument, NotFound
from ..keys import TenantKeys, check_erasable_agent
from ..limits import Limits
from ..requests import check_request_id
from ..paging import ENTRY_OVERHEAD, PageTokens, fits, page_size
from . import ranking, rules
from .fold import FORGET, PIN, TRUST, UNPIN, Fold, decode_record, encode_record, entry_record
from .rules import Entry, Injection, Topic

log = logging.getLogger("fencepost.memory")

R = TypeVar("R")
_CATCH_UP_PAGE = 1000
_APPEND_ATTEMPTS = 64
_USAGE_ATTEMPTS = 3
IMPORT_MAX_ENTRIES = 1000


def now_micros() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class Usage:
    recall_count: int
    last_recalled_at: int


@dataclass(frozen=True, slots=True)
class EntryView:
    """An entry as a read presents it."""

    entry: Entry
    validity: str
    forgotten: bool = False
    superseded: bool = False
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class ReadResult:
    entries: list[EntryView]
    truncated: bool = False
    next_page_token: str = ""
    strategy: str = ""


@dataclass(frozen=True, slots=True)
class PinOutcome:
    pinned: bool
    bytes: int
    reason: str = ""
    blocking_id: str = ""


@dataclass(frozen=True, slots=True)
class ImportResult:
    imported: int
    skipped: list[str]


@dataclass(frozen=True, slots=True)
class NewEntry:
    """What Append takes beyond the content."""

    kind: str | None = None
    about: Sequence[str] = ()
    valid_from: int | None = None
    valid_until: int | None = None
    supersedes: str | None = None
    metadata: dict[str, Any] | None = None
    session_id: str = ""
    channel: str = ""
    trust: str | None = None


@dataclass(frozen=True, slots=True)
class _Decision:
    """A write decided on a fold: `records` to append (none: answer now), and
    how to compute the answer from the fold once they are in."""

    records: list[dict[str, Any]]
    finish: Callable[[Fold], Any]


def _grown_by(e: Entry, *, imported: bool = False) -> str:
    """The request field that grows a record the most, for RECORD_TOO_LARGE:
    content and about have caps of their own, these fields do not (ties go to
    metadata, then in this order)."""
    sizes = {
        "metadata": len(encode_record(e.metadata)) if e.metadata else 0,
        "supersedes": len((e.supersedes or "").encode()),
        "provenance.session_id": len(e.session_id.encode()),
        "provenance.channel": len(e.channel.encode()),
    }
    if imported:  # an imported id is the caller's, a minted one is short
        sizes["id"] = len(e.id.encode())
    return max(sizes, key=lambda field: sizes[field])


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str, sort_keys=True).encode()).hexdigest()[:24]


def check_agent(agent: str) -> None:
    # the names AdminService.EraseAgent takes, no more: memory kept under any
    # other name could never be erased agent-wide (spec/lifecycle.md)
    check_erasable_agent(agent, reasons.FIELD_INVALID, "agent_id")


class MemoryStore:
    """Agent memory over one backend. Holds only a cache of folds, which any
    replica may drop at any time."""

    def __init__(
        self,
        storage: Storage,
        limits: Limits | None = None,
        *,
        clock: Callable[[], int] = now_micros,
        cache_agents: int = 1024,
        pages: PageTokens | None = None,
    ) -> None:
        self.storage = storage
        self.limits = limits or Limits()
        self.pages = pages or PageTokens.ephemeral()
        self.clock = clock
        self._cache: OrderedDict[tuple[str, str], Fold] = OrderedDict()
        self._cache_agents = cache_agents

    # -- keys ----------------------------------------------------------------------------
    @staticmethod
    def _root(tenant: str, agent: str) -> str:
        return TenantKeys(tenant).agent(agent) + "memory/"

    def _lane(self, tenant: str, agent: str) -> str:
        return self._root(tenant, agent) + "lane/"

    def _usage_key(self, tenant: str, agent: str, entry_id: str) -> str:
        return self._root(tenant, agent) + "usage/" + encode_segment(entry_id)

    # -- the fold cache ----------------------------------------------------------------
    async def fold(self, tenant: str, agent: str) -> Fold:
        """The agent's fold, caught up with the lane (one list when warm)."""
        check_agent(agent)
        key = (tenant, agent)
        folded = self._cache.get(key)
        if folded is None:
            folded = Fold()
            self._cache[key] = folded
            while len(self._cache) > self._cache_agents:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        await self._catch_up(tenant, agent, folded)
        return folded

    async def _catch_up(self, tenant: str, agent: str, folded: Fold) -> None:
        lane = self._lane(tenant, agent)
        while True:
            # listed from the fold's own head record: if that is gone, or was
            # written again (another version), the lane was erased (AdminService)
            # since it was folded (and maybe refilled past that position through
            # another replica), and the fold starts over
            head, head_version = folded.head, folded.head_version
            after = f"{lane}{head - 1:020d}" if head > 1 else None
            rows = await self.storage.list(lane, after, _CATCH_UP_PAGE)
            if head and (not rows or rows[0].key != f"{lane}{head:020d}" or rows[0].version != head_version):
                folded.__init__()  # type: ignore[misc]
                continue
            for row in rows:
                try:
                    position = int(row.key[len(lane):])
                except ValueError:
                    continue
                folded.apply(position, decode_record(row.value))
                if position == folded.head:
                    folded.head_version = row.version
            if len(rows) < _CATCH_UP_PAGE:
                return

    async def _write(self, tenant: str, agent: str, decide: Callable[[Fold, int], _Decision]) -> Any:
        """Decide on the fold, append at the next positions, re-decide on conflict."""
        folded = await self.fold(tenant, agent)
        lane = self._lane(tenant, agent)
        for _ in range(_APPEND_ATTEMPTS):
            at = self.clock()
            decision = decide(folded, at)
            if not decision.records:
                return decision.finish(folded)
            base = folded.head
            payloads = [encode_record(r) for r in decision.records]
            if len(payloads) == 1 and not base:
                put = await self.storage.put_if_absent(f"{lane}{base + 1:020d}", payloads[0])
                applied, version = put.applied, put.version
            else:
                writes = [
                    Put(f"{lane}{base + i + 1:020d}", p, Expect(exists=False)) for i, p in enumerate(payloads)
                ]
                # the record decided on must still be stored: a lane erased since the
                # fold caught up would otherwise take this write into its empty lane,
                # and the fold would go on serving what was erased
                head = [Check(f"{lane}{base:020d}", Expect(version=folded.head_version))] if base else []
                txn = await self.storage.transact(head, writes)
                applied, version = txn.applied, txn.versions[-1] if txn.applied and txn.versions else None
            if applied:
                for i, rec in enumerate(decision.records):
                    folded.apply(base + i + 1, rec)
                if folded.head == base + len(payloads):
                    folded.head_version = version or ""
                return decision.finish(folded)
            await self._catch_up(tenant, agent, folded)
        raise Aborted(reasons.TXN_CONTENDED, "the memory lane kept moving under this write; retry it")

    @staticmethod
    def _replayed(folded: Fold, request_id: str, fp: str) -> str | None:
        """The entry id a request id already wrote, or None when it is new."""
        if not request_id:
            return None
        seen = folded.requests.get(request_id)
        if seen is None:
            return None
        if seen[0] != fp:
            raise InvalidArgument(
                reasons.REQUEST_ID_REUSED, "request_id was already used for a different request",
                {"request_id": request_id}, field="request_id",
            )
        return seen[1]

    # -- writes ---------------------------------------------------------------------------
    async def append(
        self, tenant: str, agent: str, content: str, options: NewEntry = NewEntry(), request_id: str = ""
    ) -> Entry:
        check_agent(agent)
        check_request_id(request_id)
        rules.check_content(content)
        about = rules.clean_about(list(options.about))
        rules.check_about(about)
        if options.kind is not None and options.kind not in rules.KINDS:
            raise InvalidArgument(reasons.FIELD_INVALID, f"unknown kind {options.kind!r}", field="kind")
        if options.trust is not None and options.trust not in rules.TRUST_LEVELS:
            raise InvalidArgument(reasons.FIELD_INVALID, f"unknown trust {options.trust!r}", field="provenance.trust")
        rules.check_window(options.valid_from, options.valid_until)
        fp = _fingerprint("append", content, about, options.kind, options.valid_from, options.valid_until,
                          options.supersedes, options.metadata, options.session_id, options.channel, options.trust)
        draft = Entry(
            id="", content=content, created_at=0, kind=options.kind, about=about,
            valid_from=options.valid_from, valid_until=options.valid_until, supersedes=options.supersedes or None,
            metadata=options.metadata or None, session_id=options.session_id, channel=options.channel,
            trust=options.trust,
        )
        size = len(encode_record(entry_record(draft, request_id, fp)))
        if size > rules.RECORD_MAX_BYTES - 64:  # room for the id and timestamp
            grown = _grown_by(draft)
            raise InvalidArgument(
                reasons.RECORD_TOO_LARGE,
                f"the entry is {size} bytes as recorded, over the limit of {rules.RECORD_MAX_BYTES - 64}"
                f" ({grown} is what grows it)",
                {"limit": rules.RECORD_MAX_BYTES - 64, "size": size}, field=grown,
            )

        def decide(folded: Fold, at: int) -> _Decision:
            prior = self._replayed(folded, request_id, fp)
            if prior is not None:
                return _Decision([], lambda f: f.entries[prior])
            if draft.supersedes is not None and not folded.is_live(draft.supersedes, at):
                raise InvalidArgument(
                    reasons.SUPERSEDES_INVALID,
                    f"supersedes names {draft.supersedes!r}, which is not a live entry of this agent",
                    {"supersedes": draft.supersedes}, field="supersedes",
                )
            entry_id, _ = rules.mint_id(folded.next_mint, folded.entries.__contains__)
            entry = replace(draft, id=entry_id, created_at=at)
            return _Decision([entry_record(entry, request_id, fp)], lambda f: f.entries[entry_id])

        result: Entry = await self._write(tenant, agent, decide)
        return result

    async def forget(self, tenant: str, agent: str, entry_id: str, request_id: str = "") -> bool:
        return await self._simple(tenant, agent, FORGET, entry_id, request_id)

    async def unpin(self, tenant: str, agent: str, entry_id: str, request_id: str = "") -> bool:
        return await self._simple(tenant, agent, UNPIN, entry_id, request_id)

    async def reassert_trust(self, tenant: str, agent: str, entry_id: str, trust: str, request_id: str = "") -> bool:
        if trust not in rules.TRUST_LEVELS:
            raise InvalidArgument(reasons.FIELD_INVALID, f"trust must be one of {rules.TRUST_LEVELS}", field="trust")
        return await self._simple(tenant, agent, TRUST, entry_id, request_id, trust)

    async def _simple(
        self, tenant: str, agent: str, kind: str, entry_id: str, request_id: str, trust: str = ""
    ) -> bool:
        check_agent(agent)
        check_request_id(request_id)
        fp = _fingerprint(kind, entry_id, trust)

        def decide(folded: Fold, at: int) -> _Decision:
            if self._replayed(folded, request_id, fp) is not None:
                return _Decision([], lambda f: True)
            if kind == UNPIN:
                ok = entry_id in folded.pins
            else:  # forget and reassert-trust touch only a live entry (seed 003)
                ok = folded.is_live(entry_id, at)
            if not ok:
                return _Decision([], lambda f: False)
            rec: dict[str, Any] = {"t": kind, "id": entry_id, "at": at}
            if trust:
                rec["tr"] = trust
            if request_id:
                rec["rid"], rec["fp"] = request_id, fp
            return _Decision([rec], lambda f: True)

        result: bool = await self._write(tenant, agent, decide)
        return result

    async def pin(self, tenant: str, agent: str, entry_id: str, request_id: str = "") -> PinOutcome:
        check_agent(agent)
        check_request_id(request_id)
        fp = _fingerprint(PIN, entry_id)

        def outcome(folded: Fold) -> PinOutcome:
            budget = folded.pin_budget()
            if entry_id in budget.effective:
                return PinOutcome(True, budget.bytes)
            d = rules.decide_pin(budget, entry_id, folded.entries[entry_id].content_bytes)
            return PinOutcome(False, budget.bytes, d.reason, d.blocking_id)

        def decide(folded: Fold, at: int) -> _Decision:
            if self._replayed(folded, request_id, fp) is not None:
                # a pin is recorded only when it was accepted: that was the first
                # outcome, whatever was unpinned or forgotten since
                return _Decision([], lambda f: PinOutcome(True, f.pin_budget().bytes))
            if not folded.is_live(entry_id, at):
                raise NotFound(
                    reasons.ENTRY_NOT_FOUND, f"no live entry {entry_id!r} for this agent",
                    {"id": entry_id}, field="id",
                )
            d = rules.decide_pin(folded.pin_budget(), entry_id, folded.entries[entry_id].content_bytes)
            if not d.record:
                return _Decision([], outcome)
            rec: dict[str, Any] = {"t": PIN, "id": entry_id, "at": at}
            if request_id:
                rec["rid"], rec["fp"] = request_id, fp
            return _Decision([rec], outcome)

        result: PinOutcome = await self._write(tenant, agent, decide)
        return result

    async def import_entries(
        self, tenant: str, agent: str, entries: Sequence[Entry], forgotten: Collection[str] = ()
    ) -> ImportResult:
        """Append entries verbatim (validated first: a refusal writes nothing),
        skipping ids the agent already holds. Chunks of up to 99 records, each
        one atomic transaction; a re-run is a no-op. An entry whose id is in
        `forgotten` (Audit marks it so) comes in tombstoned, its forget record
        in the same transaction: an Audit -> Import round trip never brings a
        forgotten fact back."""
        check_agent(agent)
        if len(entries) > IMPORT_MAX_ENTRIES:
            raise InvalidArgument(
                reasons.FIELD_INVALID, f"at most {IMPORT_MAX_ENTRIES} entries per Import (got {len(entries)})",
                {"limit": IMPORT_MAX_ENTRIES, "size": len(entries)}, field="entries",
            )
        cleaned: list[Entry] = []
        for i, e in enumerate(entries):
            where = f"entries[{i}]"
            if not e.id:
                raise InvalidArgument(reasons.FIELD_INVALID, f"{where}.id must not be empty", field=f"{where}.id")
            rules.check_content(e.content, f"{where}.content")
            rules.check_window(e.valid_from, e.valid_until, f"{where}.valid_until")
            if e.supersedes is not None and e.supersedes == e.id:
                raise InvalidArgument(
                    reasons.FIELD_INVALID, f"{where} supersedes itself", field=f"{where}.supersedes"
                )
            about = rules.clean_about(list(e.about))
            rules.check_about(about, f"{where}.about")
            entry = replace(
                e, about=about, position=0,
                kind=e.kind if e.kind in rules.KINDS else None,
                trust=e.trust if e.trust in rules.TRUST_LEVELS else None,
            )
            size = len(encode_record(entry_record(entry)))
            if size > rules.RECORD_MAX_BYTES:
                raise InvalidArgument(
                    reasons.RECORD_TOO_LARGE, f"{where} is {size} bytes as recorded, over {rules.RECORD_MAX_BYTES}",
                    {"limit": rules.RECORD_MAX_BYTES, "size": size}, field=f"{where}.{_grown_by(entry, imported=True)}",
                )
            cleaned.append(entry)
        imported = 0
        skipped: list[str] = []
        forgotten = frozenset(forgotten)
        for chunk in _chunks(cleaned, forgotten, self.limits.max_txn_ops - 1):  # one op checks the head record

            def decide(folded: Fold, at: int, chunk: list[Entry] = chunk) -> _Decision:
                records: list[dict[str, Any]] = []
                dup: list[str] = []
                ids: set[str] = set()
                for e in chunk:
                    if e.id in folded.entries or e.id in ids:
                        dup.append(e.id)
                        continue
                    ids.add(e.id)
                    records.append(entry_record(e))
                    if e.id in forgotten:
                        records.append({"t": FORGET, "id": e.id, "at": at})
                return _Decision(records, lambda f: (len(ids), dup))

            n, dup = await self._write(tenant, agent, decide)
            imported += n
            skipped.extend(dup)
        return ImportResult(imported, skipped)

    # -- reads ------------------------------------------------------------------------------
    def _present(self, folded: Fold, e: Entry, at: int, superseded: frozenset[str], usage: Usage | None = None) -> EntryView:
        return EntryView(
            e, rules.validity_at(e, at), e.id in folded.tombstoned, e.id in superseded, usage
        )

    async def list(
        self, tenant: str, agent: str, *, limit: int = 0, validity: str = "current",
        size: int = 0, token: str = "",
    ) -> ReadResult:
        """Bounded (`limit` > 0: newest `limit` within 16384 bytes, oldest first)
        or paged (every live entry, oldest first)."""
        if limit < 0:
            raise InvalidArgument(reasons.FIELD_INVALID, f"limit must not be negative (got {limit})", field="limit")
        if limit and token:  # the bounded read issues no tokens: none sent with it is one of its own
            raise InvalidArgument(
                reasons.PAGE_TOKEN_INVALID, "page_token pages the listing without limit; send one or the other",
                field="page_token",
            )
        per_page = page_size(self.limits, size)
        folded = await self.fold(tenant, agent)
        at = self.clock()
        view = folded.view(at)
        chrono, keys = (
            (view.current_chrono, view.current_keys) if validity == "current" else (view.live_chrono, view.live_keys)
        )
        if limit:
            picked, truncated = rules.bound_newest(chrono, min(limit, self.limits.max_page_size))
            return ReadResult([self._present(folded, e, at, view.superseded) for e in picked], truncated)
        listing = ("memory.list", agent, validity)
        start = await self._resume(tenant, listing, token, keys)
        page, more = self._cut(chrono, start, per_page)
        next_token = await self._next_token(tenant, listing, keys[start + len(page) - 1]) if more else ""
        return ReadResult([self._present(folded, e, at, view.superseded) for e in page], False, next_token)

    def _cut(self, chrono: Sequence[Entry], start: int, per_page: int) -> tuple[Sequence[Entry], bool]:
        """The page from `start`, ended early before it outgrows one response
        (entries of up to 16 KiB as recorded); and whether more follow."""
        page = chrono[start:start + per_page]
        cut = fits(map(_entry_bytes, page), self.limits.max_page_bytes)
        if cut is not None:
            return page[:cut], True
        return page, start + per_page < len(chrono)

    async def _next_token(self, tenant: str, listing: tuple[str, ...], last: tuple[int, str]) -> str:
        return await self.pages.issue(tenant, listing, json.dumps(last))

    async def _resume(self, tenant: str, listing: tuple[str, ...], token: str, keys: list[tuple[int, str]]) -> int:
        after = await self.pages.resume(tenant, listing, token)
        if after is None:
            return 0
        try:
            created, eid = json.loads(after)
            return bisect.bisect_right(keys, (int(created), str(eid)))
        except (ValueError, TypeError):
            raise InvalidArgument(
                reasons.PAGE_TOKEN_INVALID, "page_token is malformed; restart without a token", field="page_token"
            ) from None

    async def audit(self, tenant: str, agent: str, *, size: int = 0, token: str = "") -> ReadResult:
        per_page = page_size(self.limits, size)
        folded = await self.fold(tenant, agent)
        at = self.clock()
        view = folded.view(at)
        chrono = folded.all_chrono()
        keys = [rules.chronology_key(e) for e in chrono]
        listing = ("memory.audit", agent)
        start = await self._resume(tenant, listing, token, keys)
        page, more = self._cut(chrono, start, per_page)
        next_token = await self._next_token(tenant, listing, keys[start + len(page) - 1]) if more else ""
        usage = await self._read_usage(tenant, agent, [e.id for e in page])
        return ReadResult(
            [self._present(folded, e, at, view.superseded, usage.get(e.id)) for e in page], False, next_token
        )

    async def search(
        self, tenant: str, agent: str, query: str, *, limit: int = 0, strategy: str | None = None
    ) -> ReadResult:
        applied = rules.applied_strategy(strategy)
        tokens = rules.tokenize(query)
        folded = await self.fold(tenant, agent)
        if not tokens:
            return ReadResult([], False, "", applied)
        at = self.clock()
        view = folded.view(at)
        ids = folded.search_candidates(tokens)
        found = [
            folded.entries[i] for i in ids if i not in folded.tombstoned and i not in view.superseded
        ]
        found = ranking.rank(found, tokens, applied, folded)
        picked, truncated = rules.bound_in_order(found, rules.clamp_search_limit(limit))
        usage = await self._bump_usage(tenant, agent, [e.id for e in picked], at, folded)
        return ReadResult(
            [self._present(folded, e, at, view.superseded, usage.get(e.id)) for e in picked], truncated, "", applied
        )

    async def pinned(self, tenant: str, agent: str, include: str = "current") -> tuple[list[EntryView], int]:
        folded = await self.fold(tenant, agent)
        at = self.clock()
        view = folded.view(at)
        budget = folded.pin_budget()
        entries = [folded.entries[i] for i in budget.effective]
        if include != "allocated":
            entries = [e for e in entries if e.id not in view.superseded and rules.is_current(e, at)]
        return [self._present(folded, e, at, view.superseded) for e in entries], budget.bytes

    async def topics(self, tenant: str, agent: str) -> list[Topic]:
        folded = await self.fold(tenant, agent)
        return list(folded.view(self.clock()).topics)

    async def build_injection(self, tenant: str, agent: str) -> Injection:
        folded = await self.fold(tenant, agent)
        at = self.clock()
        view = folded.view(at)
        budget = folded.pin_budget()
        core = [
            folded.entries[i] for i in budget.effective
            if i not in view.superseded and rules.is_current(folded.entries[i], at)
        ]
        return rules.select_injection(core, view.topics, view.current_chrono)

    def validity_of(self, e: Entry) -> str:
        return rules.validity_at(e, self.clock())

    # -- usage (derived index) ------------------------------------------------------------
    async def _read_usage(self, tenant: str, agent: str, ids: list[str]) -> dict[str, Usage]:
        items = await asyncio.gather(*(self.storage.get(self._usage_key(tenant, agent, i)) for i in ids))
        out: dict[str, Usage] = {}
        for eid, item in zip(ids, items):
            usage = _decode_usage(item.value) if item else None
            if usage:
                out[eid] = usage
        return out

    async def _bump_usage(
        self, tenant: str, agent: str, ids: list[str], at: int, folded: Fold
    ) -> dict[str, Usage]:
        """Count one recall of each entry. Statistics only: under sustained
        contention a bump may be dropped (logged), never a memory. Only while
        the fold's head record is still stored as folded (records are never
        rewritten: it goes only with an erasure of the lane, whose entries'
        statistics must not be written behind it)."""
        if not ids:
            return {}
        keys = [self._usage_key(tenant, agent, i) for i in ids]
        lane = [Check(f"{self._lane(tenant, agent)}{folded.head:020d}", Expect(version=folded.head_version))]
        for _ in range(_USAGE_ATTEMPTS):
            items = await asyncio.gather(*(self.storage.get(k) for k in keys))
            out: dict[str, Usage] = {}
            writes = []
            for eid, key, item in zip(ids, keys, items):
                old = _decode_usage(item.value) if item else None
                new = Usage((old.recall_count if old else 0) + 1, at)
                out[eid] = new
                value = json.dumps({"n": new.recall_count, "at": new.last_recalled_at}).encode()
                writes.append(Put(key, value, Expect(version=item.version) if item else Expect(exists=False)))
            try:
                res = await self.storage.transact(lane, writes)
                if 0 in res.failed:
                    return {}  # the lane was erased since the search folded it
                applied = res.applied
            except PersistenceUncertain:
                # counted or not: the search answers without the counts (retrying could count twice)
                log.warning("memory usage bump for %d entries of unknown outcome", len(ids), exc_info=True)
                return {}
            if applied:
                return out
        log.warning("memory usage bump for %d entries dropped after contention", len(ids))
        return {}


def _decode_usage(raw: bytes) -> Usage | None:
    try:
        data = json.loads(raw)
        return Usage(int(data["n"]), int(data["at"]))
    except (ValueError, KeyError, TypeError):
        return None


def _entry_bytes(e: Entry) -> int:
    """About what an entry takes in a response: its text, about keys and metadata."""
    metadata = len(json.dumps(e.metadata)) if e.metadata else 0
    return e.content_bytes + sum(map(len, e.about)) + metadata + 2 * ENTRY_OVERHEAD


def _chunks(entries: list[Entry], forgotten: frozenset[str], records: int) -> list[list[Entry]]:
    """Consecutive runs of entries whose records (two for a forgotten entry) fit one transaction."""
    out: list[list[Entry]] = [[]]
    used = 0
    for e in entries:
        need = 2 if e.id in forgotten else 1
        if used + need > records and out[-1]:
            out.append([])
            used = 0
        out[-1].append(e)
        used += need
    return out if out[0] else []
