// Typed errors: every failed call becomes a FencepostError built from the
// google.rpc.Status in the `grpc-status-details-bin` trailer, with the
// ErrorInfo reason as the generated ErrorReason enum (the same reasons, and
// the same rules, as the Python SDK's fencepost.errors).
import { Metadata, ServiceError, status } from "@grpc/grpc-js";

import { ErrorReason, errorReasonFromJSON, errorReasonToJSON } from "./gen/fencepost/v1/errors";
import { BadRequest, ErrorInfo } from "./gen/google/rpc/error_details";
import { Status } from "./gen/google/rpc/status";

export { ErrorReason };

/** The ErrorInfo domain of every fencepost error. */
export const DOMAIN = "fencepost.dev";
const PREFIX = "ERROR_REASON_";
const DETAILS_KEY = "grpc-status-details-bin";

/** The enum value of a reason string ("LEASE_FENCED" -> ErrorReason.LEASE_FENCED);
 * UNRECOGNIZED for a reason newer than this client, UNSPECIFIED for none. */
export function reasonFromString(reason: string): ErrorReason {
  return reason ? errorReasonFromJSON(PREFIX + reason) : ErrorReason.UNSPECIFIED;
}

/** The reason string of an enum value (ErrorReason.LEASE_FENCED -> "LEASE_FENCED"). */
export function reasonToString(reason: ErrorReason): string {
  const name = errorReasonToJSON(reason);
  return name.startsWith(PREFIX) ? name.slice(PREFIX.length) : name;
}

export interface ErrorFields {
  code: status;
  message: string;
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  fieldViolations?: Record<string, string>;
}

/** A failed fencepost call. `reason` is the enum, `reasonString` what the server sent.
 * `errorFor` / `fromServiceError` build the reason's subclass (`LeaseFencedError`, ...). */
export class FencepostError extends Error {
  /** The status code of the class's errors (none for FencepostError itself). */
  static readonly statusCode: status | undefined = undefined;
  /** gRPC status code. */
  readonly code: status;
  /** Its name, e.g. "FAILED_PRECONDITION". */
  readonly codeName: string;
  readonly reason: ErrorReason;
  readonly reasonString: string;
  readonly domain: string;
  /** ErrorInfo metadata (e.g. `generation`, `current_generation` for LEASE_FENCED). */
  readonly metadata: Readonly<Record<string, string>>;
  /** BadRequest field violations: field -> description. */
  readonly fieldViolations: Readonly<Record<string, string>>;
  /** The server's message. */
  readonly detail: string;

  constructor(fields: ErrorFields, options?: { cause?: unknown }) {
    const codeName = status[fields.code] ?? "UNKNOWN";
    const reasonString = fields.reason ?? "";
    super(`${codeName}/${reasonString || "-"}: ${fields.message}`, options);
    this.name = new.target.name;
    this.code = fields.code;
    this.codeName = codeName;
    this.reasonString = reasonString;
    this.reason = reasonFromString(reasonString);
    this.domain = fields.domain ?? "";
    this.metadata = fields.metadata ?? {};
    this.fieldViolations = fields.fieldViolations ?? {};
    this.detail = fields.message;
  }

  /** True when this error carries `reason`. */
  is(reason: ErrorReason): boolean {
    return this.reason === reason;
  }
}

// -- one class per status meaning, one per reason (the Python SDK's fencepost.errors)
export class InvalidArgumentError extends FencepostError { static readonly statusCode: status | undefined = status.INVALID_ARGUMENT; }
export class NotFoundError extends FencepostError { static readonly statusCode: status | undefined = status.NOT_FOUND; }
export class AlreadyExistsError extends FencepostError { static readonly statusCode: status | undefined = status.ALREADY_EXISTS; }
export class FailedPreconditionError extends FencepostError { static readonly statusCode: status | undefined = status.FAILED_PRECONDITION; }
export class AbortedError extends FencepostError { static readonly statusCode: status | undefined = status.ABORTED; }
export class UnavailableError extends FencepostError { static readonly statusCode: status | undefined = status.UNAVAILABLE; }
export class DeadlineExceededError extends FencepostError { static readonly statusCode: status | undefined = status.DEADLINE_EXCEEDED; }
export class UnauthenticatedError extends FencepostError { static readonly statusCode: status | undefined = status.UNAUTHENTICATED; }
export class PermissionDeniedError extends FencepostError { static readonly statusCode: status | undefined = status.PERMISSION_DENIED; }
export class ResourceExhaustedError extends FencepostError { static readonly statusCode: status | undefined = status.RESOURCE_EXHAUSTED; }
export class InternalError extends FencepostError { static readonly statusCode: status | undefined = status.INTERNAL; }

