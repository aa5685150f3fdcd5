// Every reason of the ErrorReason enum has a named error class (the Python
// SDK's fencepost.errors, with an `Error` suffix) under its status code's
// class; a reason this client does not know, or one sent under another
// status code, is the status code's class; an unknown code is FencepostError.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Metadata, ServiceError, status } from "@grpc/grpc-js";

import * as sdk from "../src";
import {
  AlreadyExistsError, ErrorReason, FailedPreconditionError, FencepostError, InvalidArgumentError, KeyInvalidError,
  LeaseFencedError, NotFoundError, SessionNotFoundError, errorFor, fromServiceError, reasonToString,
} from "../src";
import { ErrorInfo } from "../src/gen/google/rpc/error_details";
import { Status } from "../src/gen/google/rpc/status";
import { newClient } from "./support";

/** The class name of a reason: LEASE_FENCED -> LeaseFencedError. */
const className = (reason: string) =>
  reason.toLowerCase().replace(/(^|_)([a-z])/g, (_m, _s, c: string) => c.toUpperCase()) + "Error";

test("each reason of the enum has its class, a subclass of FencepostError, named after it", () => {
  const classes = sdk as unknown as Record<string, new (...a: never[]) => FencepostError>;
  const reasons = Object.values(ErrorReason).filter((v): v is ErrorReason => typeof v === "number" && v > 0);
  assert.ok(reasons.length >= 41);
  for (const reason of reasons) {
    const name = className(reasonToString(reason));
    const cls = classes[name];
    assert.equal(typeof cls, "function", `no class ${name} for ${reasonToString(reason)}`);
    const code = (cls as unknown as { statusCode: status }).statusCode;
    assert.ok(code !== undefined, `${name} has no status code`);
    const err = errorFor({ code, message: "m", reason: reasonToString(reason) });
    assert.ok(err instanceof cls && err instanceof FencepostError, name);
    assert.equal(err.name, name);
    assert.equal(err.reason, reason);
  }
});

test("an unknown reason, or a reason under another code, is the status code's class; an unknown code FencepostError", () => {
  const newer = errorFor({ code: status.FAILED_PRECONDITION, message: "m", reason: "SOMETHING_NEWER" });
  assert.equal(newer.constructor, FailedPreconditionError);
  assert.equal(newer.reasonString, "SOMETHING_NEWER");
  const fork = errorFor({ code: status.ALREADY_EXISTS, message: "m", reason: "FIELD_INVALID" });
  assert.equal(fork.constructor, AlreadyExistsError);
  assert.ok(!(fork instanceof InvalidArgumentError));
  const odd = errorFor({ code: status.DATA_LOSS, message: "m" });
  assert.equal(odd.constructor, FencepostError);
});

test("fromServiceError picks the reason's class from the trailer", () => {
  const info = ErrorInfo.encode({ reason: "LEASE_FENCED", domain: sdk.DOMAIN, metadata: { generation: "1" } }).finish();
  const st = Status.encode({
    code: status.FAILED_PRECONDITION, message: "fenced", details: [{ typeUrl: "type.googleapis.com/google.rpc.ErrorInfo", value: Buffer.from(info) }],
  }).finish();
  const metadata = new Metadata();
  metadata.set("grpc-status-details-bin", Buffer.from(st));
  const err = fromServiceError(Object.assign(new Error("x"), { code: status.FAILED_PRECONDITION, details: "fenced", metadata }) as ServiceError);
  assert.ok(err instanceof LeaseFencedError && err instanceof FailedPreconditionError);
  assert.equal(err.metadata.generation, "1");
});

const fp = newClient();
after(() => fp.close());

test("from a live server and from the client's own checks: the reason's class", async () => {
  await assert.rejects(fp.get(""), KeyInvalidError);
  await assert.rejects(fp.get("k\uD83D"), KeyInvalidError); // refused before sending
  await assert.rejects(fp.getSession("no-such-session"), (e: unknown) => e instanceof SessionNotFoundError && e instanceof NotFoundError);
});
