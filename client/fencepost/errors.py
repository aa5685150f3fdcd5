"""Typed exceptions. Every error the server returns becomes one of these, chosen
by its google.rpc.ErrorInfo reason (else by status code), keeping the status,
the server's message, the metadata and the original gRPC error as `__cause__`.
Only an ErrorInfo of fencepost's domain (`reasons.DOMAIN`) names a reason: one
from another domain (a proxy in front, say) leaves the status code's class.
User code never needs to import grpc to handle them.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import reasons as R


class FencepostError(Exception):
    """Base class of every error the SDK raises for a failed call."""

    #: gRPC status code name (e.g. "FAILED_PRECONDITION")
    code: str = "UNKNOWN"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        field_violations: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.field_violations = dict(field_violations or {})

    def __str__(self) -> str:
        return f"{self.code}/{self.reason or '-'}: {self.message}"


# -- one class per status meaning (with Google's retry guidance) --------------
class InvalidArgument(FencepostError):
    """The request is malformed or over a limit: fix it; do not retry as is."""

    code = "INVALID_ARGUMENT"


class NotFound(FencepostError):
    """The named thing does not exist (for this tenant)."""

    code = "NOT_FOUND"


class AlreadyExists(FencepostError):
    """What the call would create exists already (as something else): use or resolve it."""

    code = "ALREADY_EXISTS"


class FailedPrecondition(FencepostError):
    """The system is not in the state the call needs: do not retry until it changes."""

    code = "FAILED_PRECONDITION"


class Aborted(FencepostError):
    """Concurrency conflict: retry the whole read-modify-write."""

    code = "ABORTED"


class Unavailable(FencepostError):
    """Transient: retry with backoff (the SDK already did, within the deadline)."""

    code = "UNAVAILABLE"


class DeadlineExceeded(FencepostError):
    """The deadline passed before the call finished; its outcome may be unknown."""

    code = "DEADLINE_EXCEEDED"


class Unauthenticated(FencepostError):
    """No valid credentials were presented."""

    code = "UNAUTHENTICATED"


class PermissionDenied(FencepostError):
    """The caller's role may not do this."""

    code = "PERMISSION_DENIED"


class ResourceExhausted(FencepostError):
    """A transport or quota limit was hit (e.g. message too large)."""

    code = "RESOURCE_EXHAUSTED"


class Internal(FencepostError):
    """A server bug; report it."""

    code = "INTERNAL"


# -- one class per reason -------------------------------------------------------
class KeyInvalid(InvalidArgument): """The key is empty, contains NUL or is not UTF-8."""
class KeyTooLong(InvalidArgument): """The key is over the key limit."""
class ValueTooLarge(InvalidArgument): """The value is over the value limit."""
class TxnTooLarge(InvalidArgument): """The transaction has too many operations or bytes."""
class TxnDuplicateKey(InvalidArgument): """A transaction branch names one key twice."""
class PageTokenInvalid(InvalidArgument): """The page token was not issued for this listing."""
class PageSizeInvalid(InvalidArgument): """page_size is negative."""
class VersionInvalid(InvalidArgument): """expected_version is empty."""
class FieldInvalid(InvalidArgument): """A request field is malformed (see field_violations)."""
class RequestIdReused(InvalidArgument): """The request id was used for a different request."""
class CommitTooLarge(InvalidArgument): """A commit is over the record / consumed-id / byte limits."""
class RecordTooLarge(InvalidArgument): """A record is over its size cap."""
class EventTooLarge(InvalidArgument): """An inbox event is over the payload limit."""
class UnsupportedProtocolVersion(InvalidArgument): """The envelope's `v` is not served."""
class CallPayloadMismatch(InvalidArgument): """The envelope's `call` does not match its payload."""
class AgentNameInvalid(InvalidArgument): """The agent name is not one key segment."""
class ContentTooLarge(InvalidArgument): """Memory content is over its cap."""
class AboutTooLarge(InvalidArgument): """A memory entry's `about` is over its caps."""
class SupersedesInvalid(InvalidArgument): """`supersedes` does not name a live entry of this agent."""
class RuleUnsupported(InvalidArgument): """The reminder rule is not supported."""
class ReminderInvalid(InvalidArgument): """The reminder request is malformed."""
class MessageTooLarge(ResourceExhausted): """The request is over the server's receive limit."""
class TxnContended(Aborted): """The compared keys kept changing; retry the transaction."""
class SessionNotFound(NotFound): """No such session for this tenant."""
class EntryNotFound(NotFound): """No such memory entry for this agent."""
class ArchiveNotFound(NotFound): """No such journal archive."""
class EvalRunNotFound(NotFound): """No such eval run."""
class OperationNotFound(NotFound): """No such long-running operation for this tenant."""
class LeaseHeld(FailedPrecondition): """Another holder has the lease: walk away, its holder drains the work."""
class LeaseFenced(FailedPrecondition): """This holder lost the session: stop working on it; final."""
class SequenceMismatch(FailedPrecondition): """expected_seq is not the head: re-read the session."""
class InboxEntryGone(FailedPrecondition): """A consumed inbox id is not pending."""
class InboxNotEmpty(FailedPrecondition): """Events are pending: drain them before releasing."""
class SessionHasForks(FailedPrecondition): """The session has live forks: delete them, or ask for the descendants too."""
class ReminderIdsExhausted(FailedPrecondition): """The session's log named the largest reminder id: no new reminder fits; final."""
class ErasureInProgress(FailedPrecondition): """An erasure of the agent or tenant runs (metadata `operation`): create the session once it is done."""
class BackendUnavailable(Unavailable): """The storage backend could not be reached; retry."""
class PersistenceUncertain(Unavailable): """A write's outcome is unknown: re-read, or retry with the same request_id."""


