// The store-API lane from JavaScript: a v=1 memory.append envelope through
// StoreApiService.Call, read back with memory.read, and an unserved envelope
// version refused with UNSUPPORTED_PROTOCOL_VERSION (served versions in metadata).
import { randomUUID } from "node:crypto";

import { assert, expectError, grpc, unary } from "../lib.mjs";

export const name = "StoreApiService envelopes (memory.append / memory.read)";
export const services = ["fencepost.v1.StoreApiService"];

export async function run({ client }) {
  const store = client("fencepost.v1.StoreApiService");
  const agent = `polyglot-${randomUUID()}`;

  const empty = await unary(store, "Call", { v: 1, call: "memory.read", memory_read: { agent } });
  assert.equal(empty.ok, true);
  assert.equal(empty.memory_read.journal, null);

  const ids = [];
  for (const [i, status] of [[0, "TURN_STATUS_COMPLETED"], [1, "TURN_STATUS_FAILED"]]) {
    const res = await unary(store, "Call", {
      v: 1, call: "memory.append", request_id: randomUUID(),
      memory_append: {
        agent,
        record: { at: `2025-01-01T00:00:0${i}Z`, session_id: "s-1", channel_id: "c-1", status, title: `turn ${i} ✓` },
      },
    });
    assert.deepEqual([res.v, res.ok, res.result], [1, true, "memory_append"]);
    assert.ok(res.memory_append.record_id);
    ids.push(res.memory_append.record_id);
  }
  assert.ok(ids[0] < ids[1], "record ids are time-ordered");

  const read = await unary(store, "Call", { v: 1, call: "memory.read", memory_read: { agent } });
  assert.equal(read.result, "memory_read");
  const journal = read.memory_read.journal;
  const lines = Buffer.from(journal.jsonl).toString("utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
  assert.equal(journal.record_count, "2");
  assert.equal(Number(journal.size_bytes), Buffer.byteLength(journal.jsonl));
  assert.deepEqual(lines.map((r) => [r.sessionId, r.channelId, r.status, r.title]), [
    ["s-1", "c-1", "completed", "turn 0 ✓"],
    ["s-1", "c-1", "failed", "turn 1 ✓"],
  ]);

  const bad = await expectError(
    unary(store, "Call", { v: 2, call: "memory.read", memory_read: { agent } }),
    grpc.status.INVALID_ARGUMENT, "UNSUPPORTED_PROTOCOL_VERSION",
  );
  assert.equal(bad.errorInfo.metadata.v, "2");
  assert.deepEqual(bad.errorInfo.metadata.served.split(","), ["1"]);
  await expectError(
    unary(store, "Call", { v: 1, call: "memory.read", memory_append: { agent, record: {} } }),
    grpc.status.INVALID_ARGUMENT, "CALL_PAYLOAD_MISMATCH",
  );
  return `${lines.length} records`;
}