export class KeyInvalidError extends InvalidArgumentError {}
export class KeyTooLongError extends InvalidArgumentError {}
export class ValueTooLargeError extends InvalidArgumentError {}
export class TxnTooLargeError extends InvalidArgumentError {}
export class TxnDuplicateKeyError extends InvalidArgumentError {}
export class PageTokenInvalidError extends InvalidArgumentError {}
export class PageSizeInvalidError extends InvalidArgumentError {}
export class VersionInvalidError extends InvalidArgumentError {}
export class FieldInvalidError extends InvalidArgumentError {}
export class RequestIdReusedError extends InvalidArgumentError {}
export class CommitTooLargeError extends InvalidArgumentError {}
export class RecordTooLargeError extends InvalidArgumentError {}
export class EventTooLargeError extends InvalidArgumentError {}
export class UnsupportedProtocolVersionError extends InvalidArgumentError {}
export class CallPayloadMismatchError extends InvalidArgumentError {}
export class AgentNameInvalidError extends InvalidArgumentError {}
export class ContentTooLargeError extends InvalidArgumentError {}
export class AboutTooLargeError extends InvalidArgumentError {}
export class SupersedesInvalidError extends InvalidArgumentError {}
export class RuleUnsupportedError extends InvalidArgumentError {}
export class ReminderInvalidError extends InvalidArgumentError {}
export class MessageTooLargeError extends ResourceExhaustedError {}
export class TxnContendedError extends AbortedError {}
export class SessionNotFoundError extends NotFoundError {}
export class EntryNotFoundError extends NotFoundError {}
export class ArchiveNotFoundError extends NotFoundError {}
export class EvalRunNotFoundError extends NotFoundError {}
export class OperationNotFoundError extends NotFoundError {}
export class LeaseHeldError extends FailedPreconditionError {}
export class LeaseFencedError extends FailedPreconditionError {}
export class SequenceMismatchError extends FailedPreconditionError {}
export class InboxEntryGoneError extends FailedPreconditionError {}
export class InboxNotEmptyError extends FailedPreconditionError {}
export class SessionHasForksError extends FailedPreconditionError {}
export class ReminderIdsExhaustedError extends FailedPreconditionError {}
export class ErasureInProgressError extends FailedPreconditionError {}
export class BackendUnavailableError extends UnavailableError {}
export class PersistenceUncertainError extends UnavailableError {}

type ErrorClass = (new (fields: ErrorFields, options?: { cause?: unknown }) => FencepostError) & { statusCode: status | undefined };

/** Every reason's class: tsc fails here when the enum gains a reason without one. */
const BY_REASON: Record<Exclude<ErrorReason, ErrorReason.UNSPECIFIED | ErrorReason.UNRECOGNIZED>, ErrorClass> = {
  [ErrorReason.KEY_INVALID]: KeyInvalidError,
  [ErrorReason.KEY_TOO_LONG]: KeyTooLongError,
  [ErrorReason.VALUE_TOO_LARGE]: ValueTooLargeError,
  [ErrorReason.TXN_TOO_LARGE]: TxnTooLargeError,
  [ErrorReason.TXN_DUPLICATE_KEY]: TxnDuplicateKeyError,
  [ErrorReason.TXN_CONTENDED]: TxnContendedError,
  [ErrorReason.PAGE_TOKEN_INVALID]: PageTokenInvalidError,
  [ErrorReason.PAGE_SIZE_INVALID]: PageSizeInvalidError,
  [ErrorReason.VERSION_INVALID]: VersionInvalidError,
  [ErrorReason.FIELD_INVALID]: FieldInvalidError,
  [ErrorReason.REQUEST_ID_REUSED]: RequestIdReusedError,
  [ErrorReason.BACKEND_UNAVAILABLE]: BackendUnavailableError,
  [ErrorReason.PERSISTENCE_UNCERTAIN]: PersistenceUncertainError,
  [ErrorReason.SESSION_NOT_FOUND]: SessionNotFoundError,
  [ErrorReason.LEASE_HELD]: LeaseHeldError,
  [ErrorReason.LEASE_FENCED]: LeaseFencedError,
  [ErrorReason.SEQUENCE_MISMATCH]: SequenceMismatchError,
  [ErrorReason.INBOX_ENTRY_GONE]: InboxEntryGoneError,
  [ErrorReason.INBOX_NOT_EMPTY]: InboxNotEmptyError,
  [ErrorReason.COMMIT_TOO_LARGE]: CommitTooLargeError,
  [ErrorReason.RECORD_TOO_LARGE]: RecordTooLargeError,
  [ErrorReason.EVENT_TOO_LARGE]: EventTooLargeError,
  [ErrorReason.UNSUPPORTED_PROTOCOL_VERSION]: UnsupportedProtocolVersionError,
  [ErrorReason.CALL_PAYLOAD_MISMATCH]: CallPayloadMismatchError,
  [ErrorReason.AGENT_NAME_INVALID]: AgentNameInvalidError,
  [ErrorReason.ARCHIVE_NOT_FOUND]: ArchiveNotFoundError,
  [ErrorReason.CONTENT_TOO_LARGE]: ContentTooLargeError,
  [ErrorReason.ABOUT_TOO_LARGE]: AboutTooLargeError,
  [ErrorReason.SUPERSEDES_INVALID]: SupersedesInvalidError,
  [ErrorReason.ENTRY_NOT_FOUND]: EntryNotFoundError,
  [ErrorReason.RULE_UNSUPPORTED]: RuleUnsupportedError,
  [ErrorReason.REMINDER_INVALID]: ReminderInvalidError,
  [ErrorReason.EVAL_RUN_NOT_FOUND]: EvalRunNotFoundError,
  [ErrorReason.UNAUTHENTICATED]: UnauthenticatedError,
  [ErrorReason.PERMISSION_DENIED]: PermissionDeniedError,
  [ErrorReason.MESSAGE_TOO_LARGE]: MessageTooLargeError,
  [ErrorReason.INTERNAL]: InternalError,
  [ErrorReason.SESSION_HAS_FORKS]: SessionHasForksError,
  [ErrorReason.OPERATION_NOT_FOUND]: OperationNotFoundError,
  [ErrorReason.REMINDER_IDS_EXHAUSTED]: ReminderIdsExhaustedError,
  [ErrorReason.ERASURE_IN_PROGRESS]: ErasureInProgressError,
};

