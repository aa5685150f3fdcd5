// Typed errors: the ErrorInfo trailer decoded into FencepostError with the
// reason as the generated ErrorReason enum, for every reason the JavaScript
// contract checks (tests/polyglot/checks) cover, plus the transport's
// oversized-request refusal.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Metadata, ServiceError, status } from "@grpc/grpc-js";

import {
  DOMAIN, ErrorReason, FencepostClient, FencepostError, evals, fromServiceError, journal, memory, newRequestId, reasonFromString,
  reasonToString, schedule, storeApi, timestampNow,
} from "../src";
import { ErrorInfo } from "../src/gen/google/rpc/error_details";
import { Status } from "../src/gen/google/rpc/status";
import { expectReason, newClient, target, unique } from "./support";

const fp = newClient();
after(() => fp.close());
const { INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, RESOURCE_EXHAUSTED } = status;

test("reason strings and the enum map both ways; unknown reasons are UNRECOGNIZED", () => {
  assert.equal(reasonFromString("LEASE_FENCED"), ErrorReason.LEASE_FENCED);
  assert.equal(reasonToString(ErrorReason.LEASE_FENCED), "LEASE_FENCED");
  for (const value of Object.values(ErrorReason).filter((v): v is number => typeof v === "number" && v > 0)) {
    assert.equal(reasonFromString(reasonToString(value)), value);
  }
  assert.equal(reasonFromString("SOMETHING_NEWER"), ErrorReason.UNRECOGNIZED);
  assert.equal(reasonFromString(""), ErrorReason.UNSPECIFIED);
});

test("KV input errors: KEY_INVALID, KEY_TOO_LONG, PAGE_SIZE_INVALID, PAGE_TOKEN_INVALID, VERSION_INVALID", async () => {
  const empty = await expectReason(fp.put("", Buffer.from("x")), INVALID_ARGUMENT, ErrorReason.KEY_INVALID);
  assert.deepEqual(Object.keys(empty.fieldViolations), ["key"]);
  assert.equal(empty.codeName, "INVALID_ARGUMENT");
  assert.equal(empty.reasonString, "KEY_INVALID");

  const long = await expectReason(fp.get("k".repeat(2000)), INVALID_ARGUMENT, ErrorReason.KEY_TOO_LONG);
  assert.deepEqual({ ...long.metadata }, { limit: "1024", size: "2000" });

  await expectReason(fp.list("p/", { pageSize: -1 }), INVALID_ARGUMENT, ErrorReason.PAGE_SIZE_INVALID);
  await expectReason(fp.list("p/", { pageToken: "not-a-token" }), INVALID_ARGUMENT, ErrorReason.PAGE_TOKEN_INVALID);
  await expectReason(fp.putIfVersion("k", Buffer.from("x"), ""), INVALID_ARGUMENT, ErrorReason.VERSION_INVALID);
});

test("ledger errors: LEASE_HELD, LEASE_FENCED, SEQUENCE_MISMATCH with their metadata", async () => {
  const session = await fp.openSession(unique("ts-agent"), "chan/é");
  const sid = session.sessionId;
  const a = await fp.acquireLease(sid, "A", 30_000);
  const held = await expectReason(fp.acquireLease(sid, "B", 30_000), FAILED_PRECONDITION, ErrorReason.LEASE_HELD);
  assert.equal(held.metadata.holder, "A");
  await fp.commit(sid, a.generation, "0", [Buffer.from("turn-1")]);
  await expectReason(fp.commit(sid, a.generation, "0", [Buffer.from("stale")]), FAILED_PRECONDITION, ErrorReason.SEQUENCE_MISMATCH);

  await fp.releaseLease(sid, a.generation, true);
  const b = await fp.acquireLease(sid, "B", 30_000);
  const fenced = await expectReason(fp.commit(sid, a.generation, "1", [Buffer.from("late")]), FAILED_PRECONDITION, ErrorReason.LEASE_FENCED);
  assert.equal(fenced.metadata.generation, a.generation);
  assert.equal(fenced.metadata.current_generation, b.generation);
});

test("store API envelope errors: UNSUPPORTED_PROTOCOL_VERSION, CALL_PAYLOAD_MISMATCH", async () => {
  const call = (req: storeApi.CallRequest) => fp.call(fp.storeApi.call.bind(fp.storeApi), req, { safe: true });
  const agent = unique("ts-agent");
  const v2 = await expectReason(
    call(storeApi.CallRequest.fromPartial({ v: 2, call: "memory.read", memoryRead: { agent } })),
    INVALID_ARGUMENT, ErrorReason.UNSUPPORTED_PROTOCOL_VERSION,
  );
  assert.equal(v2.metadata.v, "2");
  await expectReason(
    call(storeApi.CallRequest.fromPartial({ v: 1, call: "memory.read", memoryAppend: { agent, record: {} } })),
    INVALID_ARGUMENT, ErrorReason.CALL_PAYLOAD_MISMATCH,
  );
});

