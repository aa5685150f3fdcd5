// The call wrapper's rules, without a server: UNAVAILABLE is retried only for
// safe calls, never another code, and never past the deadline.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Metadata, ServiceError, status } from "@grpc/grpc-js";

import { FencepostClient, FencepostError, NO_RETRY, RetryPolicy, UnaryMethod, callUnary, fromServiceError, ledger } from "../src";

const fast: RetryPolicy = { maxAttempts: 5, initialBackoffMs: 1, maxBackoffMs: 2, multiplier: 2 };

function failing(codes: status[]): { method: UnaryMethod<string, string>; calls: () => number } {
  let calls = 0;
  const method: UnaryMethod<string, string> = (req, _md, _opts, cb) => {
    const code = codes[calls++];
    if (code === undefined) cb(null, `ok:${req}`);
    else cb(Object.assign(new Error(status[code]), { code, details: status[code], metadata: new Metadata() }) as ServiceError, "");
    return {} as ReturnType<UnaryMethod<string, string>>;
  };
  return { method, calls: () => calls };
}

test("a safe call is retried on UNAVAILABLE", async () => {
  const f = failing([status.UNAVAILABLE, status.UNAVAILABLE]);
  assert.equal(await callUnary(f.method, "r", true, { retry: fast }), "ok:r");
  assert.equal(f.calls(), 3);
});

test("an unsafe call is never retried", async () => {
  const f = failing([status.UNAVAILABLE]);
  await assert.rejects(callUnary(f.method, "r", false, { retry: fast }), (e: FencepostError) => e.code === status.UNAVAILABLE);
  assert.equal(f.calls(), 1);
});

test("other codes are never retried, even for a safe call", async () => {
  const f = failing([status.FAILED_PRECONDITION]);
  await assert.rejects(callUnary(f.method, "r", true, { retry: fast }), (e: FencepostError) => e.code === status.FAILED_PRECONDITION);
  assert.equal(f.calls(), 1);
});

test("attempts are bounded by the policy", async () => {
  const f = failing(Array(10).fill(status.UNAVAILABLE));
  await assert.rejects(callUnary(f.method, "r", true, { retry: fast }));
  assert.equal(f.calls(), 5);
  const g = failing([status.UNAVAILABLE]);
  await assert.rejects(callUnary(g.method, "r", true, { retry: NO_RETRY }));
  assert.equal(g.calls(), 1);
});

test("an expired deadline fails with DEADLINE_EXCEEDED before calling", async () => {
  const f = failing([]);
  await assert.rejects(callUnary(f.method, "r", true, { timeoutMs: 0 }), (e: FencepostError) => e.code === status.DEADLINE_EXCEEDED);
  assert.equal(f.calls(), 0);
});

test("a conditional write or Txn sent without a request id is never resent", async () => {
  // Its first attempt may have applied: a resend would answer applied = false
  // against the caller's own write, or apply a Txn's failure branch too.
  let calls = 0;
  const unavailable: UnaryMethod<unknown, unknown> = (_req, _md, _opts, cb) => {
    calls++;
    const code = status.UNAVAILABLE;
    cb(Object.assign(new Error("UNAVAILABLE"), { code, details: "UNAVAILABLE", metadata: new Metadata() }) as ServiceError, undefined);
    return {} as ReturnType<UnaryMethod<unknown, unknown>>;
  };
  const fp = new FencepostClient("127.0.0.1:1", { retry: fast, token: "" });
  (fp as unknown as { kv: unknown }).kv = {
    putIfAbsent: unavailable, putIfVersion: unavailable, deleteIfVersion: unavailable, txn: unavailable,
  };
  try {
    const writes = (requestId?: string) => [
      () => fp.putIfAbsent("k", Buffer.from("v"), { requestId }),
      () => fp.putIfVersion("k", Buffer.from("v"), "v1", { requestId }),
      () => fp.deleteIfVersion("k", "v1", { requestId }),
      () => fp.txn({}, { requestId }),
    ];
    for (const write of writes("")) {
      calls = 0;
      await assert.rejects(write(), (e: FencepostError) => e.code === status.UNAVAILABLE);
      assert.equal(calls, 1);
    }
    for (const write of writes(undefined)) {  // the client fills a request id in: safe to resend
      calls = 0;
      await assert.rejects(write(), (e: FencepostError) => e.code === status.UNAVAILABLE);
      assert.equal(calls, fast.maxAttempts);
    }
  } finally {
    fp.close();
  }
});

