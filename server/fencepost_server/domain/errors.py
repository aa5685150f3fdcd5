"""Typed domain errors. The api layer maps each `Code` to a gRPC status and the
reason + metadata to a google.rpc.ErrorInfo; the domain never imports grpc."""

from __future__ import annotations

import enum
from collections.abc import Mapping

from fencepost import reasons


class Code(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    INTERNAL = "INTERNAL"


class DomainError(Exception):
    """An error with a stable reason. `field` names the offending request field
    (reported as a BadRequest field violation)."""

    code = Code.INTERNAL

    def __init__(
        self,
        reason: str,
        message: str,
        metadata: Mapping[str, object] | None = None,
        *,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = {k: str(v) for k, v in (metadata or {}).items()}
        self.field = field


class InvalidArgument(DomainError):
    code = Code.INVALID_ARGUMENT


class NotFound(DomainError):
    code = Code.NOT_FOUND


class FailedPrecondition(DomainError):
    code = Code.FAILED_PRECONDITION


class Aborted(DomainError):
    code = Code.ABORTED


class Unavailable(DomainError):
    code = Code.UNAVAILABLE


class Unauthenticated(DomainError):
    code = Code.UNAUTHENTICATED


class PermissionDenied(DomainError):
    code = Code.PERMISSION_DENIED


def limit_error(reason: str, what: str, limit: int, size: int, *, field: str | None = None) -> InvalidArgument:
    """The error for anything over a limit: names the limit and the size seen."""
    return InvalidArgument(
        reason,
        f"{what} is {size} bytes, over the limit of {limit}",
        {"limit": limit, "size": size},
        field=field,
    )


def backend_unavailable(detail: str) -> Unavailable:
    return Unavailable(reasons.BACKEND_UNAVAILABLE, f"backend unavailable: {detail}")


def persistence_uncertain(detail: str) -> Unavailable:
    return Unavailable(
        reasons.PERSISTENCE_UNCERTAIN,
        f"the write may or may not have been applied: {detail}; re-read before retrying",
    )
