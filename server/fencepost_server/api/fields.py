"""Request fields turned into domain values, refused when a caller could send
them but no valid request holds them (protobuf decodes any bits; these say
which of them mean something): Timestamps outside years 1..9999, malformed
Durations, NaN / Infinity inside a Struct that is stored as JSON."""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import struct_pb2

from fencepost import reasons

from ..domain.errors import InvalidArgument


def timestamp_micros(msg: Any, field: str, path: str | None = None) -> int | None:
    """A request Timestamp in microseconds (None when unset), refused unless
    it is a valid Timestamp (0001-01-01 .. 9999-12-31, nanos in 0..999,999,999).
    `path` names the field in the refusal when `msg` is nested in the request."""
    if not msg.HasField(field):
        return None
    ts = getattr(msg, field)
    if not (_MIN_TS_SECONDS <= ts.seconds <= _MAX_TS_SECONDS and 0 <= ts.nanos <= 999_999_999):
        path = path or field
        raise InvalidArgument(
            reasons.FIELD_INVALID, f"{path} is not a valid timestamp (years 1 to 9999)",
            {"seconds": ts.seconds, "nanos": ts.nanos}, field=path,
        )
    return int(ts.seconds * 1_000_000 + ts.nanos // 1000)


def duration_seconds(msg: Any, field: str) -> float:
    """A request Duration in seconds (0.0 when unset), refused unless it is a
    valid Duration (|seconds| <= 315,576,000,000, nanos of the same sign)."""
    d = getattr(msg, field)
    valid = abs(d.seconds) <= _MAX_DURATION_SECONDS and abs(d.nanos) <= 999_999_999 \
        and not (d.seconds > 0 > d.nanos or d.seconds < 0 < d.nanos)
    if not valid:
        raise InvalidArgument(
            reasons.FIELD_INVALID, f"{field} is not a valid duration",
            {"seconds": d.seconds, "nanos": d.nanos}, field=field,
        )
    return float(d.seconds + d.nanos / 1e9)


def check_json_struct(struct: Any, field: str) -> None:
    """Refuse a request Struct holding NaN or +-Infinity: protobuf carries
    them, JSON (where every Struct here ends up) cannot."""
    if not _finite(struct):
        raise InvalidArgument(
            reasons.FIELD_INVALID, f"{field} holds NaN or Infinity, which JSON cannot carry", field=field
        )


def _finite(value: Any) -> bool:
    if isinstance(value, struct_pb2.Struct):
        return all(_finite(v) for v in value.fields.values())
    if isinstance(value, struct_pb2.ListValue):
        return all(_finite(v) for v in value.values)
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return math.isfinite(value.number_value)
    if kind in ("struct_value", "list_value"):
        return _finite(getattr(value, kind))
    return True


_MIN_TS_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
_MAX_TS_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z
_MAX_DURATION_SECONDS = 315_576_000_000  # 10,000 years, as google/protobuf/duration.proto
