// Text a JavaScript string can hold but UTF-8 cannot: a lone surrogate (a
// string cut in the middle of an emoji, say). protobuf encodes it as U+FFFD,
// so two different keys would name one stored key; the client refuses it
// before sending, as the server refuses a key that is not UTF-8.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ServiceError, status } from "@grpc/grpc-js";

import { ErrorReason, FencepostClient, FencepostError, UnaryMethod, kv } from "../src";

function offline(): { fp: FencepostClient; sent: unknown[] } {
  const sent: unknown[] = [];
  const answer: UnaryMethod<unknown, unknown> = (req, _md, _opts, cb) => {
    sent.push(req);
    cb({ code: status.UNIMPLEMENTED, details: "offline", metadata: undefined } as unknown as ServiceError, undefined);
    return {} as ReturnType<UnaryMethod<unknown, unknown>>;
  };
  const fp = new FencepostClient("127.0.0.1:1", { token: "" });
  const stub = Object.fromEntries(
    ["put", "get", "getWithVersion", "delete", "putIfAbsent", "putIfVersion", "deleteIfVersion", "list", "listKeys", "txn"]
      .map((m) => [m, answer]),
  );
  (fp as unknown as { kv: unknown }).kv = stub;
  (fp as unknown as { ledger: unknown }).ledger = { openSession: answer, acquireLease: answer, renewLease: answer };
  return { fp, sent };
}

async function refused(call: Promise<unknown>, reason: ErrorReason, field: string): Promise<void> {
  const err = await call.then(() => assert.fail("a lone surrogate was sent"), (e: unknown) => e);
  assert.ok(err instanceof FencepostError, String(err));
  assert.deepEqual([err.code, err.reason, Object.keys(err.fieldViolations)], [status.INVALID_ARGUMENT, reason, [field]]);
}

test("a lone surrogate aliases another key on the wire", () => {
  const a = kv.PutRequest.decode(kv.PutRequest.encode({ key: "k\uD83D", value: Buffer.alloc(0), requestId: "" }).finish());
  const b = kv.PutRequest.decode(kv.PutRequest.encode({ key: "k\uDBFF", value: Buffer.alloc(0), requestId: "" }).finish());
  assert.equal(a.key, b.key); // both "k\uFFFD": why the client must refuse them
});

test("keys, prefixes and Txn keys with a lone surrogate are KEY_INVALID and never sent", async () => {
  const { fp, sent } = offline();
  try {
    const v = Buffer.from("v");
    for (const key of ["k\uD83D", "\uDE00k", "a\uDE00\uD83D"]) {
      await refused(fp.put(key, v), ErrorReason.KEY_INVALID, "key");
      await refused(fp.get(key), ErrorReason.KEY_INVALID, "key");
      await refused(fp.getWithVersion(key), ErrorReason.KEY_INVALID, "key");
      await refused(fp.delete(key), ErrorReason.KEY_INVALID, "key");
      await refused(fp.putIfAbsent(key, v), ErrorReason.KEY_INVALID, "key");
      await refused(fp.putIfVersion(key, v, "1"), ErrorReason.KEY_INVALID, "key");
      await refused(fp.deleteIfVersion(key, "1"), ErrorReason.KEY_INVALID, "key");
      await refused(fp.list(key), ErrorReason.KEY_INVALID, "prefix");
      await refused(fp.listKeys(key), ErrorReason.KEY_INVALID, "prefix");
      await refused(fp.txn({ compares: [kv.Compare.fromPartial({ key, exists: true })] }), ErrorReason.KEY_INVALID, "compares[0].key");
      await refused(fp.txn({ successOps: [kv.TxnOp.fromPartial({ deleteKey: "ok" }), kv.TxnOp.fromPartial({ put: { key, value: v } })] }),
        ErrorReason.KEY_INVALID, "success_ops[1].put.key");
      await refused(fp.txn({ failureOps: [kv.TxnOp.fromPartial({ deleteKey: key })] }), ErrorReason.KEY_INVALID, "failure_ops[0].delete_key");
    }
    await refused(fp.put("k", v, { requestId: "r\uD83D" }), ErrorReason.FIELD_INVALID, "request_id");
    await refused(fp.openSession("agent\uD83D", "s"), ErrorReason.FIELD_INVALID, "agent");
    await refused(fp.openSession("agent", "s\uDE00"), ErrorReason.FIELD_INVALID, "session_key");
    await refused(fp.acquireLease("sid", "pod\uD83D", 1000), ErrorReason.FIELD_INVALID, "holder_id");
    assert.equal(sent.length, 0);
    // well-formed text, surrogate pairs included, goes through
    await assert.rejects(fp.put("k\uD83D\uDE00", v), (e: FencepostError) => e.code === status.UNIMPLEMENTED);
    await assert.rejects(fp.txn({ compares: [kv.Compare.fromPartial({ key: "😀", exists: true })] }),
      (e: FencepostError) => e.code === status.UNIMPLEMENTED);
    assert.equal(sent.length, 2);
  } finally {
    fp.close();
  }
});
