"""The memory rules as pure functions of entries and an instant.

Nothing here touches storage or a clock: every function takes what it needs
(entries, `at` in epoch microseconds), so the fold, the write path and the
tests all compute the same answers from the record alone.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fencepost import reasons

from ..errors import InvalidArgument, limit_error

# -- constants (spec/memory.md) -------------------------------------------------
CONTENT_MAX_BYTES = 4096
ABOUT_MAX_KEYS = 12
ABOUT_MAX_BYTES = 512
READ_MAX_BYTES = 16384
SEARCH_DEFAULT_LIMIT = 10
SEARCH_MAX_LIMIT = 50
PINNED_MAX_BYTES = 2048
TOPICS_MAX_BYTES = 4096
RECENT_MAX_ENTRIES = 8
RECENT_MAX_BYTES = 4096
#: a lane record as stored (compact JSON); bounds what `metadata` can add
RECORD_MAX_BYTES = 16384

KINDS = ("semantic", "episodic", "procedural", "preference")
#: most to least trusted
TRUST_LEVELS = ("own", "operator", "user", "unknown", "external")
_TRUST_RANK = {t: i for i, t in enumerate(TRUST_LEVELS)}

CURRENT, NOT_YET_VALID, EXPIRED = "current", "not-yet-valid", "expired"
STRATEGIES = ("recency", "relevance", "hybrid")
SUPPORTED_STRATEGIES = STRATEGIES


@dataclass(slots=True)
class Entry:
    """One remembered fact as the record holds it. Times are epoch microseconds."""

    id: str
    content: str
    created_at: int
    kind: str | None = None
    about: tuple[str, ...] = ()
    valid_from: int | None = None
    valid_until: int | None = None
    supersedes: str | None = None
    metadata: dict[str, Any] | None = None
    session_id: str = ""
    channel: str = ""
    trust: str | None = None
    #: lane position of the entry record (0 before it is appended)
    position: int = 0
    content_bytes: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.content_bytes < 0:
            self.content_bytes = len(self.content.encode("utf-8", "surrogatepass"))

    @property
    def trust_label(self) -> str:
        """No label reads as `unknown`."""
        return self.trust if self.trust in _TRUST_RANK else "unknown"


# -- caps -----------------------------------------------------------------------
def clean_about(about: object) -> tuple[str, ...]:
    """About keys cleaned the one way every consumer reads them: trimmed,
    empties dropped, duplicates collapsed case-insensitively keeping the first
    spelling. Anything that is not a list of strings contributes nothing."""
    if not isinstance(about, (list, tuple)):
        return ()
    out: list[str] = []
    seen: set[str] = set()
    for key in about:
        if not isinstance(key, str):
            continue
        key = key.strip()
        folded = key.casefold()
        if key and folded not in seen:
            seen.add(folded)
            out.append(key)
    return tuple(out)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_content(content: str, field_name: str = "content") -> None:
    """Refuse an empty fact (content is required, and proto3 cannot tell
    empty from unset) and, never truncating, content over the per-entry cap."""
    if not content:
        raise InvalidArgument(reasons.FIELD_INVALID, f"{field_name} must not be empty", field=field_name)
    size = utf8_len(content)
    if size > CONTENT_MAX_BYTES:
        raise limit_error(reasons.CONTENT_TOO_LARGE, field_name, CONTENT_MAX_BYTES, size, field=field_name)


def check_about(about: Sequence[str], field_name: str = "about") -> None:
    """Refuse cleaned about keys over 12 keys or 512 bytes in all."""
    if len(about) > ABOUT_MAX_KEYS:
        raise InvalidArgument(
            reasons.ABOUT_TOO_LARGE,
            f"{field_name} has {len(about)} keys, over the limit of {ABOUT_MAX_KEYS}",
            {"limit": ABOUT_MAX_KEYS, "size": len(about), "unit": "keys"},
            field=field_name,
        )
    size = sum(utf8_len(k) for k in about)
    if size > ABOUT_MAX_BYTES:
        raise limit_error(reasons.ABOUT_TOO_LARGE, field_name, ABOUT_MAX_BYTES, size, field=field_name)


def check_window(valid_from: int | None, valid_until: int | None, field_name: str = "valid_until") -> None:
    """A validity window must hold an instant: an entry whose `valid_until` is
    not after its `valid_from` could never be current."""
    if valid_from is not None and valid_until is not None and valid_until <= valid_from:
        raise InvalidArgument(reasons.FIELD_INVALID, f"{field_name} must be after valid_from", field=field_name)


# -- tokenizer and matching ---------------------------------------------------------
_TOKEN = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """NFC-normalized, case-folded, split on anything that is not a Unicode
    letter or digit."""
    folded = unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())
    return _TOKEN.findall(folded)


def entry_tokens(content: str, about: Iterable[str]) -> set[str]:
    """Everything a query is matched against: content and about keys."""
    tokens = set(tokenize(content))
    for key in about:
        tokens.update(tokenize(key))
    return tokens


def query_matches(entry: Entry, query_tokens: Sequence[str]) -> bool:
    """Every query token is a whole token of the entry; no tokens match nothing."""
    if not query_tokens:
        return False
    tokens = entry_tokens(entry.content, entry.about)
    return all(t in tokens for t in query_tokens)


def clamp_search_limit(limit: int) -> int:
    if limit <= 0:
        return SEARCH_DEFAULT_LIMIT
    return min(limit, SEARCH_MAX_LIMIT)


def applied_strategy(asked: str | None) -> str:
    """A strategy this store lacks is served as recency, and reported so."""
    return asked if asked in SUPPORTED_STRATEGIES else "recency"


# -- order ------------------------------------------------------------------------------
def chronology_key(e: Entry) -> tuple[int, str]:
    """Oldest first; ties on created_at broken by id ascending."""
    return (e.created_at, e.id)


def recall_key(e: Entry) -> tuple[int, str]:
    """Newest first; ties on created_at broken by id ascending."""
    return (-e.created_at, e.id)


# -- validity and supersession -------------------------------------------------------
def validity_at(e: Entry, at: int) -> str:
    """`valid_from` inclusive, `valid_until` exclusive; missing bounds are open."""
    if e.valid_from is not None and at < e.valid_from:
        return NOT_YET_VALID
    if e.valid_until is not None and at >= e.valid_until:
        return EXPIRED
    return CURRENT


def is_current(e: Entry, at: int) -> bool:
    return validity_at(e, at) == CURRENT


def superseded_at(untombstoned: Iterable[Entry], at: int) -> set[str]:
    """Ids retired at `at`: an entry is superseded exactly while a successor of
    it is current. Pass un-tombstoned entries only, so forgetting a successor
    releases what it retired. Two successors both retire their predecessor."""
    return {e.supersedes for e in untombstoned if e.supersedes and is_current(e, at)}


# -- pins ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PinBudget:
    effective: tuple[str, ...]
    inert: tuple[str, ...]
    bytes: int


def apply_pin_budget(
    pinned_ids: Sequence[str], bytes_for: Callable[[str], int | None], max_bytes: int = PINNED_MAX_BYTES
) -> PinBudget:
    """Pins take effect in append order until the budget; the rest are recorded
    but inert. A prefix rule: once one pin overruns, nothing after it takes
    effect. `bytes_for` returns None for an entry that holds no budget
    (tombstoned or unknown). Validity is not consulted: the budget is a
    property of the record and must not move when a clock ticks."""
    effective: list[str] = []
    inert: list[str] = []
    total = 0
    for pid in pinned_ids:
        size = bytes_for(pid)
        if size is None:
            continue
        if not inert and total + size <= max_bytes:
            effective.append(pid)
            total += size
        else:
            inert.append(pid)
    return PinBudget(tuple(effective), tuple(inert), total)


def pinned_cap_refusal(held: int, wanted: int, cap: int = PINNED_MAX_BYTES) -> str:
    return (
        f"Not pinned: the pinned core holds {held} of its {cap}-byte cap and this entry is "
        f"{wanted} bytes, which would exceed the {cap}-byte cap. Pins are never evicted; "
        "unpin something first."
    )


def pinned_inert_refusal(blocking_id: str, cap: int = PINNED_MAX_BYTES) -> str:
    return (
        f"Not pinned: pin {blocking_id} is recorded but inert (it did not fit the {cap}-byte cap), "
        f"and no pin recorded after it can take effect. Unpin {blocking_id} first."
    )


@dataclass(frozen=True, slots=True)
class PinDecision:
    """What the pin write path decides: `record` says whether to append a pin."""

    pinned: bool
    record: bool
    reason: str = ""
    blocking_id: str = ""


def decide_pin(budget: PinBudget, entry_id: str, wanted: int, cap: int = PINNED_MAX_BYTES) -> PinDecision:
    """Refuse over the cap naming it, refuse behind an inert pin naming it, never
    evict; re-pinning an effective pin records nothing (it does not move)."""
    if entry_id in budget.effective:
        return PinDecision(True, False)
    if budget.inert:
        return PinDecision(False, False, pinned_inert_refusal(budget.inert[0], cap), budget.inert[0])
    if budget.bytes + wanted > cap:
        return PinDecision(False, False, pinned_cap_refusal(budget.bytes, wanted, cap))
    return PinDecision(True, True)


# -- topics and injection ------------------------------------------------------------
@dataclass(slots=True)
class Topic:
    name: str
    count: int
    last_updated_at: int
    trust: str


def least_trusted(a: str, b: str) -> str:
    return a if _TRUST_RANK.get(a, 3) >= _TRUST_RANK.get(b, 3) else b


def collect_topics(entries: Iterable[Entry]) -> list[Topic]:
    """One topic per about key (case-insensitively) over `entries`, which the
    caller passes oldest first (the first spelling names the topic). Ordered by
    count descending, then name."""
    by_key: dict[str, Topic] = {}
    for e in entries:
        for key in e.about:
            folded = key.casefold()
            topic = by_key.get(folded)
            if topic is None:
                by_key[folded] = Topic(key, 1, e.created_at, e.trust_label)
            else:
                topic.count += 1
                topic.last_updated_at = max(topic.last_updated_at, e.created_at)
                topic.trust = least_trusted(topic.trust, e.trust_label)
    return sorted(by_key.values(), key=lambda t: (-t.count, t.name))


def render_topic(t: Topic) -> str:
    return f"- {t.name} ({t.count}, trust {t.trust})\n"


@dataclass(frozen=True, slots=True)
class Injection:
    pinned: list[Entry]
    topics: list[Topic]
    recent: list[Entry]
    topics_text: str


def select_injection(
    pinned: Sequence[Entry], topics: Sequence[Topic], current_chrono: Sequence[Entry]
) -> Injection:
    """Bound the three blocks and keep them disjoint: the pinned core is never
    pushed out; topics take whole lines within their budget; the recency tail
    (newest first, skipping pinned, presented oldest first) is what shrinks."""
    core: list[Entry] = []
    used = 0
    for e in pinned:  # the budget rule already bounds it; re-check defensively
        if used + e.content_bytes > PINNED_MAX_BYTES:
            break
        core.append(e)
        used += e.content_bytes
    lines: list[str] = []
    kept: list[Topic] = []
    size = 0
    for t in topics:
        line = render_topic(t)
        n = utf8_len(line)
        if size + n > TOPICS_MAX_BYTES:
            break
        lines.append(line)
        kept.append(t)
        size += n
    pinned_ids = {e.id for e in core}
    recent: list[Entry] = []
    size = 0
    for e in sorted(current_chrono, key=recall_key):
        if e.id in pinned_ids:
            continue
        if len(recent) >= RECENT_MAX_ENTRIES or size + e.content_bytes > RECENT_MAX_BYTES:
            break
        recent.append(e)
        size += e.content_bytes
    recent.sort(key=chronology_key)
    return Injection(core, kept, recent, "".join(lines))


# -- bounded reads -------------------------------------------------------------------
def bound_newest(chrono: Sequence[Entry], limit: int, max_bytes: int = READ_MAX_BYTES) -> tuple[list[Entry], bool]:
    """The newest `limit` entries within `max_bytes` of content (picked newest
    first, ties on created_at by id ascending), presented oldest first, and
    whether more existed."""
    out: list[Entry] = []
    size = 0
    for e in sorted(chrono, key=recall_key):
        if len(out) >= limit or size + e.content_bytes > max_bytes:
            out.sort(key=chronology_key)
            return out, True
        out.append(e)
        size += e.content_bytes
    out.sort(key=chronology_key)
    return out, False


def bound_in_order(ordered: Sequence[Entry], limit: int, max_bytes: int = READ_MAX_BYTES) -> tuple[list[Entry], bool]:
    """The first `limit` entries within `max_bytes` of content, and whether more existed."""
    out: list[Entry] = []
    size = 0
    for e in ordered:
        if len(out) >= limit or size + e.content_bytes > max_bytes:
            return out, True
        out.append(e)
        size += e.content_bytes
    return out, False


# -- ids ------------------------------------------------------------------------------------
MINT_PREFIX = "mem-"
_MINTED = re.compile(r"mem-([0-9]+)")
# Any length a minted id can reach counts (an imported `mem-999999999999999999`
# puts the next ones at 19 digits and they must count too); the bound only
# keeps int() within CPython's digit limit for an id no mint could reach.
_MINTED_MAX_DIGITS = 4000


def minted_number(entry_id: str) -> int | None:
    m = _MINTED.fullmatch(entry_id)
    if m is None or len(m.group(1)) > _MINTED_MAX_DIGITS:
        return None
    return int(m.group(1))


def mint_id(next_number: int, taken: Callable[[str], bool]) -> tuple[str, int]:
    """The next server id at or after `next_number` that nobody holds, and the
    number after it."""
    n = next_number
    while taken(f"{MINT_PREFIX}{n}"):
        n += 1
    return f"{MINT_PREFIX}{n}", n + 1
