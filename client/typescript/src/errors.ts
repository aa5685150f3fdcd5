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

/** A failed fencepost call. `reason` is the enum, `reasonString` what the server sent. */
export class FencepostError extends Error {
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
    this.name = "FencepostError";
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
  return new FencepostError(fields, { cause: err });
}
