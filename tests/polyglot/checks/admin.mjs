// AdminService from JavaScript: an agent erasure as a long-running operation
// (a retry with the same request id is the same operation; GetOperation polls
// it to done), and typed errors. Never EraseTenant: the other checks share
// the tenant.
import { randomUUID } from "node:crypto";

import { assert, expectError, grpc, unary } from "../lib.mjs";

export const name = "AdminService agent erasure and operations";
export const services = ["fencepost.v1.AdminService", "fencepost.v1.MemoryService"];

export async function run({ client }) {
  const admin = client("fencepost.v1.AdminService");
  const memory = client("fencepost.v1.MemoryService");
  const agent = `polyglot-${randomUUID()}`;
  await unary(memory, "Append", { agent_id: agent, content: "to be erased", request_id: randomUUID() });

  const request_id = randomUUID();
  const started = await unary(admin, "EraseAgent", { agent, request_id });
  const again = await unary(admin, "EraseAgent", { agent, request_id });
  assert.equal(again.operation.name, started.operation.name);
  assert.equal(started.operation.agent, agent);

  let op = started.operation;
  for (let i = 0; i < 200 && !op.done; i++) {
    await new Promise((r) => setTimeout(r, 50));
    op = (await unary(admin, "GetOperation", { name: op.name })).operation;
  }
  assert.equal(op.done, true, `operation ${op.name} not done (phase ${op.phase})`);
  assert.deepEqual((await unary(memory, "List", { agent_id: agent })).entries, []);

  await expectError(unary(admin, "GetOperation", { name: "operations/no-such-operation" }), grpc.status.NOT_FOUND, "OPERATION_NOT_FOUND");
  await expectError(unary(admin, "EraseAgent", { agent: "", request_id: randomUUID() }), grpc.status.INVALID_ARGUMENT, "AGENT_NAME_INVALID");
  return `${op.items_erased} items erased`;
}