test("schedule errors: RULE_UNSUPPORTED, REMINDER_INVALID", async () => {
  const session = await fp.openSession(unique("ts-agent"), "reminders");
  const lease = await fp.acquireLease(session.sessionId, "A", 30_000);
  const create = (init: Partial<schedule.CreateReminderRequest>) =>
    fp.call(
      fp.schedule.createReminder.bind(fp.schedule),
      schedule.CreateReminderRequest.fromPartial({ sessionId: session.sessionId, generation: lease.generation, ...init }),
      { safe: false },
    );
  const rule = await expectReason(create({ prompt: "p", cron: "0 9 * * *" }), INVALID_ARGUMENT, ErrorReason.RULE_UNSUPPORTED);
  assert.equal(rule.metadata.rule, "cron");
  await expectReason(create({ prompt: " ", afterSeconds: "5" }), INVALID_ARGUMENT, ErrorReason.REMINDER_INVALID);
});

test("eval errors: EVAL_RUN_NOT_FOUND, FIELD_INVALID with its field violation", async () => {
  const agent = unique("ts-agent");
  await expectReason(
    fp.call(fp.evals.getEvalRun.bind(fp.evals), { agent, runId: "nope" }, { safe: true }),
    NOT_FOUND, ErrorReason.EVAL_RUN_NOT_FOUND,
  );
  const bad = await expectReason(
    fp.call(
      fp.evals.putAbSample.bind(fp.evals),
      evals.PutAbSampleRequest.fromPartial({ agent, experiment: "", sessionId: "s", at: timestampNow(), sample: {} }),
      { safe: false },
    ),
    INVALID_ARGUMENT, ErrorReason.FIELD_INVALID,
  );
  assert.deepEqual(Object.keys(bad.fieldViolations), ["experiment"]);
});

