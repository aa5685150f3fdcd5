// Typed error details: google.rpc.Status from the grpc-status-details-bin
// trailer, with one ErrorInfo (reason, domain, metadata) and BadRequest.
import { assert, grpc, expectError, unary } from "../lib.mjs";

export const name = "typed error details";
export const services = ["fencepost.v1.KvService"];

export async function run({ client }) {
  const kv = client("fencepost.v1.KvService");
  const { INVALID_ARGUMENT } = grpc.status;

  const empty = await expectError(unary(kv, "Put", { key: "", value: Buffer.from("x") }), INVALID_ARGUMENT, "KEY_INVALID");
  assert.deepEqual(empty.fieldViolations.map((v) => v.field), ["key"]);

  const long = await expectError(unary(kv, "Get", { key: "k".repeat(2000) }), INVALID_ARGUMENT, "KEY_TOO_LONG");
  assert.deepEqual(long.errorInfo.metadata, { limit: "1024", size: "2000" });

  await expectError(unary(kv, "List", { prefix: "p/", page_size: -1 }), INVALID_ARGUMENT, "PAGE_SIZE_INVALID");
  await expectError(unary(kv, "List", { prefix: "p/", page_token: "not-a-token" }), INVALID_ARGUMENT, "PAGE_TOKEN_INVALID");
  await expectError(
    unary(kv, "PutIfVersion", { key: "k", value: Buffer.from("x"), expected_version: "" }),
    INVALID_ARGUMENT,
    "VERSION_INVALID",
  );
  return "5 reasons decoded";
}
