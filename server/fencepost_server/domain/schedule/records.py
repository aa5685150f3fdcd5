"""The `schedule/change` stream, version 1: record encoding, the strict
decoder and the pure, incremental fold (spec/schedule.md).

A schedule record is one ledger log record holding compact JSON:

    {"record": {...}, "stream": "schedule/change"}

with `record` one of

    {"v": 1, "type": "create", "id": "rem_<n>", "kind": "after", "prompt": str,
     "after_seconds": int, "scheduled_at": int}        # unix milliseconds, UTC
    {"v": 1, "type": "delete", "id": "rem_<n>"}        # terminal
    {"v": 1, "type": "dispatch", "id": "rem_<n>"}      # terminal

Other records a runtime commits to the same log (anything that is not a JSON
object tagged `"stream": "schedule/change"`) are not ours: the fold skips
them. A record that *is* tagged but does not decode strictly (unknown
version, unknown / missing / extra field, wrong type, a reused id, a delete
or dispatch of an id that is not active) is **rejected**: it changes nothing
and is reported (`Fold.rejected`: the first MAX_REJECTED, each reason quoting
a bounded excerpt), never silently dropped.

Nothing here does I/O or reads a clock: `Fold` is a pure function of the
(seq, bytes) records it is given.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

STREAM = "schedule/change"
VERSION = 1
MAX_AFTER_SECONDS = 2**53 - 1  # the largest safe integer (JSON / JavaScript)
#: 9999-12-31T23:59:59.999Z: the last millisecond a google.protobuf.Timestamp holds
#: (and well inside what every JSON reader gets back exactly)
MAX_SCHEDULED_AT_MS = 253_402_300_799_999
ID_PREFIX = "rem_"

_ID = re.compile(r"^rem_([1-9][0-9]{0,18})$")
_ENVELOPE_KEYS = frozenset({"stream", "record"})
_KEYS = {
    "create": frozenset({"v", "type", "id", "kind", "prompt", "after_seconds", "scheduled_at"}),
    "delete": frozenset({"v", "type", "id"}),
    "dispatch": frozenset({"v", "type", "id"}),
}
_TAG = STREAM.encode()


#: the refused records a fold keeps (and a listing reports): the first ones, in
#: log order. A log may hold any number of them, each up to a record's size:
#: reported whole, they would outgrow every response (RESOURCE_EXHAUSTED on
#: each read: the session's reminders disabled by another writer's records).
MAX_REJECTED = 100
_EXCERPT_CHARS = 64  # how much of a refused value a reason quotes


def _excerpt(value: object) -> str:
    """repr(value), cut to a bounded excerpt (a refused id may be 256 KiB)."""
    text = repr(value)
    return text if len(text) <= _EXCERPT_CHARS else f"{text[:_EXCERPT_CHARS]}... ({len(text)} chars)"


class RecordError(ValueError):
    """A schedule record that does not decode (the message says why)."""


@dataclass(frozen=True, slots=True)
class Create:
    id: str
    prompt: str
    after_seconds: int
    scheduled_at_ms: int


@dataclass(frozen=True, slots=True)
class Delete:
    id: str


@dataclass(frozen=True, slots=True)
class Dispatch:
    id: str


Change = Create | Delete | Dispatch


def id_number(reminder_id: str) -> int | None:
    """n of a well-formed `rem_<n>` (n >= 1, no leading zeros); else None."""
    m = _ID.fullmatch(reminder_id) if isinstance(reminder_id, str) else None
    return int(m.group(1)) if m else None


def format_id(n: int) -> str:
    return f"{ID_PREFIX}{n}"


def is_safe_positive(value: object) -> bool:
    return type(value) is int and 1 <= value <= MAX_AFTER_SECONDS


#: what JavaScript's String.prototype.trim removes (WhiteSpace and
#: LineTerminator: the Zs spaces, TAB VT FF, U+FEFF, LF CR U+2028 U+2029).
#: "Trimmed" is the seed runtime's (TypeScript) trim: Python's str.strip also
#: removes U+001C..U+001F and U+0085 and keeps U+FEFF, so records written by
#: either would be refused by the other's decoder.
JS_WHITESPACE = (
    "\t\n\v\f\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_trim(text: str) -> str:
    return text.strip(JS_WHITESPACE)


def is_unicode(text: str) -> bool:
    """False for a str holding a lone surrogate: JSON's `\\ud800` escape decodes
    to one, and it can be neither encoded as UTF-8 nor sent as a proto string."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- encoding ---------------------------------------------------------------------