test("an oversized request: the transport's RESOURCE_EXHAUSTED (no ErrorInfo), reported as MESSAGE_TOO_LARGE", async () => {
  // the server under test receives at most 2 MiB (--max-receive-bytes)
  const err = await fp.put(unique("ts/big"), Buffer.alloc(3 * 1024 * 1024)).then(
    () => assert.fail("an oversized request succeeded"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof FencepostError);
  assert.deepEqual([err.code, err.reason, err.domain], [RESOURCE_EXHAUSTED, ErrorReason.MESSAGE_TOO_LARGE, ""]);
});

test("a request over the client's own send limit is MESSAGE_TOO_LARGE too", async () => {
  // grpc-js refuses it before sending, in other words ("Attempted to send
  // message with a size larger than ..."), and it was reported without a reason
  const small = new FencepostClient(target(), { timeoutMs: 10_000, channelOptions: { "grpc.max_send_message_length": 1024 } });
  try {
    const err = await small.put(unique("ts/over-send"), Buffer.alloc(4096)).then(
      () => assert.fail("a request over the send limit succeeded"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof FencepostError, String(err));
    assert.deepEqual([err.code, err.reason], [RESOURCE_EXHAUSTED, ErrorReason.MESSAGE_TOO_LARGE], err.message);
  } finally {
    small.close();
  }
});

/** A failed call whose google.rpc.Status carries `infos`. */
function failed(code: status, ...infos: Partial<ErrorInfo>[]): ServiceError {
  const details = infos.map((info) => ({
    typeUrl: "type.googleapis.com/google.rpc.ErrorInfo",
    value: Buffer.from(ErrorInfo.encode(ErrorInfo.fromPartial(info)).finish()),
  }));
  const md = new Metadata();
  md.set("grpc-status-details-bin", Buffer.from(Status.encode({ code, message: "refused", details }).finish()));
  return { code, details: "refused", metadata: md } as unknown as ServiceError;
}

test("an ErrorInfo of fencepost's domain gives its reason and metadata", () => {
  const err = fromServiceError(failed(FAILED_PRECONDITION, { reason: "LEASE_FENCED", domain: DOMAIN, metadata: { generation: "3" } }));
  assert.equal(DOMAIN, "fencepost.dev");
  assert.deepEqual([err.reason, err.reasonString, err.domain, { ...err.metadata }],
    [ErrorReason.LEASE_FENCED, "LEASE_FENCED", DOMAIN, { generation: "3" }]);
});

test("an ErrorInfo of another domain is read as none: no reason, whatever it spells", () => {
  // a proxy or another service in front whose reason happens to be one of
  // fencepost's says nothing about fencepost's state (a LEASE_FENCED from a
  // proxy must not make a holder stop)
  for (const domain of ["proxy.example.com", "googleapis.com", ""]) {
    for (const [code, reason] of [[FAILED_PRECONDITION, "LEASE_FENCED"], [status.UNAVAILABLE, "BACKEND_UNAVAILABLE"],
      [INVALID_ARGUMENT, "KEY_INVALID"], [NOT_FOUND, "SESSION_NOT_FOUND"]] as const) {
      const err = fromServiceError(failed(code, { reason, domain, metadata: { generation: "3" } }));
      assert.ok(err instanceof FencepostError);
      assert.deepEqual(
        [err.code, err.reason, err.reasonString, err.domain, { ...err.metadata }, err.detail],
        [code, ErrorReason.UNSPECIFIED, "", "", {}, "refused"],
        `${domain}/${reason}`,
      );
      assert.equal(err.is(reasonFromString(reason)), false);
    }
  }
});

test("fencepost's ErrorInfo wins over another domain's, in either order", () => {
  const ours = { reason: "SEQUENCE_MISMATCH", domain: DOMAIN, metadata: { head: "4" } };
  const theirs = { reason: "LEASE_FENCED", domain: "proxy.example.com", metadata: { generation: "3" } };
  for (const infos of [[ours, theirs], [theirs, ours]]) {
    const err = fromServiceError(failed(FAILED_PRECONDITION, ...infos));
    assert.deepEqual([err.reason, err.domain, { ...err.metadata }], [ErrorReason.SEQUENCE_MISMATCH, DOMAIN, { head: "4" }]);
  }
});

test("memory errors: REQUEST_ID_REUSED, CONTENT_TOO_LARGE, ENTRY_NOT_FOUND", async () => {
  const agentId = unique("ts-agent");
  const append = fp.memory.append.bind(fp.memory);
  const requestId = newRequestId();
  const first = await fp.call(append, memory.MemoryServiceAppendRequest.fromPartial({ agentId, content: "fact", requestId }), { safe: true });
  await expectReason(
    fp.call(append, memory.MemoryServiceAppendRequest.fromPartial({ agentId, content: "another", requestId }), { safe: true }),
    INVALID_ARGUMENT, ErrorReason.REQUEST_ID_REUSED,
  );
  const tooLarge = await expectReason(
    fp.call(append, memory.MemoryServiceAppendRequest.fromPartial({ agentId, content: "x".repeat(4097), requestId: newRequestId() }), { safe: true }),
    INVALID_ARGUMENT, ErrorReason.CONTENT_TOO_LARGE,
  );
  assert.ok(tooLarge.metadata.limit, JSON.stringify(tooLarge.metadata));
  const forget = fp.memory.forget.bind(fp.memory);
  await fp.call(forget, { agentId, id: first.entry!.id, requestId: newRequestId() }, { safe: true });
  await expectReason(
    fp.call(fp.memory.pin.bind(fp.memory), { agentId, id: first.entry!.id, requestId: newRequestId() }, { safe: true }),
    NOT_FOUND, ErrorReason.ENTRY_NOT_FOUND,
  );
});

test("journal and admin errors: AGENT_NAME_INVALID, ARCHIVE_NOT_FOUND (from a stream), OPERATION_NOT_FOUND", async () => {
  const record = journal.TurnRecord.fromPartial({ at: "2025-01-01T00:00:00Z", sessionId: "s", channelId: "c", status: journal.TurnStatus.COMPLETED });
  await expectReason(
    fp.call(fp.journal.appendTurn.bind(fp.journal), { agent: "a/b", record, requestId: newRequestId() }, { safe: true }),
    INVALID_ARGUMENT, ErrorReason.AGENT_NAME_INVALID,
  );
  const archive = (async () => {
    for await (const _ of fp.stream(fp.journal.readArchive.bind(fp.journal), { agent: unique("ts-agent"), name: "no-such-archive" })) { /* none */ }
  })();
  await expectReason(archive, NOT_FOUND, ErrorReason.ARCHIVE_NOT_FOUND);
  await expectReason(
    fp.call(fp.admin.getOperation.bind(fp.admin), { name: "operations/no-such-operation" }, { safe: true }),
    NOT_FOUND, ErrorReason.OPERATION_NOT_FOUND,
  );
});
