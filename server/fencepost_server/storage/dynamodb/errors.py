"""Classifying botocore failures and retrying the retryable ones.

Every failure is one of:
- *refused*: DynamoDB did not apply the request (throttling, a transaction
  conflict, a connection that never opened). Safe to retry.
- *ambiguous*: the request may have been applied (a 5xx, a read timeout, a
  connection lost after sending). A read is simply retried; a write is retried
  only by callers that can tell afterwards whether an earlier attempt landed,
  and otherwise ends in `PersistenceUncertain`.
- *fatal*: retrying cannot help (missing table, denied access, a malformed
  request). Reported at once.

botocore's own retries are switched off (see storage.py) so that this module
is the only place deciding, and so an ambiguous write is never silently
replayed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import ClientConnectorError
from aiohttp import ClientError as HttpClientError
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from ..base import BackendUnavailable, PersistenceUncertain, RequestRejected
from .codec import entry_label

T = TypeVar("T")
log = logging.getLogger("fencepost.dynamodb")

__all__ = ["RequestRejected"]  # re-exported: defined with the storage contract

class Failure(enum.Enum):
    REFUSED = "refused"
    AMBIGUOUS = "ambiguous"
    FATAL = "fatal"
    REJECTED = "rejected"


_REFUSED_CODES = frozenset({
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TransactionConflictException",
    "TransactionInProgressException",
    "LimitExceededException",
})
_REJECTED_CODES = frozenset({"ValidationException", "SerializationException"})


_REFUSED_CANCELLATIONS = frozenset({
    "None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded",
})


def _cancellation(exc: ClientError) -> Failure:
    """A cancelled transaction applied nothing; retry unless it was malformed.
    (Failed conditions are results and are handled before this is reached.)"""
    codes = {str(r.get("Code")) for r in exc.response.get("CancellationReasons") or []}
    if codes <= _REFUSED_CANCELLATIONS:
        return Failure.REFUSED
    if "ValidationError" in codes:
        return Failure.REJECTED
    return Failure.FATAL


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def classify(exc: BaseException) -> Failure:
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _REFUSED_CODES:
            return Failure.REFUSED
        if code == "TransactionCanceledException":
            return _cancellation(exc)
        if code in _REJECTED_CODES:
            return Failure.REJECTED
        if status >= 500 or code in ("InternalServerError", "ServiceUnavailable"):
            return Failure.AMBIGUOUS
        return Failure.FATAL  # missing table, access denied, bad credentials, ...
    if isinstance(exc, ConnectTimeoutError) or (isinstance(exc, EndpointConnectionError) and _never_sent(exc)):
        return Failure.REFUSED  # the request never left
    if isinstance(exc, (EndpointConnectionError, ReadTimeoutError, ConnectionClosedError, HTTPClientError,
                        HttpClientError, asyncio.TimeoutError, OSError)):
        return Failure.AMBIGUOUS  # read timeout, connection lost mid-request, ...
    if isinstance(exc, ParamValidationError):
        return Failure.REJECTED
    return Failure.FATAL  # no credentials, bad configuration, ...


def _never_sent(exc: EndpointConnectionError) -> bool:
    """aiobotocore reports every aiohttp connection error as an endpoint
    error, a reset after the request went out (ClientOSError) too: only a
    connection that never opened, or a name that never resolved, means the
    request was not sent."""
    error = exc.kwargs.get("error")
    return not isinstance(error, HttpClientError) or isinstance(error, ClientConnectorError)


_CREDENTIALS_REFUSED = frozenset({
    "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException",
    "AccessDeniedException", "MissingAuthenticationTokenException", "IncompleteSignatureException",
})


def cause(exc: BaseException) -> str | None:
    """What an operator should look at, for the failures that stop every call
    (credentials, endpoint, table); None for the rest."""
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "ResourceNotFoundException":
            return "table missing (fencepost dynamodb create-table, or serve --create-table)"
        if code in _CREDENTIALS_REFUSED:
            return "AWS credentials refused"
        return None
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return "AWS credentials missing (environment, profile or instance role)"
    if isinstance(exc, NoRegionError):
        return "AWS region missing (dynamodb://TABLE?region=R or AWS_DEFAULT_REGION)"
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return "endpoint unreachable"
    return None


def describe(exc: BaseException, items: Sequence[dict[str, Any]] = ()) -> str:
    """The error as DynamoDB stated it; for a cancelled transaction, also each
    item it refused (by key, when `items` are the request's entries)."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        text = f"{err.get('Code', 'error')}: {err.get('Message', '')}".rstrip(": ")
        refused = [
            f"{entry_label(items[n]) if n < len(items) else f'item {n}'}: {r.get('Code')}: {r.get('Message', '')}"
            .rstrip(": ")
            for n, r in enumerate(exc.response.get("CancellationReasons") or [])
            if str(r.get("Code")) not in _REFUSED_CANCELLATIONS and r.get("Code") != "ConditionalCheckFailed"
        ]
        if refused:
            text += " (" + "; ".join(refused) + ")"
    else:
        text = f"{type(exc).__name__}: {exc}"
    why = cause(exc)
    return f"{why} — {text}" if why else text


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with full jitter: attempt n sleeps up to base * 2**n,
    capped, and the whole call gives up after `attempts` tries."""

    attempts: int = 5
    base_delay: float = 0.025
    max_delay: float = 1.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))


class Ambiguous(Exception):
    """Raised inside an attempt when a write's outcome is unknown; carries the cause."""


async def with_retries(
    policy: RetryPolicy,
    attempt: Callable[[bool], Awaitable[T]],
    *,
    what: str,
    write: bool,
    key: str | None = None,
    items: Sequence[dict[str, Any]] = (),
) -> T:
    """Run `attempt(after_ambiguous)` until it returns or a failure is final.

    `after_ambiguous` tells the attempt that an earlier try of this same write
    may have landed, so it must resolve its own outcome (e.g. by recognising
    its own version token) or raise `Ambiguous`. Reads retry every failure but
    fatal ones. `key` / `items` (the request's key, or its transaction
    entries) only name what a refused request was about.
    """
    after_ambiguous = False
    last: BaseException | None = None
    for n in range(policy.attempts):
        if n:
            await asyncio.sleep(policy.delay(n))
        try:
            return await attempt(after_ambiguous)
        except Ambiguous as exc:
            raise PersistenceUncertain(f"{what}: {exc}") from exc.__cause__
        except Exception as exc:
            kind = classify(exc)
            if kind is Failure.REJECTED:
                raise _rejected(what, key, items, exc) from exc
            if kind is Failure.FATAL:
                if after_ambiguous:  # an earlier attempt may still have landed
                    raise PersistenceUncertain(f"{what}: outcome unknown ({describe(exc)})") from exc
                raise BackendUnavailable(f"{what}: {describe(exc)}") from exc
            if kind is Failure.AMBIGUOUS and write:
                after_ambiguous = True
            last = exc
    assert last is not None
    if after_ambiguous:
        raise PersistenceUncertain(
            f"{what}: outcome unknown after {policy.attempts} attempts ({describe(last)})"
        ) from last
    raise BackendUnavailable(f"{what}: gave up after {policy.attempts} attempts ({describe(last)})") from last


def _rejected(what: str, key: str | None, items: Sequence[dict[str, Any]], exc: BaseException) -> RequestRejected:
    """The error for a request DynamoDB refused as malformed, logged: what
    fencepost sent (operation, key or items) and what DynamoDB said."""
    subject = f" of key {key!r}" if key is not None else f" of {len(items)} items" if items else ""
    error = RequestRejected(f"{what}{subject}: {describe(exc, items)}")
    log.error("DynamoDB refused a request as malformed: %s", error)
    return error
