// Shared by the tests: the server under test (FENCEPOST_TARGET, required:
// the suite never skips) and a client per test file.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import { ErrorReason, FencepostClient, FencepostError } from "../src";

export function target(): string {
  const t = process.env.FENCEPOST_TARGET;
  if (!t) throw new Error("FENCEPOST_TARGET is not set: run the suite against a live server (host:port)");
  return t;
}

export function newClient(): FencepostClient {
  return new FencepostClient(target(), { timeoutMs: 10_000 });
}

export const unique = (prefix: string) => `${prefix}-${randomUUID()}`;

/** Awaits `promise`, which must fail with `code` and `reason`; returns the error. */
export async function expectReason(promise: Promise<unknown>, code: number, reason: ErrorReason): Promise<FencepostError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof FencepostError, `expected a FencepostError, got ${err}`);
    assert.equal(err.code, code, `code of ${err.message}`);
    assert.equal(err.reason, reason, `reason of ${err.message}`);
    assert.equal(err.domain, "fencepost.dev");
    return err;
  }
  assert.fail(`expected ${ErrorReason[reason]}, the call succeeded`);
}
