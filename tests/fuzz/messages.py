"""Request bytes for every fencepost RPC, drawn from the proto descriptors.

`request_bytes(method, pools)` is a hypothesis strategy for the raw bytes of
one request: a message built field by field from the descriptor with edge
values (0, -1, +-2^31, +-2^63, empty / NUL / 1 MiB / RTL / combining
strings, JSON-carrying bytes with lone-surrogate escapes, huge repeated
fields, negative and far-future timestamps and durations), serialized, then
maybe corrupted on the wire (invalid UTF-8 inside string fields, bit flips,
truncation). `pools` holds names that exist on the server under test
(a session id, a generation, ...), so calls reach past the first check.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from hypothesis import strategies as st

from fencepost.v1 import (
    evals_pb2,
    journal_pb2,
    kv_pb2,
    ledger_pb2,
    memory_pb2,
    schedule_pb2,
    store_api_pb2,
)

T = TypeVar("T")

#: AdminService is not fuzzed yet: its erasures run in the background after the
#: call returns, which the "a refusal writes nothing" snapshot cannot tell apart
#: from a refused call writing (and EraseTenant wipes the seeded names).
SERVICE_MODULES = (kv_pb2, ledger_pb2, journal_pb2, store_api_pb2, memory_pb2, schedule_pb2, evals_pb2)

#: RPCs that may wait for something to happen (the client's deadline ends them)
WAITING = {"WatchInbox", "WatchDue", "ClaimOrphan"}

MIB = 1 << 20
INT32 = [0, -1, 1, 2**31 - 1, -(2**31), 7, 100, 1000, 1001]
INT64 = INT32 + [2**63 - 1, -(2**63), 2**53 - 1, 2**53 + 1, 2**32]
UINT32 = [0, 1, 2**32 - 1]
UINT64 = UINT32 + [2**64 - 1, 2**63]
FLOATS = [0.0, -1.0, 1e308, -1e308, float("nan"), float("inf"), float("-inf"), 5e-324]
SECONDS = [0, -1, 1, -62135596801, 253402300800, 2**63 - 1, -(2**63), 315576000001, 2**53 - 1]
NANOS = [0, -1, 1, 999_999_999, 10**9, 2**31 - 1, -(2**31)]
STRINGS = [
    "", "\x00", "a\x00b", " ", " padded ", "x" * 257, "\u202eevil\u202c", "שלום", "e\u0301\u0301",
    "\U0001f600", "\ufeffbom", "../", "a/b", "rem_1", "rem_0", "rem_99999999999999999999", "%2F", "#/req",
    "completed", "failed", "memory.append", "memory.read", "recency", "relevance", "operator",
]
HUGE_STRING = "y" * MIB
#: placeholder swapped for invalid UTF-8 of the same length after serializing
BAD_UTF8_MARK = "\x01BAD-UTF8\x01"
BAD_UTF8_BYTES = b"\xed\xa0\x80\xff\xfe\xc0\xaf\x80\x80\xf8\xf5"[: len(BAD_UTF8_MARK.encode())]
_SCHEDULE_RECORDS = [
    b'{"record":{"v":1,"type":"create","id":"rem_%d","kind":"after","prompt":"\\ud800x",'
    b'"after_seconds":5,"scheduled_at":1},"stream":"schedule/change"}',
    b'{"record":{"v":1,"type":"create","id":"rem_%d","kind":"after","prompt":"p\\udfff",'
    b'"after_seconds":5,"scheduled_at":1},"stream":"schedule/change"}',
    b'{"record":{"v":1,"type":"create","id":"rem_%d","kind":"after","prompt":"late",'
    b'"after_seconds":5,"scheduled_at":253402300800000},"stream":"schedule/change"}',
    b'{"record":{"v":1,"type":"create","id":"rem_%d","kind":"after","prompt":"huge",'
    b'"after_seconds":9007199254740991,"scheduled_at":9223372036854775807},"stream":"schedule/change"}',
    b'{"record":{"v":1,"type":"create","id":"rem_%d","kind":"after","prompt":"soon",'
    b'"after_seconds":1,"scheduled_at":0},"stream":"schedule/change"}',
    b'{"record":{"v":1,"type":"dispatch","id":"rem_%d"},"stream":"schedule/change"}',
]
BYTES = [b"", b"\x00", b"\xff\xfe", b"{}", b'"\\ud800x"', b'{"a":"\\ud800"}', b"\xed\xa0\x80", b"[1e999]", b"NaN"]

_WELL_KNOWN = {"google.protobuf.Timestamp", "google.protobuf.Duration"}
_MAX_DEPTH = 4


@dataclass(frozen=True)
class Rpc:
    service: str
    name: str
    path: str
    input: Descriptor
    streaming: bool

    @property
    def message_class(self) -> type:
        return message_factory.GetMessageClass(self.input)


def all_rpcs() -> list[Rpc]:
    out: list[Rpc] = []
    for module in SERVICE_MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out.append(_rpc(service.full_name, m))
    return out


def _rpc(service: str, m: MethodDescriptor) -> Rpc:
    return Rpc(service, m.name, f"/{service}/{m.name}", m.input_type, m.server_streaming)


# -- values ---------------------------------------------------------------------
def _strings(name: str, pools: Mapping[str, Sequence[str]]) -> st.SearchStrategy[str]:
    hostile = _rare(st.just(HUGE_STRING), st.one_of(
        st.sampled_from(STRINGS), st.sampled_from(STRINGS), st.text(max_size=12), st.text(max_size=12),
        st.just(BAD_UTF8_MARK),
    ))
    pool = pools.get(name)
    if not pool:
        return hostile
    # about half the time a name that exists, so the call gets past the first check
    return st.one_of(st.sampled_from(list(pool)), hostile)


def _rare(huge: st.SearchStrategy[T], usual: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """`huge` one time in 40: 1 MiB values are about size, not variety (and cost)."""
    return st.one_of(huge, *[usual] * 39)


def _bytes() -> st.SearchStrategy[bytes]:
    schedule = st.tuples(st.sampled_from(_SCHEDULE_RECORDS), st.integers(1, 4)).map(lambda t: t[0] % t[1])
    return _rare(st.just(b"z" * MIB), st.one_of(
        st.sampled_from(BYTES), schedule, schedule, st.binary(max_size=24), st.binary(max_size=24),
    ))


def _ints(field: FieldDescriptor, pools: Mapping[str, Sequence[int]]) -> st.SearchStrategy[int]:
    t = field.type
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        edges, lo, hi = UINT32, 0, 2**32 - 1
    elif t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        edges, lo, hi = UINT64, 0, 2**64 - 1
    elif t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        edges, lo, hi = INT32, -(2**31), 2**31 - 1
    else:
        edges, lo, hi = INT64, -(2**63), 2**63 - 1
    options = [st.sampled_from(edges), st.integers(-3, 200)]
    pool = [v for v in pools.get(field.name, ()) if lo <= v <= hi]
    if pool:
        options.insert(0, st.sampled_from(pool))
    return st.one_of(*options).filter(lambda v: lo <= v <= hi)


def _plausible(field: FieldDescriptor, pools: Mapping[str, Sequence[object]]) -> st.SearchStrategy[object]:
    """A value a well-behaved caller might send: a name that exists when there is one."""
    if field.name == "page_token":
        return st.just("")
    if field.name == "request_id":  # mostly fresh; sometimes one already used
        return st.one_of(st.uuids().map(str), st.uuids().map(str), st.sampled_from(list(pools.get(field.name, ["r"]))))
    pool = pools.get(field.name)
    if pool:
        return st.sampled_from(list(pool))
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.text(alphabet="abcdefghij", min_size=1, max_size=8)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.just(b"{}"), st.binary(max_size=16))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(0, 1)
    if t == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    return st.integers(0, 5)


def _scalar(
    field: FieldDescriptor, pools: Mapping[str, Sequence[object]], hostile: bool = True
) -> st.SearchStrategy[object]:
    if not hostile:
        return _plausible(field, pools)
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return _strings(field.name, pools)  # type: ignore[arg-type]
    if t == FieldDescriptor.TYPE_BYTES:
        pool = pools.get(field.name)
        return st.one_of(st.sampled_from(list(pool)), _bytes()) if pool else _bytes()
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.sampled_from(FLOATS), st.floats(allow_nan=False, width=32))
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from(known + [-1, 99, 2**31 - 1])
    return _ints(field, pools)  # type: ignore[arg-type]


@st.composite
def _message(
    draw: st.DrawFn, desc: Descriptor, pools: Mapping[str, Sequence[object]], depth: int = 0, hostile: bool = True
) -> object:
    """A message of `desc`: edge values everywhere (`hostile`), or values a
    well-behaved caller might send (so calls reach past validation)."""
    msg = message_factory.GetMessageClass(desc)()
    if desc.full_name in _WELL_KNOWN:
        if hostile:
            msg.seconds = draw(st.sampled_from(SECONDS) | st.integers(-5, 10**6))
            msg.nanos = draw(st.sampled_from(NANOS))
        else:
            recent = st.integers(1_600_000_000, 1_900_000_000)  # 2020 .. 2030
            msg.seconds = draw(st.integers(0, 60) if desc.name == "Duration" else recent)
        return msg
    # one member of each oneof (setting every member would leave only the last)
    chosen = {o.name: draw(st.sampled_from([f.name for f in o.fields])) for o in desc.oneofs if len(o.fields) > 1}
    for field in desc.fields:
        oneof = field.containing_oneof
        if oneof is not None and oneof.name in chosen and chosen[oneof.name] != field.name:
            continue
        named = not hostile and field.name in pools  # a plausible call names what exists
        if depth >= _MAX_DEPTH or (not named and draw(st.integers(0, 3)) == 0):  # set 3 times in 4
            continue
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if field.is_repeated:
            count = draw(st.sampled_from([0, 1, 1, 2, 3, 65, 101, 1001] if hostile else [0, 1, 2]))
            if field.message_type is not None and count > 3:
                count = min(count, 101)  # enough to cross every per-message cap, small enough to build
            if is_map:
                entry = field.message_type.fields_by_name
                key_f, value_f = entry["key"], entry["value"]
                for _ in range(count):
                    key = draw(_scalar(key_f, pools, hostile))
                    if value_f.message_type is not None:
                        value = draw(_message(value_f.message_type, pools, depth + 1, hostile))
                        getattr(msg, field.name)[key].CopyFrom(value)
                    else:
                        getattr(msg, field.name)[key] = draw(_scalar(value_f, pools, hostile))
                continue
            target = getattr(msg, field.name)
            # Past 3 items the first repeats (huge fields are about the count, not the variety).
            item = _message(field.message_type, pools, depth + 1, hostile) if field.message_type is not None \
                else _scalar(field, pools, hostile)
            first = draw(item)
            size = first.ByteSize() if field.message_type is not None else (  # type: ignore[attr-defined]
                len(first) if isinstance(first, (str, bytes)) else 8)
            count = _bounded(count, size)
            target.extend([first] * count if count > 3 else [first] + [draw(item) for _ in range(count - 1)])
            if count == 0:
                del target[:]
            continue
        if field.message_type is not None:
            getattr(msg, field.name).CopyFrom(draw(_message(field.message_type, pools, depth + 1, hostile)))
        else:
            setattr(msg, field.name, draw(_scalar(field, pools, hostile)))
    return msg


def _bounded(count: int, item_size: int) -> int:
    """Huge items repeat just past the server's 8 MiB receive limit, not beyond."""
    return min(count, 9) if item_size > 64 * 1024 else count


