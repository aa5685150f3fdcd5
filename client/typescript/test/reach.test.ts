// Every RPC of every service is reachable through the typed layer: unary ones
// with `fp.call`, server-streaming ones with `fp.stream`, each sending the
// client's metadata (its bearer token) and failing with a FencepostError
// decoded from the ErrorInfo trailer. Checked against an in-process grpc-js
// server that implements every generated service definition, then on the
// server under test for the streams' results and errors.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import {
  Metadata, Server, ServerCredentials, ServerUnaryCall, ServerWritableStream, ServiceDefinition, UntypedServiceImplementation,
  sendUnaryData, status,
} from "@grpc/grpc-js";

import { DOMAIN, ErrorReason, FencepostClient, FencepostError, ledger } from "../src";
import { AdminServiceService } from "../src/gen/fencepost/v1/admin";
import { EvalServiceService } from "../src/gen/fencepost/v1/evals";
import { JournalServiceService } from "../src/gen/fencepost/v1/journal";
import { KvServiceService } from "../src/gen/fencepost/v1/kv";
import { LedgerServiceService } from "../src/gen/fencepost/v1/ledger";
import { MemoryServiceService } from "../src/gen/fencepost/v1/memory";
import { ScheduleServiceService } from "../src/gen/fencepost/v1/schedule";
import { StoreApiServiceService } from "../src/gen/fencepost/v1/store_api";
import { ErrorInfo } from "../src/gen/google/rpc/error_details";
import { Any } from "../src/gen/google/protobuf/any";
import { Status } from "../src/gen/google/rpc/status";
import { expectReason, newClient, unique } from "./support";

/** fp's property for each service definition. */
const SERVICES: [keyof FencepostClient, ServiceDefinition][] = [
  ["kv", KvServiceService], ["ledger", LedgerServiceService], ["memory", MemoryServiceService],
  ["journal", JournalServiceService], ["storeApi", StoreApiServiceService], ["schedule", ScheduleServiceService],
  ["evals", EvalServiceService], ["admin", AdminServiceService],
];

/** A refusal naming the method, as the server sends one: ErrorInfo in the details trailer. */
function refusal(path: string): { code: status; details: string; metadata: Metadata } {
  const info = ErrorInfo.encode({ reason: "FIELD_INVALID", domain: DOMAIN, metadata: { method: path } }).finish();
  const any: Any = { typeUrl: "type.googleapis.com/google.rpc.ErrorInfo", value: Buffer.from(info) };
  const st = Status.encode({ code: status.INVALID_ARGUMENT, message: `refused ${path}`, details: [any] }).finish();
  const metadata = new Metadata();
  metadata.set("grpc-status-details-bin", Buffer.from(st));
  return { code: status.INVALID_ARGUMENT, details: `refused ${path}`, metadata };
}

const seen: { path: string; authorization: string }[] = [];
let hang: ServerWritableStream<unknown, unknown> | undefined;
let hangCancelled = false;
let unaryCancelled = false;
const server = new Server();
let fake: FencepostClient;
let fakeTarget = "";

before(async () => {
  for (const [, definition] of SERVICES) {
    const impl: UntypedServiceImplementation = {};
    for (const [name, method] of Object.entries(definition)) {
      const note = (md: Metadata) => seen.push({ path: method.path, authorization: String(md.get("authorization")[0] ?? "") });
      impl[name] = method.responseStream
        ? (call: ServerWritableStream<unknown, unknown>) => {
          note(call.metadata);
          if (name === "watchInbox") { // a stream that never ends: deadlines and cancellation
            hang = call;
            call.on("cancelled", () => { hangCancelled = true; });
            return;
          }
          call.emit("error", refusal(method.path));
        }
        : (call: ServerUnaryCall<unknown, unknown>, callback: sendUnaryData<unknown>) => {
          note(call.metadata);
          if (name === "getWithVersion") { // a call that never answers
            call.on("cancelled", () => { unaryCancelled = true; });
            return;
          }
          callback(refusal(method.path));
        };
    }
    server.addService(definition, impl);
  }
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  fakeTarget = `127.0.0.1:${port}`;
  fake = new FencepostClient(fakeTarget, { token: "secret-1", timeoutMs: 5_000 });
});

after(() => {
  fake.close();
  server.forceShutdown();
});

