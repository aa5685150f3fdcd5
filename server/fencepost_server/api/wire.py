"""Requests that do not decode, answered as a refusal instead of a crash.

grpc.aio turns an exception raised by a request deserializer into `UNKNOWN`
("Unexpected DecodeError") with no details. A caller in another language can
send bytes protobuf refuses (a string field holding invalid UTF-8, a
truncated message), so every fencepost method is registered with a tolerant
deserializer: a request that does not decode becomes an `UndecodableRequest`,
which the servicer wrapper (`base.unary` / `base.server_stream`) refuses with
`INVALID_ARGUMENT`, naming the field: `KEY_INVALID` for a KV key,
`FIELD_INVALID` for anything else.

The field is found by walking the wire format against the descriptor; the
walk only runs on the refusal path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message as pb_message
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from fencepost import reasons

from ..domain.errors import InvalidArgument

#: KvService fields that hold a caller's key (spec/kv.md: invalid UTF-8 is KEY_INVALID)
_KEY_FIELDS = {"key", "prefix", "delete_key"}
_KV_FILE = "fencepost/v1/kv.proto"


@dataclass(frozen=True, slots=True)
class UndecodableRequest:
    """Stands in for a request whose bytes protobuf refused."""

    descriptor: Descriptor
    data: bytes
    detail: str

    def error(self) -> InvalidArgument:
        where = undecodable_field(self.descriptor, self.data)
        if where is None:
            return InvalidArgument(
                reasons.FIELD_INVALID,
                f"the request is not a valid {self.descriptor.full_name} ({self.detail})",
                {"message": self.descriptor.full_name},
            )
        path, field, problem = where
        is_key = field.name in _KEY_FIELDS and field.containing_type.file.name == _KV_FILE
        reason = reasons.KEY_INVALID if is_key and problem == "is not valid UTF-8" else reasons.FIELD_INVALID
        return InvalidArgument(reason, f"{path} {problem}", {"field": path}, field=path)


def tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`Message.FromString`, except that a DecodeError yields an UndecodableRequest."""
    message_class = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    if not isinstance(descriptor, Descriptor):
        return deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except pb_message.DecodeError as exc:
            return UndecodableRequest(descriptor, bytes(data), str(exc).rpartition(": ")[2] or "undecodable")

    return deserialize


class TolerantHandler(grpc.GenericRpcHandler):
    """Wraps a generic handler so its methods deserialize tolerantly."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._wrapped: dict[str, Any] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None:
            return cached
        handler = self._inner.service(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        wrapped = handler._replace(request_deserializer=tolerant(handler.request_deserializer))
        self._wrapped[method] = wrapped
        return wrapped


def tolerant_handlers(handlers: Sequence[grpc.GenericRpcHandler]) -> tuple[grpc.GenericRpcHandler, ...]:
    return tuple(TolerantHandler(h) for h in handlers)


# -- the wire walk ------------------------------------------------------------------
class _Corrupt(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Corrupt
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


#: protobuf refuses messages nested deeper than this (upb's default decode
#: depth); the walk stops there too, instead of recursing as deep as the bytes go
MAX_DEPTH = 100


def undecodable_field(
    descriptor: Descriptor, data: bytes, prefix: str = "", depth: int = 1
) -> tuple[str, FieldDescriptor, str] | None:
    """(path, field, problem) of the first field that makes `data` undecodable
    as `descriptor`, or None when the problem is not inside a known field."""
    pos = 0
    seen: dict[int, int] = {}
    while pos < len(data):
        try:
            tag, pos = _varint(data, pos)
        except _Corrupt:
            return None
        number, wire_type = tag >> 3, tag & 7
        field = descriptor.fields_by_number.get(number)
        index = seen.get(number, 0)
        seen[number] = index + 1
        path = ""
        if field is not None:
            repeated = field.is_repeated and field.message_type is not None \
                and not field.message_type.GetOptions().map_entry
            path = f"{prefix}{field.name}[{index}]" if repeated else f"{prefix}{field.name}"
        try:
            if wire_type == 0:
                _, pos = _varint(data, pos)
            elif wire_type == 1 or wire_type == 5:
                pos += 8 if wire_type == 1 else 4
                if pos > len(data):
                    raise _Corrupt
            elif wire_type == 2:
                size, pos = _varint(data, pos)
                if pos + size > len(data):
                    raise _Corrupt
                body, pos = data[pos:pos + size], pos + size
                if field is not None and field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        body.decode("utf-8")
                    except UnicodeDecodeError:
                        return path, field, "is not valid UTF-8"
                elif field is not None and field.message_type is not None:
                    if depth >= MAX_DEPTH:
                        return path, field, f"nests messages deeper than {MAX_DEPTH} levels"
                    inner = undecodable_field(field.message_type, body, path + ".", depth + 1)
                    if inner is not None:
                        return inner
            else:
                raise _Corrupt
        except _Corrupt:
            return (path, field, "is malformed on the wire") if field is not None else None
    return None