const BY_CODE = new Map<status, ErrorClass>(
  [
    InvalidArgumentError, NotFoundError, AlreadyExistsError, FailedPreconditionError, AbortedError, UnavailableError,
    DeadlineExceededError, UnauthenticatedError, PermissionDeniedError, ResourceExhaustedError, InternalError,
  ].map((cls) => [cls.statusCode!, cls]),
);

/** The error for a status code and reason: the reason's class, unless the
 * reason came under another status code (Fork's ALREADY_EXISTS /
 * FIELD_INVALID), or is newer than this client, when it is the status code's
 * class; FencepostError for a code with no class. As the Python SDK's
 * `errors.error_for`: `instanceof InvalidArgumentError` never catches a
 * status that is not one. */
export function errorFor(fields: ErrorFields, options?: { cause?: unknown }): FencepostError {
  let cls: ErrorClass | undefined = BY_REASON[reasonFromString(fields.reason ?? "") as keyof typeof BY_REASON];
  if (cls === undefined || cls.statusCode !== fields.code) cls = BY_CODE.get(fields.code);
  return new (cls ?? FencepostError)(fields, options);
}

/** True when `err` is a FencepostError with `reason`. */
export function isReason(err: unknown, reason: ErrorReason): err is FencepostError {
  return err instanceof FencepostError && err.reason === reason;
}

/** The Status, ErrorInfo (fencepost's domain only) and BadRequest of the details trailer; none when the
 * trailer does not decode (a proxy's, say): the error keeps the call's code and
 * message. Throwing here would escape from grpc-js's status callback. */
function decodeDetails(metadata: Metadata | undefined): Partial<ErrorFields> {
  try {
    return decodeStatus(metadata);
  } catch {
    return {};
  }
}

function decodeStatus(metadata: Metadata | undefined): Partial<ErrorFields> {
  const raw = metadata?.get(DETAILS_KEY) ?? [];
  if (raw.length === 0) return {};
  const st = Status.decode(raw[0] as Buffer);
  const out: Partial<ErrorFields> = { message: st.message };
  for (const any of st.details) {
    const type = any.typeUrl.slice(any.typeUrl.lastIndexOf("/") + 1);
    if (type === "google.rpc.ErrorInfo") {
      const info = ErrorInfo.decode(any.value);
      // Another domain's ErrorInfo (a proxy's, another service's) is read as
      // none, even when its reason spells one of fencepost's: it says nothing
      // about fencepost's state.
      if (info.domain !== DOMAIN) continue;
      Object.assign(out, { reason: info.reason, domain: info.domain, metadata: info.metadata });
    } else if (type === "google.rpc.BadRequest") {
      const bad = BadRequest.decode(any.value);
      out.fieldViolations = Object.fromEntries(bad.fieldViolations.map((v) => [v.field, v.description]));
    }
  }
  return out;
}

const TOO_LARGE = /message larger than max|send message with a size larger than/i;

/** The FencepostError for a grpc-js error (keeps it as `cause`). */
export function fromServiceError(err: ServiceError): FencepostError {
  const details = decodeDetails(err.metadata);
  const fields: ErrorFields = {
    ...details,
    code: err.code,
    message: details.message || err.details || status[err.code] || "error",
  };
  // The transport refuses an oversized request before any handler runs: no
  // ErrorInfo at all. Reported under the reason the SDKs give it, whichever
  // side refused it: the server ("Received message larger than max"), or this
  // client over its own grpc.max_send_message_length ("Attempted to send
  // message with a size larger than ...").
  if (err.code === status.RESOURCE_EXHAUSTED && !fields.reason && TOO_LARGE.test(fields.message)) {
    fields.reason = "MESSAGE_TOO_LARGE";
  }
  return errorFor(fields, { cause: err });
}