test("every RPC of every service, through fp.call or fp.stream: the client's token goes out, errors are typed", async () => {
  let count = 0;
  for (const [prop, definition] of SERVICES) {
    const client = fake[prop] as unknown as Record<string, Function>;
    for (const [name, method] of Object.entries(definition)) {
      if (name === "watchInbox" || name === "getWithVersion") continue; // the hanging ones, below
      count++;
      const bound = client[name].bind(client);
      const request = method.requestDeserialize(Buffer.alloc(0)); // every field at its default
      const run = method.responseStream
        ? (async () => { for await (const _ of fake.stream(bound, request)) { /* none */ } })()
        : fake.call(bound, request, { safe: false });
      const err = await run.then(() => assert.fail(`${method.path} succeeded`), (e: unknown) => e);
      assert.ok(err instanceof FencepostError, `${method.path}: ${err}`);
      assert.equal(err.reason, ErrorReason.FIELD_INVALID, method.path);
      assert.equal(err.metadata.method, method.path);
      assert.deepEqual(seen.at(-1), { path: method.path, authorization: "Bearer secret-1" });
    }
  }
  // every rpc of proto/ (the services above are all of them), watchInbox included
  const protoDir = join(__dirname, "..", "..", "..", "..", "proto", "fencepost", "v1");
  const rpcs = readdirSync(protoDir).filter((f) => f.endsWith(".proto"))
    .flatMap((f) => readFileSync(join(protoDir, f), "utf8").match(/^\s*rpc \w+\(/gm) ?? []);
  assert.equal(count + 2, rpcs.length);
});

test("a stream's timeoutMs is its deadline: DEADLINE_EXCEEDED, typed", async () => {
  const run = async () => { for await (const _ of fake.stream(fake.ledger.watchInbox.bind(fake.ledger), { sessionId: "s", generation: "1" }, { timeoutMs: 200 })) { /* none */ } };
  await assert.rejects(run(), (e: unknown) => e instanceof FencepostError && e.code === status.DEADLINE_EXCEEDED);
});

test("aborting the signal cancels the stream on the server", async () => {
  hangCancelled = false;
  hang = undefined; // the deadline test's call: wait for this one's
  const ac = new AbortController();
  const run = (async () => { for await (const _ of fake.stream(fake.ledger.watchInbox.bind(fake.ledger), { sessionId: "s", generation: "1" }, { signal: ac.signal })) { /* none */ } })();
  for (let i = 0; i < 100 && !hang; i++) await new Promise((r) => setTimeout(r, 10));
  ac.abort();
  await assert.rejects(run, (e: unknown) => e instanceof FencepostError && e.code === status.CANCELLED);
  for (let i = 0; i < 100 && !hangCancelled; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(hangCancelled, "the server never saw the cancellation");
});

test("a unary call's timeoutMs bounds a call the server never answers: DEADLINE_EXCEEDED, typed", async () => {
  await assert.rejects(fake.getWithVersion("k", { timeoutMs: 200 }),
    (e: unknown) => e instanceof FencepostError && e.code === status.DEADLINE_EXCEEDED);
});

test("aborting a unary call's signal cancels it on the server: CANCELLED, typed, not retried", async () => {
  unaryCancelled = false;
  const ac = new AbortController();
  const before = seen.length;
  const run = fake.getWithVersion("k", { signal: ac.signal });
  for (let i = 0; i < 100 && seen.length === before; i++) await new Promise((r) => setTimeout(r, 10));
  ac.abort();
  await assert.rejects(run, (e: unknown) => e instanceof FencepostError && e.code === status.CANCELLED);
  for (let i = 0; i < 100 && !unaryCancelled; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(unaryCancelled, "the server never saw the cancellation");
  assert.equal(seen.length, before + 1);
  // an already aborted signal sends nothing
  await assert.rejects(fake.getWithVersion("k", { signal: ac.signal }), (e: unknown) => e instanceof FencepostError && e.code === status.CANCELLED);
  assert.equal(seen.length, before + 1);
});

// -- on the server under test -------------------------------------------------
const fp = newClient();
after(() => fp.close());

test("ReadLog through fp.stream: the committed records, typed; an unknown session is SESSION_NOT_FOUND", async () => {
  const s = await fp.openSession("reach", unique("s"));
  const lease = await fp.acquireLease(s.sessionId, "holder-1", 10_000);
  await fp.commit(s.sessionId, lease.generation, "0", [Buffer.from("a"), Buffer.from("b")]);
  const records: ledger.Record[] = [];
  const request: ledger.ReadLogRequest = { sessionId: s.sessionId, fromSeq: "1", limit: "0" };
  for await (const page of fp.stream(fp.ledger.readLog.bind(fp.ledger), request)) records.push(...page.records);
  assert.deepEqual(records.map((r) => [r.seq, Buffer.from(r.data).toString()]), [["1", "a"], ["2", "b"]]);

  const missing = (async () => {
    for await (const _ of fp.stream(fp.ledger.readLog.bind(fp.ledger), { ...request, sessionId: "no-such-session" })) { /* none */ }
  })();
  await expectReason(missing, status.NOT_FOUND, ErrorReason.SESSION_NOT_FOUND);
});

test("an authorization in the client's metadata is the one sent, not FENCEPOST_TOKEN's; a token option replaces it", async () => {
  // FENCEPOST_TOKEN replaced the authorization the caller's metadata named:
  // the calls ran as the environment's identity (the Python SDK sends the metadata's)
  const saved = process.env.FENCEPOST_TOKEN;
  process.env.FENCEPOST_TOKEN = "from-env";
  const sent = async (c: FencepostClient) => {
    try {
      await c.get("k").catch(() => undefined);
      return seen.at(-1)?.authorization;
    } finally {
      c.close();
    }
  };
  try {
    assert.equal(await sent(new FencepostClient(fakeTarget, { metadata: { Authorization: "Bearer own" } })), "Bearer own");
    assert.equal(await sent(new FencepostClient(fakeTarget, { metadata: { authorization: "Bearer own" }, token: "explicit" })),
      "Bearer explicit");
    assert.equal(await sent(new FencepostClient(fakeTarget, {})), "Bearer from-env");
  } finally {
    if (saved === undefined) delete process.env.FENCEPOST_TOKEN;
    else process.env.FENCEPOST_TOKEN = saved;
  }
});
