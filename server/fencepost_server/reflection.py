"""Server reflection over both `grpc.reflection.v1` and `grpc.reflection.v1alpha`.

grpcio-reflection serves only v1alpha; tools that speak v1 (recent grpcurl,
Postman, grpcui, ...) would get UNIMPLEMENTED. The two protocols have
identical messages under different package names, so the same servicer
serves both: v1 is registered under its own service name with the v1alpha
message classes (wire-compatible), and a v1 copy of the reflection proto is
added to the descriptor pool so reflection can also describe itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA_SERVICE = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def v1_file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """reflection.proto of v1alpha, renamed to package grpc.reflection.v1."""
    old = reflection_pb2.DESCRIPTOR.package
    fdp = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    fdp.name, fdp.package = V1_FILE, V1_PACKAGE
    fdp.ClearField("options")
    for message in fdp.message_type:
        for f in message.field:
            if f.type_name:
                f.type_name = f.type_name.replace(f".{old}.", f".{V1_PACKAGE}.")
    for service in fdp.service:
        for m in service.method:
            m.input_type = m.input_type.replace(f".{old}.", f".{V1_PACKAGE}.")
            m.output_type = m.output_type.replace(f".{old}.", f".{V1_PACKAGE}.")
    return fdp


def _ensure_v1_in_pool(pool: descriptor_pool.DescriptorPool) -> None:
    try:
        pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.Add(v1_file_descriptor())


def enable_reflection(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Serve reflection v1 and v1alpha, listing `service_names` and both
    reflection services."""
    _ensure_v1_in_pool(descriptor_pool.Default())
    servicer = reflection.aio.ReflectionServicer([*service_names, V1_SERVICE, V1ALPHA_SERVICE])
    method = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for name in (V1_SERVICE, V1ALPHA_SERVICE):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": method}),))