def encode(change: Change) -> bytes:
    """The log record for a change (compact, sorted keys: deterministic)."""
    if isinstance(change, Create):
        record: dict[str, object] = {
            "v": VERSION, "type": "create", "id": change.id, "kind": "after", "prompt": change.prompt,
            "after_seconds": change.after_seconds, "scheduled_at": change.scheduled_at_ms,
        }
    elif isinstance(change, Delete):
        record = {"v": VERSION, "type": "delete", "id": change.id}
    else:
        record = {"v": VERSION, "type": "dispatch", "id": change.id}
    return json.dumps({"stream": STREAM, "record": record}, separators=(",", ":"), sort_keys=True,
                      ensure_ascii=False).encode()


# -- the strict decoder -------------------------------------------------------------
def is_schedule_record(data: bytes) -> dict[str, object] | None:
    """The parsed envelope when `data` is tagged as ours, else None (skip it)."""
    # Fast path: most records are the runtime's own. Only the plain tag or a
    # JSON escape (`\/`, `\uXXXX`: the same string, as PHP's encoder and
    # ASCII-only ones write it) can spell "schedule/change"; a record with
    # neither is not ours, one with an escape is parsed to know.
    if _TAG not in data and b"\\/" not in data and b"\\u" not in data:
        return None
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: nesting deeper than the parser goes is not a record
        # we wrote either, and must not end every read of the session's schedule.
        return None
    if isinstance(obj, dict) and obj.get("stream") == STREAM:
        return obj
    return None


def decode(envelope: dict[str, object]) -> Change:
    """One tagged record, strictly: RecordError on anything but an exact
    version-1 create / delete / dispatch. (Transitions are checked by the fold.)"""
    extra = set(envelope) - _ENVELOPE_KEYS
    if extra:
        raise RecordError(f"unknown envelope field(s) {_excerpt(sorted(extra))}")
    record = envelope.get("record")
    if not isinstance(record, dict):
        raise RecordError("the envelope has no `record` object")
    v = record.get("v")
    if type(v) is not int or v != VERSION:
        raise RecordError(f"unsupported version {_excerpt(v)} (only {VERSION} is understood)")
    kind = record.get("type")
    if not isinstance(kind, str) or kind not in _KEYS:
        raise RecordError(f"unknown record type {_excerpt(kind)}")
    keys = set(record)
    if keys != _KEYS[kind]:
        missing, extra = sorted(_KEYS[kind] - keys), sorted(keys - _KEYS[kind])
        raise RecordError(f"{kind} record fields: missing {missing}, unknown {_excerpt(extra)}")
    rid = record["id"]
    if id_number(rid) is None:  # type: ignore[arg-type]
        raise RecordError(f"malformed reminder id {_excerpt(rid)}")
    assert isinstance(rid, str)
    if kind == "delete":
        return Delete(rid)
    if kind == "dispatch":
        return Dispatch(rid)
    if record["kind"] != "after":
        raise RecordError(f"unsupported rule kind {_excerpt(record['kind'])} (only 'after')")
    prompt = record["prompt"]
    # Trimmed the seed runtime's way, or the way this server trimmed before
    # (str.strip: its records hold prompts such as "\ufeffx" that must stay active).
    if not isinstance(prompt, str) or not prompt or prompt != js_trim(prompt) and prompt != prompt.strip():
        raise RecordError("prompt must be a non-empty trimmed string")
    if not is_unicode(prompt):
        raise RecordError("prompt holds a lone surrogate (a \\uD800-\\uDFFF escape): not Unicode text")
    after = record["after_seconds"]
    if not is_safe_positive(after):
        raise RecordError(f"after_seconds {_excerpt(after)} is not a positive safe integer")
    at = record["scheduled_at"]
    if type(at) is not int or not 0 <= at <= MAX_SCHEDULED_AT_MS:
        raise RecordError(f"scheduled_at {_excerpt(at)} is not an instant in 1970..9999 (unix ms)")
    assert isinstance(after, int)
    return Create(rid, prompt, after, at)