test("a client's calls have the Python SDK's default deadline (30 s) unless told otherwise", async () => {
  // Without one, a call to a server that accepted it and then stalled never returned.
  const deadlines: (Date | number | undefined)[] = [];
  const get: UnaryMethod<unknown, unknown> = (_req, _md, opts, cb) => {
    deadlines.push(opts.deadline);
    cb(null, { found: false, value: Buffer.alloc(0), version: "" });
    return {} as ReturnType<UnaryMethod<unknown, unknown>>;
  };
  const clients = [
    new FencepostClient("127.0.0.1:1", { token: "" }),
    new FencepostClient("127.0.0.1:1", { token: "", timeoutMs: 5_000 }),
    new FencepostClient("127.0.0.1:1", { token: "", timeoutMs: undefined }),  // explicitly none
  ];
  try {
    for (const fp of clients) {
      (fp as unknown as { kv: unknown }).kv = { get };
      await fp.get("k");
    }
    await clients[0].get("k", { timeoutMs: 1_000 });
    const ahead = deadlines.map((d) => (d === undefined ? undefined : Math.round((Number(d) - Date.now()) / 1000)));
    assert.deepEqual(ahead, [30, 5, undefined, 1]);
  } finally {
    for (const fp of clients) fp.close();
  }
});

test("a TTL of a fraction of a millisecond is sent as a valid Duration (whole nanos)", async () => {
  // a third of 10 s is 3333.3333333333335 ms: its nanos were not a whole
  // number, and encoding the request failed (INTERNAL, nothing sent)
  const sent: { seconds: string; nanos: number }[] = [];
  const encodeAndAnswer: UnaryMethod<ledger.AcquireLeaseRequest, unknown> = (req, _md, _opts, cb) => {
    const wire = ledger.AcquireLeaseRequest.decode(ledger.AcquireLeaseRequest.encode(req).finish());
    sent.push(wire.ttl!);
    cb(null, { lease: { generation: "1" } });
    return {} as ReturnType<UnaryMethod<unknown, unknown>>;
  };
  const fp = new FencepostClient("127.0.0.1:1", { token: "" });
  (fp as unknown as { ledger: unknown }).ledger = { acquireLease: encodeAndAnswer, renewLease: encodeAndAnswer };
  try {
    await fp.acquireLease("sid", "A", (10 / 3) * 1000);
    await fp.renewLease("sid", "1", "A", 1000.4);
    await fp.renewLease("sid", "1", "A", 2999.9999999);
    await fp.acquireLease("sid", "A", 10_000);
    await fp.acquireLease("sid", "A", 0.0004);
    assert.deepEqual(sent, [
      { seconds: "3", nanos: 333_333_333 },
      { seconds: "1", nanos: 400_000 },
      { seconds: "3", nanos: 0 },
      { seconds: "10", nanos: 0 },
      { seconds: "0", nanos: 400 },
    ]);
  } finally {
    fp.close();
  }
});

test("a commit sent without a commit id is never resent; with one (filled in when absent) it is, under the same id", async () => {
  // Without an id, a resend of a commit whose first attempt applied answers
  // SEQUENCE_MISMATCH (or INBOX_ENTRY_GONE) against the caller's own commit.
  const ids: string[] = [];
  const unavailable: UnaryMethod<ledger.CommitRequest, unknown> = (req, _md, _opts, cb) => {
    ids.push(req.commitId);
    const code = status.UNAVAILABLE;
    cb(Object.assign(new Error("UNAVAILABLE"), { code, details: "UNAVAILABLE", metadata: new Metadata() }) as ServiceError, undefined);
    return {} as ReturnType<UnaryMethod<unknown, unknown>>;
  };
  const fp = new FencepostClient("127.0.0.1:1", { retry: fast, token: "" });
  (fp as unknown as { ledger: unknown }).ledger = { commit: unavailable };
  try {
    const unavailableCode = (e: FencepostError) => e.code === status.UNAVAILABLE;
    await assert.rejects(fp.commit("sid", "1", "0", [Buffer.from("r")], { commitId: "" }), unavailableCode);
    assert.deepEqual(ids, [""]);
    ids.length = 0;
    await assert.rejects(fp.commit("sid", "1", "0", [Buffer.from("r")]), unavailableCode);
    assert.equal(ids.length, fast.maxAttempts);
    assert.ok(ids[0] !== "" && ids.every((id) => id === ids[0]), String(ids));
    ids.length = 0;
    await assert.rejects(fp.commit("sid", "1", "0", [Buffer.from("r")], { commitId: "turn-7" }), unavailableCode);
    assert.deepEqual(ids, Array(fast.maxAttempts).fill("turn-7"));
  } finally {
    fp.close();
  }
});

test("a call's metadata replaces the client's under the same key (a per-call token is the one sent)", async () => {
  // Both were sent, the client's first, and the server reads the first
  // authorization: a per-call token was ignored and the call ran as the
  // client's (FENCEPOST_TOKEN's) identity.
  const seen: Metadata[] = [];
  const get: UnaryMethod<unknown, unknown> = (_req, md, _opts, cb) => {
    seen.push(md);
    cb(null, { found: false, value: Buffer.alloc(0), version: "" });
    return {} as ReturnType<UnaryMethod<unknown, unknown>>;
  };
  const fp = new FencepostClient("127.0.0.1:1", { token: "client-token", metadata: { "x-team": "a", "x-keep": "k" } });
  (fp as unknown as { kv: unknown }).kv = { get };
  try {
    await fp.get("k", { metadata: { authorization: "Bearer call-token", "X-Team": "b" } });
    await fp.get("k");
    const [call, plain] = seen;
    assert.deepEqual(call.get("authorization"), ["Bearer call-token"]);
    assert.deepEqual(call.get("x-team"), ["b"]);
    assert.deepEqual(call.get("x-keep"), ["k"]);
    assert.deepEqual(plain.get("authorization"), ["Bearer client-token"]);
    assert.deepEqual(plain.get("x-team"), ["a"]);
  } finally {
    fp.close();
  }
});