# -- the wire -----------------------------------------------------------------------
def serialize(msg: object) -> bytes:
    data: bytes = msg.SerializeToString()  # type: ignore[attr-defined]
    return data.replace(BAD_UTF8_MARK.encode(), BAD_UTF8_BYTES)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """`data` with bit flips, a truncation, appended garbage or invalid UTF-8
    spliced in (cheap: a drawn request is sent again as a few mutants)."""
    if not data:
        return rng.randbytes(rng.randint(0, 16))
    kind = rng.choice(["flip", "flip", "truncate", "append", "splice"])
    buf = bytearray(data)
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del buf[rng.randrange(len(buf)):]
    elif kind == "append":
        buf += rng.randbytes(rng.randint(1, 8))
    else:
        i = rng.randint(0, len(buf))
        buf[i:i] = BAD_UTF8_BYTES[: rng.randint(1, 4)]
    return bytes(buf)


@st.composite
def _mutated(draw: st.DrawFn, data: bytes) -> bytes:
    return mutate(data, random.Random(draw(st.integers(0, 2**32))))


def request_bytes(rpc: Rpc, pools: Mapping[str, Sequence[object]]) -> st.SearchStrategy[tuple[bytes, str]]:
    """(request bytes, how they were made: "plausible", "hostile" or "mutated")."""
    base = _message(rpc.input, pools).map(serialize)
    plausible = _message(rpc.input, pools, hostile=False).map(lambda m: (serialize(m), "plausible"))
    hostile = base.map(lambda b: (b, "hostile"))
    mutated = st.one_of(base, plausible.map(lambda t: t[0])).flatmap(lambda b: _mutated(b)).map(
        lambda b: (b, "mutated"))
    return st.one_of(plausible, hostile, hostile, mutated)
