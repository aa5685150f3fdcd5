"""One call wrapper for every RPC: deadline, metadata, retries, typed errors."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from . import reasons
from .errors import DeadlineExceeded, FencepostError, error_for

_DETAILS_KEY = "grpc-status-details-bin"


def _trace_injector() -> Callable[[dict[str, str]], None] | None:
    """OpenTelemetry's `propagate.inject` (W3C `traceparent` by default,
    whatever OTEL_PROPAGATORS names) when opentelemetry-api is installed;
    the SDK does not require it. With no active span it adds nothing."""
    try:
        from opentelemetry import context, propagate
    except ImportError:
        return None
    current, inject = context.get_current, propagate.inject

    def inject_when_in_a_trace(carrier: dict[str, str]) -> None:
        if current():  # an empty context (no span, no baggage) has nothing to send
            inject(carrier)

    return inject_when_in_a_trace


_inject = _trace_injector()

Metadata = Sequence[tuple[str, str]] | Mapping[str, str]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries UNAVAILABLE with jittered exponential backoff, within the deadline.

    A call is retried only when that is safe: reads, and writes that carry a
    request id (the SDK fills one in), so a retried write applies once. The
    exceptions are KV `put` and `delete` without a request id: an overwrite or
    removal repeated lands the same state, so they are resent as they are
    (pass `request_id=` to have a retry report the first outcome instead).
    """

    max_attempts: int = 5
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def delays(self) -> list[float]:
        out, delay = [], self.initial_backoff
        for _ in range(self.max_attempts - 1):
            out.append(random.uniform(0, delay))  # full jitter
            delay = min(delay * self.multiplier, self.max_backoff)
        return out


NO_RETRY = RetryPolicy(max_attempts=1)
DEFAULT_RETRY = RetryPolicy()


def translate(exc: grpc.aio.AioRpcError | grpc.RpcError) -> FencepostError:
    """The SDK's typed exception for a gRPC error (keeps message and metadata)."""
    code = exc.code()
    code_name = code.name if code is not None else "UNKNOWN"
    message = exc.details() or code_name
    reason, meta, violations = "", {}, {}
    trailing = exc.trailing_metadata() or ()
    for key, value in trailing:
        if key == _DETAILS_KEY:
            try:
                status = status_pb2.Status.FromString(value)
                found = _details(status)
            except DecodeError:
                # not a google.rpc.Status (a proxy's trailer, say): the call's
                # own code and message stand, with no reason
                continue
            message = status.message or message
            reason, meta, violations = found
    if code_name == "RESOURCE_EXHAUSTED" and not reason and "message larger than max" in message.lower():
        reason = reasons.MESSAGE_TOO_LARGE
    err = error_for(code_name, message, reason, meta, violations)
    err.__cause__ = exc
    return err


def _details(status: status_pb2.Status) -> tuple[str, dict[str, str], dict[str, str]]:
    """The ErrorInfo reason and metadata and the BadRequest field violations of a Status.

    Only an ErrorInfo of fencepost's domain counts: one from another domain (a
    proxy's, another service's) whose reason happens to be one of fencepost's
    says nothing about fencepost's state, so it is read as no ErrorInfo at all."""
    reason, meta, violations = "", {}, {}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == reasons.DOMAIN:
                reason, meta = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations = {v.field: v.description for v in bad.field_violations}
    return reason, meta, violations


def _retryable(err: FencepostError, safe: bool) -> bool:
    # PERSISTENCE_UNCERTAIN included: a safe call (a read, or a write with a
    # request id) may be re-sent; anything else surfaces to the caller.
    return safe and err.code == "UNAVAILABLE"


class Caller:
    """Holds the channel-wide defaults; `call` and `stream` are used by every method."""

    def __init__(self, timeout: float | None, metadata: Metadata | None, retry: RetryPolicy) -> None:
        self.timeout = timeout
        self.metadata = list(_pairs(metadata))
        self.retry = retry

    def _metadata(self, extra: Metadata | None) -> list[tuple[str, str]] | None:
        carrier: dict[str, str] = {}
        if _inject is not None:  # OpenTelemetry installed: the caller's trace continues on the server
            _inject(carrier)
        if not extra and not carrier:  # the common case: the channel-wide list, built once
            return self.metadata or None
        # A key the call names replaces the channel-wide one: sending both
        # would let the channel's win (the server reads the first
        # `authorization`), so a per-call token would be ignored.
        own = _pairs(extra)
        named = {k.lower() for k, _ in own}
        md = [(k, v) for k, v in self.metadata if k.lower() not in named] + own
        md.extend(carrier.items())
        return md

    async def call(
        self,
        method: Callable[..., Any],
        request: Any,
        *,
        safe: bool,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        md = self._metadata(metadata)
        delays: list[float] | None = None  # the backoff schedule is drawn only once a call has failed
        attempt = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded("deadline exceeded before the call could be (re)tried")
            try:
                return await method(request, timeout=remaining, metadata=md)
            except grpc.aio.AioRpcError as exc:
                err = translate(exc)
                if delays is None:
                    delays = (retry or self.retry).delays() if safe else []
                if attempt >= len(delays) or not _retryable(err, safe):
                    raise err from exc
            delay = delays[attempt]
            attempt += 1
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise err
            await asyncio.sleep(delay)

    async def stream(
        self,
        method: Callable[..., Any],
        request: Any,
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
        retry: RetryPolicy | None = None,
    ) -> AsyncIterator[Any]:
        """Server-streaming call; errors become typed exceptions. `timeout`
        defaults to none for streams (they may be long-lived). `retry` is
        taken, as by every method, and unused: a stream is never resent
        (part of its answer may have been delivered already)."""
        call = method(request, timeout=timeout, metadata=self._metadata(metadata))
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as exc:
            raise translate(exc) from exc
        finally:
            call.cancel()


def _pairs(md: Metadata | None) -> list[tuple[str, str]]:
    if md is None:
        return []
    if isinstance(md, Mapping):
        return list(md.items())
    return list(md)


T = TypeVar("T")


async def paged(fetch: Callable[[str], Awaitable[tuple[Iterable[T], str]]]) -> AsyncIterator[T]:
    """Every item of an AIP-158 listing: `fetch(page_token)` returns one page
    and the next token; the empty token is the only end signal."""
    token = ""
    while True:
        items, token = await fetch(token)
        for item in items:
            yield item
        if not token:
            return