# -- the fold ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Reminder:
    """An active reminder: its create record and where it sits in the log."""

    id: str
    prompt: str
    after_seconds: int
    scheduled_at_ms: int
    seq: int

    def due(self, now_ms: int) -> bool:
        return now_ms >= self.scheduled_at_ms


@dataclass(frozen=True, slots=True)
class Rejected:
    """A tagged record the fold refused (it changed nothing)."""

    seq: int
    reason: str


@dataclass(frozen=True)
class Fold:
    """The reminders of one session after its log up to `seq`.

    `seed_length` is the session's fork point (0 for a normal session): the
    records at seq <= seed_length are the parent's. They are decoded only to
    learn the ids they used (so the child never reuses one); none of them
    makes, or ends, a reminder of this session. Immutable: `apply` returns a
    new Fold, so a cached fold can be shared and advanced safely."""

    seed_length: int = 0
    seq: int = 0
    active: dict[str, Reminder] = field(default_factory=dict)
    used: frozenset[str] = frozenset()  # every id a create of this log named (never reused)
    max_id: int = 0  # the highest id number any schedule record named
    rejected: tuple[Rejected, ...] = ()

    def next_id(self) -> str:
        return format_id(self.max_id + 1)

    def apply(self, records: list[tuple[int, bytes]]) -> Fold:
        """Fold more records (seq order, all after `self.seq`)."""
        active, used, max_id = dict(self.active), set(self.used), self.max_id
        rejected = list(self.rejected)
        seq = self.seq
        for seq, data in records:
            envelope = is_schedule_record(data)
            if envelope is None:
                continue
            inherited = seq <= self.seed_length
            try:
                rec = envelope.get("record")
                n = id_number(rec.get("id")) if isinstance(rec, dict) else None  # type: ignore[arg-type]
                if n is not None:
                    max_id = max(max_id, n)
                change = decode(envelope)
                if isinstance(change, Create):
                    if change.id in used:
                        raise RecordError(f"create reuses id {change.id}")
                    used.add(change.id)
                    if not inherited:
                        active[change.id] = Reminder(
                            change.id, change.prompt, change.after_seconds, change.scheduled_at_ms, seq
                        )
                elif inherited:
                    pass  # the parent's transitions end the parent's reminders only
                elif change.id not in active:
                    verb = "delete" if isinstance(change, Delete) else "dispatch"
                    raise RecordError(f"{verb} of {change.id}, which is not active")
                else:
                    del active[change.id]
            except RecordError as exc:
                if not inherited and len(rejected) < MAX_REJECTED:
                    rejected.append(Rejected(seq, str(exc)))
        return replace(
            self, seq=max(seq, self.seq), active=active, used=frozenset(used), max_id=max_id,
            rejected=tuple(rejected),
        )

    def reminders(self) -> list[Reminder]:
        """Active reminders in id order."""
        return sorted(self.active.values(), key=lambda r: id_number(r.id) or 0)

    def by_target(self) -> list[Reminder]:
        """Active reminders earliest target first (ties in id order)."""
        return sorted(self.active.values(), key=lambda r: (r.scheduled_at_ms, id_number(r.id) or 0))


def fold(records: list[tuple[int, bytes]], seed_length: int = 0) -> Fold:
    """The pure fold of a whole log."""
    return Fold(seed_length=seed_length).apply(records)
