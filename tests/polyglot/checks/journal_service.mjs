// JournalService from JavaScript: AppendTurn (a retry with the same request id
// journals once), ReadJournal streamed as JSONL, ListArchives, and typed errors
// from a unary call and from a stream (ARCHIVE_NOT_FOUND).
import { randomUUID } from "node:crypto";

import { assert, expectError, grpc, serverStream, unary } from "../lib.mjs";

export const name = "JournalService appends, streamed reads and archives";
export const services = ["fencepost.v1.JournalService"];

export async function run({ client }) {
  const journal = client("fencepost.v1.JournalService");
  const agent = `polyglot-${randomUUID()}`;

  const never = await serverStream(journal, "ReadJournal", { agent });
  assert.deepEqual(never.map((m) => m.found), [false]);

  const record = { at: "2025-01-01T00:00:00Z", session_id: "s-1", channel_id: "c-1", status: "TURN_STATUS_COMPLETED", title: "turn ✓" };
  const request_id = randomUUID();
  const first = await unary(journal, "AppendTurn", { agent, record, request_id });
  const retry = await unary(journal, "AppendTurn", { agent, record, request_id });
  assert.equal(retry.record_id, first.record_id);
  await unary(journal, "AppendTurn", { agent, record: { ...record, status: "TURN_STATUS_FAILED" }, request_id: randomUUID() });

  const read = await serverStream(journal, "ReadJournal", { agent });
  assert.ok(read.length >= 1 && read.every((m) => m.found));
  const jsonl = Buffer.concat(read.map((m) => Buffer.from(m.chunk))).toString("utf8");
  const lines = jsonl.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  assert.deepEqual(lines.map((r) => [r.status, r.title]), [["completed", "turn ✓"], ["failed", "turn ✓"]]);
  assert.equal(read.at(-1).record_count, "2");

  const archives = await unary(journal, "ListArchives", { agent });
  assert.deepEqual([archives.archives, archives.next_page_token], [[], ""]);
  await expectError(unary(journal, "AppendTurn", { agent: "a/b", record, request_id: randomUUID() }),
    grpc.status.INVALID_ARGUMENT, "AGENT_NAME_INVALID");
  await expectError(unary(journal, "AppendTurn", { agent, record: { ...record, status: "TURN_STATUS_UNSPECIFIED" }, request_id: randomUUID() }),
    grpc.status.INVALID_ARGUMENT, "FIELD_INVALID");
  await expectError(serverStream(journal, "ReadArchive", { agent, name: "no-such-archive" }), grpc.status.NOT_FOUND, "ARCHIVE_NOT_FOUND");
  return `${lines.length} records`;
}
