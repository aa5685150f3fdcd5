"""Records every (method, status code, ErrorInfo reason) a server returns.

The test suite sets `FENCEPOST_RECORD_REASONS` to a file; every server it
starts (in process, or `fencepost serve` subprocesses, which inherit the
environment) then installs `ReasonRecorder`, which appends one line per
distinct outcome. At the end of the session the suite compares the lines
with the reasons each RPC declares in the proto (`fencepost.contract`).
Unset (production), nothing is installed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

ENV = "FENCEPOST_RECORD_REASONS"
_DETAILS_KEY = "grpc-status-details-bin"


def recorder_from_env() -> ReasonRecorder | None:
    path = os.environ.get(ENV)
    return ReasonRecorder(path) if path else None


def _reason(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.trailing_metadata() or ():
        if key == _DETAILS_KEY:
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info.reason
    return ""


class ReasonRecorder(grpc.aio.ServerInterceptor):
    """Appends `method<TAB>code<TAB>reason` for each distinct failure outcome."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: set[tuple[str, str, str]] = set()

    def _record(self, method: str, context: grpc.aio.ServicerContext) -> None:
        code = context.code()
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        key = (method, name, _reason(context))
        if key in self._seen:
            return
        self._seen.add(key)
        # one write per line with O_APPEND: lines from concurrent servers never interleave
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, ("\t".join(key) + "\n").encode())
        finally:
            os.close(fd)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith("/fencepost."):
            return handler
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(method, handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._stream(method, handler.unary_stream))
        return handler

    def _unary(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:
                self._record(method, context)
                raise

        return wrapped

    def _stream(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in behavior(request, context):
                    yield item
            except grpc.aio.AbortError:
                self._record(method, context)
                raise

        return wrapped