BY_REASON: dict[str, type[FencepostError]] = {
    R.KEY_INVALID: KeyInvalid,
    R.KEY_TOO_LONG: KeyTooLong,
    R.VALUE_TOO_LARGE: ValueTooLarge,
    R.TXN_TOO_LARGE: TxnTooLarge,
    R.TXN_DUPLICATE_KEY: TxnDuplicateKey,
    R.TXN_CONTENDED: TxnContended,
    R.PAGE_TOKEN_INVALID: PageTokenInvalid,
    R.PAGE_SIZE_INVALID: PageSizeInvalid,
    R.VERSION_INVALID: VersionInvalid,
    R.FIELD_INVALID: FieldInvalid,
    R.REQUEST_ID_REUSED: RequestIdReused,
    R.BACKEND_UNAVAILABLE: BackendUnavailable,
    R.PERSISTENCE_UNCERTAIN: PersistenceUncertain,
    R.SESSION_NOT_FOUND: SessionNotFound,
    R.LEASE_HELD: LeaseHeld,
    R.LEASE_FENCED: LeaseFenced,
    R.SEQUENCE_MISMATCH: SequenceMismatch,
    R.INBOX_ENTRY_GONE: InboxEntryGone,
    R.INBOX_NOT_EMPTY: InboxNotEmpty,
    R.SESSION_HAS_FORKS: SessionHasForks,
    R.OPERATION_NOT_FOUND: OperationNotFound,
    R.ERASURE_IN_PROGRESS: ErasureInProgress,
    R.COMMIT_TOO_LARGE: CommitTooLarge,
    R.RECORD_TOO_LARGE: RecordTooLarge,
    R.EVENT_TOO_LARGE: EventTooLarge,
    R.UNSUPPORTED_PROTOCOL_VERSION: UnsupportedProtocolVersion,
    R.CALL_PAYLOAD_MISMATCH: CallPayloadMismatch,
    R.AGENT_NAME_INVALID: AgentNameInvalid,
    R.ARCHIVE_NOT_FOUND: ArchiveNotFound,
    R.CONTENT_TOO_LARGE: ContentTooLarge,
    R.ABOUT_TOO_LARGE: AboutTooLarge,
    R.SUPERSEDES_INVALID: SupersedesInvalid,
    R.ENTRY_NOT_FOUND: EntryNotFound,
    R.RULE_UNSUPPORTED: RuleUnsupported,
    R.REMINDER_INVALID: ReminderInvalid,
    R.REMINDER_IDS_EXHAUSTED: ReminderIdsExhausted,
    R.EVAL_RUN_NOT_FOUND: EvalRunNotFound,
    R.UNAUTHENTICATED: Unauthenticated,
    R.PERMISSION_DENIED: PermissionDenied,
    R.MESSAGE_TOO_LARGE: MessageTooLarge,
    R.INTERNAL: Internal,
}

BY_CODE: dict[str, type[FencepostError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Aborted, Unavailable, DeadlineExceeded,
        Unauthenticated, PermissionDenied, ResourceExhausted, Internal,
    )
}


def error_for(
    code: str,
    message: str,
    reason: str = "",
    metadata: Mapping[str, str] | None = None,
    field_violations: Mapping[str, str] | None = None,
) -> FencepostError:
    """The typed exception for a status code + ErrorInfo reason: the reason's
    class, unless the reason came under another status code (Fork's
    ALREADY_EXISTS / FIELD_INVALID), whose class it then is, so that
    `except InvalidArgument` never catches a status that is not one."""
    cls = BY_REASON.get(reason)
    if cls is None or cls.code != code:
        cls = BY_CODE.get(code, FencepostError)
    return cls(message, code=code, reason=reason, metadata=metadata, field_violations=field_violations)
