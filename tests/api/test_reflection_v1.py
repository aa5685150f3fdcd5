"""grpcurl-style discovery over `grpc.reflection.v1` (and v1alpha alongside):
list the services, fetch the file that defines one, and read an RPC's
declared error reasons from the descriptor the server sends."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from fencepost.v1 import errors_pb2
from fencepost_server.reflection import V1_SERVICE, V1ALPHA_SERVICE, v1_file_descriptor


def _v1_messages() -> tuple[Any, Any]:
    """v1 request/response classes in a pool of their own (as a v1 client has)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(v1_file_descriptor())
    request = message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest"))
    response = message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse"))
    return request, response


async def _ask(target: str, service: str, **query: Any) -> Any:
    request_cls, response_cls = _v1_messages()
    async with grpc.aio.insecure_channel(target) as channel:
        info = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        responses = [r async for r in info(iter([request_cls(**query)]))]
    assert len(responses) == 1
    return responses[0]


async def test_v1_lists_every_service_and_both_reflection_versions(server: Any) -> None:
    for service in (V1_SERVICE, V1ALPHA_SERVICE):
        res = await _ask(server.target, service, list_services="")
        names = {s.name for s in res.list_services_response.service}
        assert {"fencepost.v1.KvService", "fencepost.v1.LedgerService", V1_SERVICE, V1ALPHA_SERVICE} <= names


async def test_v1_describes_a_service_with_its_declared_reasons(server: Any) -> None:
    res = await _ask(server.target, V1_SERVICE, file_containing_symbol="fencepost.v1.KvService")
    files = {
        fd.name: fd
        for fd in map(descriptor_pb2.FileDescriptorProto.FromString, res.file_descriptor_response.file_descriptor_proto)
    }
    kv = files["fencepost/v1/kv.proto"]
    assert "fencepost/v1/errors.proto" in kv.dependency
    txn = next(m for s in kv.service for m in s.method if m.name == "Txn")
    # the declarations travel with the descriptor: parse them with the extension known
    options = descriptor_pb2.MethodOptions.FromString(txn.options.SerializeToString())
    declared = {errors_pb2.ErrorReason.Name(v) for v in options.Extensions[errors_pb2.reasons]}
    assert {"ERROR_REASON_TXN_CONTENDED", "ERROR_REASON_REQUEST_ID_REUSED"} <= declared


async def test_v1_describes_itself(server: Any) -> None:
    res = await _ask(server.target, V1_SERVICE, file_containing_symbol=V1_SERVICE)
    (raw,) = res.file_descriptor_response.file_descriptor_proto
    fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
    assert fd.package == "grpc.reflection.v1"
    assert [m.input_type for s in fd.service for m in s.method] == [".grpc.reflection.v1.ServerReflectionRequest"]


async def test_unknown_symbol_is_an_error_response_not_a_failed_stream(server: Any) -> None:
    res = await _ask(server.target, V1_SERVICE, file_containing_symbol="no.such.Service")
    assert res.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
