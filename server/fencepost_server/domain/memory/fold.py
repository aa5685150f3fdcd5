"""The record lane's records and the fold that turns them into state.

A record is one compact JSON object. The fold applies records in lane order
and keeps what every read needs (entries, tombstones, pins, trust labels, a
token index, request ids); views that depend on the clock (supersession,
validity) are derived on demand and cached for as long as neither the lane
nor any validity boundary moves.

Records are read tolerantly: a field of the wrong shape is dropped, a record
that is not understood is skipped. The lane is the durable record; a bad
field is not worth losing a fact over.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any

from .ranking import Terms, terms_of
from .rules import (
    KINDS,
    TRUST_LEVELS,
    Entry,
    PinBudget,
    Topic,
    apply_pin_budget,
    chronology_key,
    clean_about,
    collect_topics,
    is_current,
    minted_number,
    superseded_at,
)

# record types
ENTRY, FORGET, PIN, UNPIN, TRUST = "e", "f", "p", "u", "tr"


def encode_record(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()


def decode_record(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def entry_record(e: Entry, request_id: str = "", fingerprint: str = "") -> dict[str, Any]:
    rec: dict[str, Any] = {"t": ENTRY, "id": e.id, "c": e.content, "at": e.created_at}
    if e.kind:
        rec["k"] = e.kind
    if e.about:
        rec["a"] = list(e.about)
    if e.valid_from is not None:
        rec["vf"] = e.valid_from
    if e.valid_until is not None:
        rec["vu"] = e.valid_until
    if e.supersedes:
        rec["s"] = e.supersedes
    if e.metadata:
        rec["m"] = e.metadata
    if e.session_id:
        rec["ss"] = e.session_id
    if e.channel:
        rec["ch"] = e.channel
    if e.trust:
        rec["tr"] = e.trust
    if request_id:
        rec["rid"], rec["fp"] = request_id, fingerprint
    return rec


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: object) -> str:
    return v if isinstance(v, str) else ""


def entry_from_record(rec: dict[str, Any], position: int) -> Entry | None:
    """The entry a record holds, optional fields validated; None when a required
    field is missing."""
    eid, content, at = rec.get("id"), rec.get("c"), _int(rec.get("at"))
    if not isinstance(eid, str) or not eid or not isinstance(content, str) or at is None:
        return None
    kind = rec.get("k")
    trust = rec.get("tr")
    meta = rec.get("m")
    return Entry(
        id=eid,
        content=content,
        created_at=at,
        kind=kind if kind in KINDS else None,
        about=clean_about(rec.get("a")),
        valid_from=_int(rec.get("vf")),
        valid_until=_int(rec.get("vu")),
        supersedes=_str(rec.get("s")) or None,
        metadata=meta if isinstance(meta, dict) else None,
        session_id=_str(rec.get("ss")),
        channel=_str(rec.get("ch")),
        trust=trust if trust in TRUST_LEVELS else None,
        position=position,
    )


@dataclass(frozen=True, slots=True)
class View:
    """What is live at an instant. Valid while the lane head is `head` and the
    instant stays within [lo, hi) (no validity boundary crossed)."""

    head: int
    lo: int
    hi: int
    superseded: frozenset[str]
    live_chrono: list[Entry]  # live, any validity, oldest first
    live_keys: list[tuple[int, str]]
    current_chrono: list[Entry]  # live and true now, oldest first
    current_keys: list[tuple[int, str]]
    topics: list[Topic]

    @property
    def live_ids(self) -> set[str]:
        return {e.id for e in self.live_chrono}


_NEG, _POS = -(2**63), 2**63


class Fold:
    """One agent's lane, folded. `apply` is synchronous and idempotent by
    position, so concurrent catch-ups in one process cannot double-apply."""

    def __init__(self) -> None:
        self.head = 0
        #: the version of the record at `head`, as the store last gave it (how a
        #: catch-up tells the lane it folded from one erased and refilled: a
        #: key written again never gets an old version back, while its bytes
        #: may repeat, as an import's record does); a write lands only while
        #: that record is still stored at it, so one racing an erasure fails
        self.head_version = ""
        self.entries: dict[str, Entry] = {}
        self.tombstoned: set[str] = set()
        self.pins: dict[str, None] = {}  # pin order
        self.index: dict[str, set[str]] = {}
        self._terms: dict[str, Terms] = {}  # search ranking statistics (ranking.py)
        self._token_total = 0
        self.next_mint = 1
        #: request id -> (fingerprint, entry id) of the record that carried it
        self.requests: dict[str, tuple[str, str]] = {}
        self._boundaries: list[int] = []
        self._chrono: list[Entry] | None = None
        self._view: View | None = None
        self._budget: tuple[int, PinBudget] | None = None
        self._all: tuple[int, list[Entry]] | None = None

    # -- applying records ----------------------------------------------------------
    def apply(self, position: int, rec: dict[str, Any] | None) -> None:
        if position <= self.head:
            return
        self.head = position
        if rec is None:
            return
        kind = rec.get("t")
        eid = rec.get("id")
        if not isinstance(eid, str):
            return
        rid = rec.get("rid")
        if isinstance(rid, str) and rid:
            self.requests[rid] = (_str(rec.get("fp")), eid)
        if kind == ENTRY:
            entry = entry_from_record(rec, position)
            if entry is None or entry.id in self.entries:
                return  # an id is held once; a later duplicate is ignored
            self._add(entry)
        elif eid not in self.entries:
            return
        elif kind == FORGET:
            self.tombstoned.add(eid)
            self._chrono = None
        elif kind == PIN:
            self.pins.setdefault(eid, None)  # re-pin does not move
        elif kind == UNPIN:
            self.pins.pop(eid, None)
        elif kind == TRUST:
            trust = rec.get("tr")
            if trust in TRUST_LEVELS:
                self.entries[eid].trust = trust

    def _add(self, e: Entry) -> None:
        self.entries[e.id] = e
        terms = terms_of(e)
        self._terms[e.id] = terms
        self._token_total += terms.length
        for token in terms.counts:
            self.index.setdefault(token, set()).add(e.id)
        # minting skips past every id the lane names: held ones, and the ones an
        # (imported) successor supersedes, which a fresh entry must not take:
        # it would be retired at birth
        for named in (e.id, e.supersedes):
            n = minted_number(named) if named else None
            if n is not None and n >= self.next_mint:
                self.next_mint = n + 1
        for bound in (e.valid_from, e.valid_until):
            if bound is not None:
                i = bisect.bisect_left(self._boundaries, bound)
                if i == len(self._boundaries) or self._boundaries[i] != bound:
                    self._boundaries.insert(i, bound)
        if self._chrono is not None:
            if not self._chrono or chronology_key(self._chrono[-1]) <= chronology_key(e):
                self._chrono.append(e)
            else:
                self._chrono = None

    # -- derived ------------------------------------------------------------------------
    def untombstoned_chrono(self) -> list[Entry]:
        """Every un-tombstoned entry, oldest first (cached by the lane)."""
        if self._chrono is None:
            self._chrono = sorted(
                (e for e in self.entries.values() if e.id not in self.tombstoned), key=chronology_key
            )
        return self._chrono

    def all_chrono(self) -> list[Entry]:
        """Every entry, tombstoned included, oldest first (cached by the lane)."""
        if self._all is None or self._all[0] != self.head:
            self._all = (self.head, sorted(self.entries.values(), key=chronology_key))
        return self._all[1]

    def view(self, at: int) -> View:
        v = self._view
        if v is not None and v.head == self.head and v.lo <= at < v.hi:
            return v
        i = bisect.bisect_right(self._boundaries, at)
        lo = self._boundaries[i - 1] if i > 0 else _NEG
        hi = self._boundaries[i] if i < len(self._boundaries) else _POS
        base = self.untombstoned_chrono()
        superseded = superseded_at(base, at)
        live = [e for e in base if e.id not in superseded] if superseded else list(base)
        current = [e for e in live if is_current(e, at)] if self._boundaries else live
        v = View(
            head=self.head, lo=lo, hi=hi, superseded=frozenset(superseded),
            live_chrono=live, live_keys=[chronology_key(e) for e in live],
            current_chrono=current, current_keys=[chronology_key(e) for e in current],
            topics=collect_topics(current),
        )
        self._view = v
        return v

    def pin_budget(self) -> PinBudget:
        cached = self._budget
        if cached is not None and cached[0] == self.head:
            return cached[1]
        budget = apply_pin_budget(list(self.pins), self._pin_bytes)
        self._budget = (self.head, budget)
        return budget

    def _pin_bytes(self, eid: str) -> int | None:
        e = self.entries.get(eid)
        if e is None or eid in self.tombstoned:
            return None
        return e.content_bytes

    def is_live(self, eid: str, at: int) -> bool:
        return eid in self.entries and eid not in self.tombstoned and eid not in self.view(at).superseded

    # -- ranking statistics (ranking.Corpus) ---------------------------------------
    def terms(self, entry_id: str) -> Terms:
        return self._terms[entry_id]

    def doc_freq(self, token: str) -> int:
        return len(self.index.get(token, ()))

    def size(self) -> int:
        return len(self.entries)

    def average_length(self) -> float:
        return self._token_total / len(self.entries) if self.entries else 0.0

    def search_candidates(self, tokens: list[str]) -> set[str]:
        """Ids whose content or about holds every token (before liveness)."""
        if not tokens:
            return set()
        sets = sorted((self.index.get(t, set()) for t in set(tokens)), key=len)
        out = set(sets[0])
        for s in sets[1:]:
            out &= s
            if not out:
                break
        return out
