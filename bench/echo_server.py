"""The floor: a bare grpc.aio KvService that stores nothing.

The same generated service fencepost serves (registered with the generated
`add_KvServiceServicer_to_server`), answering each request with a response of
the shape fencepost answers with, from constants: Put a 32-hex version, Get
the 200-byte value and its version, PutIfVersion `applied` and a new version.
The client drives it with the very stubs and messages it drives fencepost
with, so the two differ only by what fencepost does per call on the server.
It runs on the event loop fencepost runs on by default (uvloop when
installed) and is registered the way fencepost registers its services (as a
generic handler only), so it is the strongest floor grpc.aio offers here.

    python -m bench.echo_server PORT
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import sys
from collections.abc import Sequence

import grpc

from fencepost.v1 import kv_pb2, kv_pb2_grpc

VALUE = b"v" * 200
VERSION = "0" * 31 + "1"


class EchoKv(kv_pb2_grpc.KvServiceServicer):
    """Put / Get / PutIfVersion answered without storage (the ops the bench drives)."""

    def __init__(self) -> None:
        self._versions = itertools.count(2)

    async def Put(self, request: kv_pb2.PutRequest, context: grpc.aio.ServicerContext) -> kv_pb2.PutResponse:
        return kv_pb2.PutResponse(version=VERSION)

    async def Get(self, request: kv_pb2.GetRequest, context: grpc.aio.ServicerContext) -> kv_pb2.GetResponse:
        return kv_pb2.GetResponse(found=True, value=VALUE, version=VERSION)

    async def PutIfVersion(
        self, request: kv_pb2.PutIfVersionRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.PutIfVersionResponse:
        return kv_pb2.PutIfVersionResponse(applied=True, version=f"{next(self._versions):032x}")


class _GenericOnly:
    """Registers the generated service as a generic handler only, as
    fencepost's `app.HandlerRegistry` does (grpc.aio keeps one pending call
    request per registered method and waits on all of them per RPC)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, object]) -> None:
        pass


async def main(port: int) -> None:
    server = grpc.aio.server()
    kv_pb2_grpc.add_KvServiceServicer_to_server(EchoKv(), _GenericOnly(server))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    gc.freeze()  # as `fencepost serve` does once it serves
    await server.wait_for_termination()


def run(port: int) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main(port))
    else:
        uvloop.run(main(port))


if __name__ == "__main__":
    run(int(sys.argv[1]))
