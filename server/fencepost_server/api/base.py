"""What every servicer shares: the caller's identity, error mapping, metrics.

Servicer methods are wrapped by `unary` / `server_stream`, which
- resolve the caller (tenant + role) through the configured authenticator,
- turn domain and storage errors into a gRPC status with a google.rpc.ErrorInfo
  (and a BadRequest field violation when the error names a field),
- refuse a request whose bytes did not decode (see wire.py),
- record the RPC in the metrics.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from fencepost import reasons

from .. import tracing
from ..domain.errors import Code, DomainError, PermissionDenied, Unauthenticated
from ..storage import BackendUnavailable, InvalidTransaction, PersistenceUncertain, RequestRejected
from .wire import UndecodableRequest

log = logging.getLogger("fencepost.rpc")

_GRPC_CODES = {c: getattr(grpc.StatusCode, c.value) for c in Code}


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    role: str  # "service" | "operator"
    subject: str  # token name, SPIFFE id, ... (never the secret)

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


_caller: contextvars.ContextVar[Caller] = contextvars.ContextVar("fencepost_caller")


def caller() -> Caller:
    """The authenticated caller of the RPC being served."""
    return _caller.get()


def caller_or_none() -> Caller | None:
    return _caller.get(None)


def require_operator(what: str) -> Caller:
    who = caller()
    if not who.is_operator:
        raise PermissionDenied(reasons.PERMISSION_DENIED, f"{what} needs the operator role", {"role": who.role})
    return who


class Authenticator(Protocol):
    def identify(self, context: grpc.aio.ServicerContext) -> Caller:
        """The caller, or raise a DomainError (UNAUTHENTICATED)."""
        ...


class RpcObserver(Protocol):
    def rpc_done(self, method: str, code: str, reason: str, seconds: float) -> None: ...


class NullObserver:
    def rpc_done(self, method: str, code: str, reason: str, seconds: float) -> None:
        pass


#: a refusal repeats what the caller sent; bounded, so the status always fits
#: the trailers a client accepts (16 KiB by default) whatever the caller sent
_MESSAGE_CHARS = 1024
_METADATA_CHARS = 256


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def status_of(exc: BaseException) -> status_pb2.Status:
    """The google.rpc.Status for an error raised while serving."""
    if isinstance(exc, DomainError):
        code, reason, message, metadata, field = exc.code, exc.reason, exc.message, exc.metadata, exc.field
    elif isinstance(exc, PersistenceUncertain):
        code, reason, message, metadata, field = (
            Code.UNAVAILABLE, reasons.PERSISTENCE_UNCERTAIN,
            f"the write may or may not have been applied ({exc}); re-read before retrying", {}, None,
        )
    elif isinstance(exc, BackendUnavailable):
        code, reason, message, metadata, field = (
            Code.UNAVAILABLE, reasons.BACKEND_UNAVAILABLE, f"backend unavailable: {exc}", {}, None,
        )
    elif isinstance(exc, InvalidTransaction):
        # the backend's own count (keys as stored, a request id's marker) can
        # refuse what the domain's count of the request let through
        metadata = {} if exc.limit is None else {"limit": str(exc.limit), "size": str(exc.size)}
        code, reason, message, field = Code.INVALID_ARGUMENT, reasons.TXN_TOO_LARGE, str(exc), None
    elif isinstance(exc, RequestRejected):
        # the backend's words (keys included) go to the server's log, not to the caller
        code, reason, message, metadata, field = (
            Code.INTERNAL, reasons.INTERNAL,
            "internal error: the storage backend refused the request as malformed (a server bug; "
            "the server log names the request)", {}, None,
        )
    else:
        code, reason, message, metadata, field = Code.INTERNAL, reasons.INTERNAL, "internal error", {}, None
    message = _clip(message, _MESSAGE_CHARS)
    metadata = {k: _clip(v, _METADATA_CHARS) for k, v in metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=reason, domain=reasons.DOMAIN, metadata=metadata)
    details = [_pack(info)]
    if field is not None:
        violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=message)
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[violation])))
    return status_pb2.Status(code=_GRPC_CODES[code].value[0], message=message, details=details)


def _pack(msg: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(msg)
    return packed


_SERVING_ERRORS = (DomainError, BackendUnavailable, InvalidTransaction)


class ServicerBase:
    """Holds the authenticator and observer every wrapped method uses."""

    def __init__(self, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        self.auth = auth
        self.observer: RpcObserver = observer or NullObserver()

    def still_allowed(self, context: grpc.aio.ServicerContext) -> Callable[[], None]:
        """A check for a call that outlives its start (a stream, a long poll):
        after a reload of the identity files it identifies the caller again
        and raises UNAUTHENTICATED when the token was revoked or now names
        another tenant or role. Costs nothing while no reload happened."""
        who = caller()
        seen = _auth_generation(self.auth)

        def check() -> None:
            nonlocal seen
            if (now := _auth_generation(self.auth)) == seen:
                return
            seen = now
            again = self.auth.identify(context)  # raises UNAUTHENTICATED for a revoked token
            if (again.tenant, again.role) != (who.tenant, who.role):
                raise Unauthenticated(
                    reasons.UNAUTHENTICATED, "the caller's identity changed during the call; "
                    "call again with current credentials",
                )

        return check


H = TypeVar("H", bound=Callable[..., Any])


def _method_name(fn: Callable[..., Any]) -> str:
    return fn.__qualname__.replace("Servicer.", "/")


def _rpc_names(fn: Callable[..., Any]) -> tuple[str, str]:
    """("fencepost.v1.KvService", "Put") for `KvServicer.Put`."""
    cls, _, method = fn.__qualname__.rpartition(".")
    return f"fencepost.v1.{cls.removesuffix('Servicer')}Service", method


def _end_span(span: tracing.RpcSpan, outcome: tuple[str, str]) -> None:
    who = caller_or_none()
    span.end(outcome[0], outcome[1], who.tenant if who else None)


def unary(fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]) -> Any:
    name = _method_name(fn)
    service, method = _rpc_names(fn)

    @functools.wraps(fn)
    async def wrapper(self: ServicerBase, request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        outcome = _OK
        span = None if tracing.TRACER is None else tracing.RpcSpan(service, method, context.invocation_metadata())
        try:
            _caller.set(self.auth.identify(context))
            if isinstance(request, UndecodableRequest):
                raise request.error()
            return await fn(self, request, context)
        except Exception as exc:
            outcome, status = _failure(name, exc)
            await context.abort_with_status(rpc_status.to_status(status))
        except asyncio.CancelledError:
            outcome = _given_up(context)
            raise
        finally:
            self.observer.rpc_done(name, outcome[0], outcome[1], time.perf_counter() - started)
            if span is not None:
                _end_span(span, outcome)

    return wrapper


def server_stream(fn: Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[Any]]) -> Any:
    name = _method_name(fn)
    service, method = _rpc_names(fn)

    @functools.wraps(fn)
    async def wrapper(self: ServicerBase, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        started = time.perf_counter()
        outcome = _OK
        span = None if tracing.TRACER is None else tracing.RpcSpan(service, method, context.invocation_metadata())
        try:
            _caller.set(self.auth.identify(context))
            if isinstance(request, UndecodableRequest):
                raise request.error()
            # A stream may outlive its credentials (WatchInbox runs while the
            # session is held): the caller is identified again before anything
            # more is sent, so a revoked token gets nothing new.
            still_allowed = self.still_allowed(context)
            async for item in fn(self, request, context):
                still_allowed()
                yield item
        except Exception as exc:
            outcome, status = _failure(name, exc)
            await context.abort_with_status(rpc_status.to_status(status))
        except (asyncio.CancelledError, GeneratorExit):  # GeneratorExit: closed at a yield
            outcome = _given_up(context)
            raise
        finally:
            self.observer.rpc_done(name, outcome[0], outcome[1], time.perf_counter() - started)
            if span is not None:
                _end_span(span, outcome)

    return wrapper


def _auth_generation(auth: Authenticator) -> int:
    """The authenticator's reload count (0 for one that never reloads)."""
    return int(getattr(auth, "generation", 0))


_CODE_NAMES = {sc.value[0]: sc.name for sc in grpc.StatusCode}
_OK = ("OK", "")


def _given_up(context: grpc.aio.ServicerContext) -> tuple[str, str]:
    """The outcome of a handler cancelled because its call ended first: its
    deadline passed, or the caller (or the drain's grace) cancelled it. Never
    OK: nothing was answered."""
    remaining = context.time_remaining()
    return ("DEADLINE_EXCEEDED", "") if remaining is not None and remaining <= 0 else ("CANCELLED", "")


def _failure(method: str, exc: Exception) -> tuple[tuple[str, str], status_pb2.Status]:
    """The status that ends the RPC for `exc`, and (code name, reason) for metrics."""
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    if isinstance(exc, RequestRejected):
        log.error("%s failed: the backend refused a request as malformed: %s", method, exc, exc_info=exc)
    elif not isinstance(exc, _SERVING_ERRORS):
        log.exception("unhandled error in %s", method)
    status = status_of(exc)
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return (_CODE_NAMES.get(status.code, "UNKNOWN"), info.reason), status
