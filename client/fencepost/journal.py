"""The turn-memory record's JSON form, shared by the client SDK and the server.

A record travels as a `TurnRecord` message and is journaled as one compact JSON
object: the typed fields under their wire names, then every key of `extra`
(verbatim, in sorted key order: a Struct is a map). The 16 KiB cap is
measured on exactly that JSON, so the SDK's pre-check and the server's check
agree byte for byte:

    record_json(record_to_dict(pb))   # the journal line, as bytes

Compact JSON means `JSON.stringify` output: no spaces, non-ASCII kept as UTF-8
(not `\\u` escapes), and numbers written as JavaScript writes a double (a
Struct carries every number as one): `5` not `5.0`, `9007199254740992` not
`9007199254740992.0`, `1e-7` not `1e-07`, `1e+21`, `100000000000000000000`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from google.protobuf import struct_pb2

from .errors import RecordTooLarge
from .reasons import RECORD_TOO_LARGE
from .v1 import journal_pb2

MAX_RECORD_BYTES = 16 * 1024
PROTOCOL_VERSIONS = (1,)
MEMORY_APPEND = "memory.append"
MEMORY_READ = "memory.read"
MAX_AGENT_CHARS = 256

#: typed fields, in journal order: (wire name, proto field)
TYPED_FIELDS: tuple[tuple[str, str], ...] = (
    ("at", "at"),
    ("sessionId", "session_id"),
    ("channelId", "channel_id"),
    ("status", "status"),
    ("title", "title"),
    ("sdkAgentId", "sdk_agent_id"),
    ("userMessage", "user_message"),
    ("result", "result"),
    ("usage", "usage"),
)
WIRE_NAMES = frozenset(w for w, _ in TYPED_FIELDS)
_OPTIONAL_STRINGS = ("title", "sdk_agent_id", "user_message", "result")
_STATUS_TO_WIRE = {
    journal_pb2.TURN_STATUS_COMPLETED: "completed",
    journal_pb2.TURN_STATUS_FAILED: "failed",
}
_STATUS_FROM_WIRE = {v: k for k, v in _STATUS_TO_WIRE.items()}


def compact_json(obj: Any) -> bytes:
    """`JSON.stringify(obj)` as UTF-8 bytes."""
    if not _has_float(obj):  # the common case: the C encoder writes what JSON.stringify does
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return _js_json(obj).encode("utf-8")


def _has_float(obj: Any) -> bool:
    """Whether `obj` holds a float anywhere (a key included). Exact type
    checks first: this runs on every journal append."""
    kind = type(obj)
    if kind is str or kind is int or kind is bool or obj is None:
        return False
    if kind is float:
        return True
    if kind is dict or isinstance(obj, Mapping):
        for key, value in obj.items():
            if (type(key) is not str and _has_float(key)) or (type(value) is not str and _has_float(value)):
                return True
        return False
    if kind is list or kind is tuple or isinstance(obj, (list, tuple)):
        return any(_has_float(v) for v in obj)
    return isinstance(obj, float)


def _js_json(obj: Any) -> str:
    """Compact JSON with doubles written by `js_number` (Python's json writes
    `repr`: `1e-07`, `1e+16`, `5.0`). Only for values holding a float."""
    if isinstance(obj, str):
        return json.dumps(obj, ensure_ascii=False)
    if obj is None or isinstance(obj, bool):
        return "null" if obj is None else ("true" if obj else "false")
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        return js_number(obj)
    if isinstance(obj, Mapping):
        return "{%s}" % ",".join(f"{json.dumps(_js_key(k), ensure_ascii=False)}:{_js_json(v)}" for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return "[%s]" % ",".join(_js_json(v) for v in obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _js_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return js_number(key)
    return _js_json(key)  # int, bool, None: as json.dumps turns them into keys


def js_number(x: float) -> str:
    """JavaScript's Number::toString (ECMA-262 6.1.6.1.20), which JSON.stringify
    uses: the shortest digits that round-trip (Python's repr finds the same
    ones), plain notation for exponents -7 < n <= 21, else `d.ddde+n`."""
    if not math.isfinite(x):
        raise ValueError("Out of range float values are not JSON compliant")
    if x == 0:
        return "0"  # -0 too
    if x.is_integer() and abs(x) <= 2**53:  # exact: the integer's own digits
        return int.__repr__(int(x))
    sign = "-" if x < 0 else ""
    mantissa, _, exp = float.__repr__(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    n = len(whole) + (int(exp) if exp else 0)  # value = 0.digits * 10**n
    significant = digits.lstrip("0")
    n -= len(digits) - len(significant)
    digits = significant.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        e = n - 1
        text = f"{digits[0]}{'.' + digits[1:] if k > 1 else ''}e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + text


def record_size(record: Mapping[str, Any]) -> int:
    """Bytes of a record's compact JSON, as counted against the cap."""
    return len(compact_json(record))


