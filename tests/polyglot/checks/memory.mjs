// MemoryService from JavaScript: append (idempotent with a request id), list,
// search, pin / unpin, pinned, topics, the injection, forget, and typed errors.
import { randomUUID } from "node:crypto";

import { assert, expectError, grpc, unary } from "../lib.mjs";

export const name = "MemoryService entries, pins, search and forget";
export const services = ["fencepost.v1.MemoryService"];

export async function run({ client }) {
  const memory = client("fencepost.v1.MemoryService");
  const agent_id = `polyglot-${randomUUID()}`;

  const request_id = randomUUID();
  const fact = { agent_id, content: "The deploy uses Postgres ✓", kind: "MEMORY_KIND_SEMANTIC", about: ["deploy pipeline"], request_id };
  const first = await unary(memory, "Append", fact);
  const again = await unary(memory, "Append", fact); // a retry with the same request id: the first entry
  assert.equal(again.entry.id, first.entry.id);
  assert.equal(first.entry.content, fact.content);
  assert.ok(first.entry.created_at && typeof first.entry.created_at.seconds === "string", "created_at is an exact Timestamp");
  await expectError(unary(memory, "Append", { ...fact, content: "something else" }), grpc.status.INVALID_ARGUMENT, "REQUEST_ID_REUSED");
  const other = await unary(memory, "Append", { agent_id, content: "Standups are at nine", request_id: randomUUID() });

  const listed = await unary(memory, "List", { agent_id });
  assert.deepEqual(listed.entries.map((e) => e.id), [first.entry.id, other.entry.id]);
  const hits = await unary(memory, "Search", { agent_id, query: "deploy" });
  assert.deepEqual(hits.entries.map((e) => e.id), [first.entry.id]);

  const pin = await unary(memory, "Pin", { agent_id, id: first.entry.id, request_id: randomUUID() });
  assert.equal(pin.pinned, true);
  assert.deepEqual((await unary(memory, "Pinned", { agent_id })).entries.map((e) => e.id), [first.entry.id]);
  const topics = await unary(memory, "Topics", { agent_id });
  assert.ok(topics.topics.some((t) => t.name === "deploy pipeline"), JSON.stringify(topics.topics));
  const injection = await unary(memory, "BuildInjection", { agent_id });
  assert.deepEqual(injection.pinned.map((e) => e.id), [first.entry.id]);
  assert.equal((await unary(memory, "Unpin", { agent_id, id: first.entry.id, request_id: randomUUID() })).unpinned, true);
  assert.equal((await unary(memory, "Unpin", { agent_id, id: first.entry.id, request_id: randomUUID() })).unpinned, false);

  assert.equal((await unary(memory, "Forget", { agent_id, id: other.entry.id, request_id: randomUUID() })).forgotten, true);
  assert.equal((await unary(memory, "Forget", { agent_id, id: other.entry.id, request_id: randomUUID() })).forgotten, false);
  assert.deepEqual((await unary(memory, "List", { agent_id })).entries.map((e) => e.id), [first.entry.id]);

  await expectError(unary(memory, "Pin", { agent_id, id: other.entry.id, request_id: randomUUID() }), grpc.status.NOT_FOUND, "ENTRY_NOT_FOUND");
  await expectError(unary(memory, "Append", { agent_id, content: "x".repeat(4097), request_id: randomUUID() }),
    grpc.status.INVALID_ARGUMENT, "CONTENT_TOO_LARGE");
  await expectError(unary(memory, "List", { agent_id, page_size: -1 }), grpc.status.INVALID_ARGUMENT, "PAGE_SIZE_INVALID");
  return `${listed.entries.length} entries`;
}