test("a status-details trailer that does not decode still makes a FencepostError with the call's code", async () => {
  // Decoding threw from inside grpc-js's status callback (a proxy's or a
  // broken server's trailer): the call's promise never settled and the
  // exception escaped as an uncaught one.
  const md = new Metadata();
  md.set("grpc-status-details-bin", Buffer.from([0xff, 0xff, 0xff]));
  const broken = { code: status.UNAVAILABLE, details: "upstream reset", metadata: md } as unknown as ServiceError;
  const err = fromServiceError(broken);
  assert.ok(err instanceof FencepostError);
  assert.deepEqual([err.code, err.reasonString, err.detail], [status.UNAVAILABLE, "", "upstream reset"]);
  let calls = 0;
  const method: UnaryMethod<string, string> = (_req, _md, _opts, cb) => {
    calls++;
    setImmediate(() => cb(broken, ""));
    return {} as ReturnType<UnaryMethod<string, string>>;
  };
  await assert.rejects(callUnary(method, "r", true, { retry: fast }), (e: unknown) => e instanceof FencepostError && e.code === status.UNAVAILABLE);
  assert.equal(calls, fast.maxAttempts); // still UNAVAILABLE: retried as any other
});

test("every KV write is resent under the request id of its first attempt (filled in: a UUIDv7)", async () => {
  const ids: string[] = [];
  const flaky = (response: unknown): UnaryMethod<{ requestId: string }, unknown> => (req, _md, _opts, cb) => {
    ids.push(req.requestId);
    if (ids.length % 2 === 1) {
      const code = status.UNAVAILABLE;
      cb(Object.assign(new Error("UNAVAILABLE"), { code, details: "UNAVAILABLE", metadata: new Metadata() }) as ServiceError, undefined);
    } else cb(null, response);
    return {} as ReturnType<UnaryMethod<unknown, unknown>>;
  };
  const fp = new FencepostClient("127.0.0.1:1", { retry: fast, token: "" });
  const cas = { applied: true, version: "v2" };
  (fp as unknown as { kv: unknown }).kv = {
    put: flaky({ version: "v1" }), delete: flaky({ existed: true }), putIfAbsent: flaky(cas), putIfVersion: flaky(cas),
    deleteIfVersion: flaky(cas), txn: flaky({ succeeded: true, failedCompares: [] }),
  };
  try {
    await fp.put("k", Buffer.from("v"));
    await fp.delete("k");
    await fp.putIfAbsent("k", Buffer.from("v"));
    await fp.putIfVersion("k", Buffer.from("v"), "v1");
    await fp.deleteIfVersion("k", "v1");
    await fp.txn({});
    await fp.put("k", Buffer.from("v"), { requestId: "mine-1" });
  } finally {
    fp.close();
  }
  assert.equal(ids.length, 14);
  for (let i = 0; i < ids.length; i += 2) assert.equal(ids[i + 1], ids[i], `write ${i / 2}`);
  for (const id of ids.slice(0, 12)) assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(new Set(ids.slice(0, 12)).size, 6);
  assert.deepEqual(ids.slice(12), ["mine-1", "mine-1"]);
});

test("aborting the signal during a retry's backoff rejects at once: CANCELLED, no further attempt", async () => {
  // answers asynchronously, as grpc-js does (the call's abort listener is then removed with its answer)
  let calls = 0;
  const method: UnaryMethod<string, string> = (_req, _md, _opts, cb) => {
    calls++;
    const code = status.UNAVAILABLE;
    setImmediate(() => cb(Object.assign(new Error("down"), { code, details: "down", metadata: new Metadata() }) as ServiceError, ""));
    return {} as ReturnType<UnaryMethod<string, string>>;
  };
  const slow: RetryPolicy = { maxAttempts: 2, initialBackoffMs: 20_000, maxBackoffMs: 20_000, multiplier: 1 };
  const random = Math.random;
  Math.random = () => 0.99; // the one backoff: 19.8 s
  const controller = new AbortController();
  let pending: Promise<string>;
  try {
    pending = callUnary(method, "r", true, { retry: slow }, { signal: controller.signal });
  } finally {
    Math.random = random;
  }
  await new Promise((r) => setTimeout(r, 50));
  const started = Date.now();
  controller.abort();
  await assert.rejects(pending, (e: FencepostError) => e.code === status.CANCELLED);
  assert.ok(Date.now() - started < 2_000, `rejected ${Date.now() - started} ms after the abort`);
  assert.equal(calls, 1);
});
