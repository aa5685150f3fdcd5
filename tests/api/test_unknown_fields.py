"""Evolution contract: a "newer client" may send fields this server does not
know; they are accepted and ignored, never rejected (DESIGN.md "Evolution")."""

from __future__ import annotations

import grpc
from google.protobuf.unknown_fields import UnknownFieldSet

from fencepost.v1 import evals_pb2, kv_pb2
from tests.conftest import RunningServer


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _unknown_fields() -> bytes:
    """Fields 99 (bytes), 100 (varint) and 101 (fixed64) that no v1 message declares."""
    text = b"from a newer client"
    return (
        _varint(99 << 3 | 2) + _varint(len(text)) + text
        + _varint(100 << 3 | 0) + _varint(2**40)
        + _varint(101 << 3 | 1) + (7).to_bytes(8, "little")
    )


async def _raw(server: RunningServer, method: str, body: bytes) -> bytes:
    async with grpc.aio.insecure_channel(server.target) as channel:
        call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return await call(body, timeout=10.0)


async def test_unknown_fields_are_accepted_and_ignored(server: RunningServer) -> None:
    put = kv_pb2.PutRequest(key="newer-client", value=b"v1").SerializeToString() + _unknown_fields()
    # The request really carries fields a v1 message does not declare.
    parsed = kv_pb2.PutRequest.FromString(put)
    assert parsed.key == "newer-client"
    assert sorted(f.field_number for f in UnknownFieldSet(parsed)) == [99, 100, 101]

    version = kv_pb2.PutResponse.FromString(await _raw(server, "/fencepost.v1.KvService/Put", put)).version
    assert version

    get = kv_pb2.GetRequest(key="newer-client").SerializeToString() + _unknown_fields()
    got = kv_pb2.GetResponse.FromString(await _raw(server, "/fencepost.v1.KvService/Get", get))
    assert (got.found, got.value, got.version) == (True, b"v1", version)


async def test_unknown_fields_on_an_eval_request(server: RunningServer) -> None:
    req = evals_pb2.PutAbSnapshotRequest(agent="a")
    req.snapshot.update({"k": "v"})
    await _raw(server, "/fencepost.v1.EvalService/PutAbSnapshot", req.SerializeToString() + _unknown_fields())
    get = evals_pb2.GetAbSnapshotRequest(agent="a").SerializeToString() + _unknown_fields()
    res = evals_pb2.GetAbSnapshotResponse.FromString(await _raw(server, "/fencepost.v1.EvalService/GetAbSnapshot", get))
    assert res.found and dict(res.snapshot) == {"k": "v"}