def agent_name_problem(agent: str) -> str | None:
    """Why `agent` is not one store key segment, or None when it is.
    Length counts UTF-16 code units, as the seed's JavaScript schema does."""
    units = len(agent.encode("utf-16-le", "surrogatepass")) // 2
    if units < 1:
        return "agent must not be empty"
    if units > MAX_AGENT_CHARS:
        return f"agent is {units} characters, over the limit of {MAX_AGENT_CHARS}"
    if "/" in agent or "\\" in agent:
        return "agent must not contain '/' or '\\'"
    if agent in (".", ".."):
        return "agent must not be '.' or '..'"
    return None


def _plain(value: Any) -> Any:
    """A Struct value as plain JSON: integral doubles become ints."""
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) <= 2**53:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def struct_to_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    """Keys in sorted order: a Struct's map has no order of its own (a client's
    in-memory Struct and the server's parsed copy iterate differently), and
    the client's mirror and the server's journal must write the same bytes."""
    return {k: _plain(_value(s.fields[k])) for k in sorted(s.fields)}


def _value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "struct_value":
        return struct_to_dict(v.struct_value)
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    if kind == "number_value":
        return v.number_value
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    return None


def record_parts(pb: journal_pb2.TurnRecord) -> tuple[dict[str, Any], dict[str, Any]]:
    """The record's typed fields (wire names, journal order; unset optional
    fields omitted) and its `extra` object, as plain JSON values."""
    fields: dict[str, Any] = {
        "at": pb.at,
        "sessionId": pb.session_id,
        "channelId": pb.channel_id,
        "status": _STATUS_TO_WIRE.get(pb.status, ""),
    }
    for wire, field in TYPED_FIELDS[4:8]:
        if pb.HasField(field):
            fields[wire] = getattr(pb, field)
    if pb.HasField("usage"):
        fields["usage"] = struct_to_dict(pb.usage)
    return fields, struct_to_dict(pb.extra)


def merge_parts(fields: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """The journal object: typed fields first, then `extra` verbatim (a key
    shadowing a typed field is dropped here; the server refuses it first)."""
    out = dict(fields)
    for key, value in extra.items():
        out.setdefault(key, value)
    return out


def record_to_dict(pb: journal_pb2.TurnRecord) -> dict[str, Any]:
    """The record's journal form (what one journal line holds)."""
    return merge_parts(*record_parts(pb))


def record_from_dict(record: Mapping[str, Any]) -> journal_pb2.TurnRecord:
    """A `TurnRecord` from the record's JSON form (the seed's
    `TurnMemoryRecordWire`): known keys fill typed fields, every other key
    goes to `extra`. Raises ValueError for a status other than
    completed / failed or a non-object `usage`."""
    pb = journal_pb2.TurnRecord(
        at=str(record.get("at", "")),
        session_id=str(record.get("sessionId", "")),
        channel_id=str(record.get("channelId", "")),
    )
    status = record.get("status")
    if status not in _STATUS_FROM_WIRE:
        raise ValueError(f"status must be 'completed' or 'failed', not {status!r}")
    pb.status = _STATUS_FROM_WIRE[status]  # type: ignore[assignment]
    for wire, field in TYPED_FIELDS[4:8]:
        if record.get(wire) is not None:
            setattr(pb, field, str(record[wire]))
    usage = record.get("usage")
    if usage is not None:
        if not isinstance(usage, Mapping):
            raise ValueError("usage must be a JSON object")
        pb.usage.update(dict(usage))
    extra = {k: v for k, v in record.items() if k not in WIRE_NAMES}
    if extra:
        pb.extra.update(extra)
    return pb


def check_record_size(pb: journal_pb2.TurnRecord, limit: int = MAX_RECORD_BYTES) -> int:
    """The record's journal size; raises `fencepost.errors.RecordTooLarge`
    (metadata `limit`, `size`) when it is over `limit` — the SDK's pre-check."""
    size = record_size(record_to_dict(pb))
    if size > limit:
        raise RecordTooLarge(
            f"record is {size} bytes, over the limit of {limit}",
            code="INVALID_ARGUMENT", reason=RECORD_TOO_LARGE, metadata={"limit": str(limit), "size": str(size)},
        )
    return size
