// KvService from JavaScript: put/get, the compare-and-set group, list paging.
import { randomUUID } from "node:crypto";

import { assert, unary } from "../lib.mjs";

export const name = "KvService put/get/CAS/list paging";
export const services = ["fencepost.v1.KvService"];

export async function run({ client }) {
  const kv = client("fencepost.v1.KvService");
  const root = `polyglot/${randomUUID()}/`;

  const put = await unary(kv, "Put", { key: root + "a", value: Buffer.from("hello") });
  assert.ok(put.version, "Put returns a version");
  const got = await unary(kv, "Get", { key: root + "a" });
  assert.equal(got.found, true);
  assert.equal(Buffer.from(got.value).toString(), "hello");
  assert.equal(got.version, put.version);
  const miss = await unary(kv, "Get", { key: root + "missing" });
  assert.equal(miss.found, false, "a miss is found = false, not an error");

  // Compare-and-set: a failed compare is a result carrying the current version.
  const absent = await unary(kv, "PutIfAbsent", { key: root + "a", value: Buffer.from("x"), request_id: randomUUID() });
  assert.deepEqual([absent.applied, absent.version], [false, put.version]);
  const created = await unary(kv, "PutIfAbsent", { key: root + "b", value: Buffer.from("b1"), request_id: randomUUID() });
  assert.equal(created.applied, true);
  const stale = await unary(kv, "PutIfVersion", {
    key: root + "a", value: Buffer.from("x"), expected_version: created.version, request_id: randomUUID(),
  });
  assert.deepEqual([stale.applied, stale.version], [false, put.version]);
  const swapped = await unary(kv, "PutIfVersion", {
    key: root + "a", value: Buffer.from("hello2"), expected_version: put.version, request_id: randomUUID(),
  });
  assert.equal(swapped.applied, true);
  assert.notEqual(swapped.version, put.version, "every write changes the version");
  const staleDelete = await unary(kv, "DeleteIfVersion", { key: root + "a", expected_version: put.version });
  assert.deepEqual([staleDelete.applied, staleDelete.version], [false, swapped.version]);
  const deleted = await unary(kv, "DeleteIfVersion", { key: root + "a", expected_version: swapped.version });
  assert.equal(deleted.applied, true);
  assert.equal((await unary(kv, "Get", { key: root + "a" })).found, false);

  // List paging (AIP-158): every key once, in order; empty token ends.
  const names = ["k0", "k1", "k2", "k3", "k4", "k5", "k6"].map((k) => root + "list/" + k);
  for (const key of [...names].reverse()) await unary(kv, "Put", { key, value: Buffer.from(key) });
  const seen = [];
  let token = "";
  let pages = 0;
  do {
    const page = await unary(kv, "List", { prefix: root + "list/", page_size: 3, page_token: token });
    assert.ok(page.entries.length <= 3);
    for (const e of page.entries) {
      assert.equal(Buffer.from(e.value).toString(), e.key);
      seen.push(e.key);
    }
    token = page.next_page_token;
    pages += 1;
  } while (token);
  assert.deepEqual(seen, names);
  assert.equal(pages, 3);
  const keys = [];
  token = "";
  do {
    const page = await unary(kv, "ListKeys", { prefix: root + "list/", page_size: 2, page_token: token });
    keys.push(...page.keys);
    token = page.next_page_token;
  } while (token);
  assert.deepEqual(keys, names);

  // Txn: a failed compare is succeeded = false, and the failure branch applies.
  const txn = await unary(kv, "Txn", {
    compares: [{ key: root + "b", version: "not-the-version" }],
    success_ops: [{ put: { key: root + "txn", value: Buffer.from("success") } }],
    failure_ops: [{ put: { key: root + "txn", value: Buffer.from("failure") } }],
    request_id: randomUUID(),
  });
  assert.deepEqual([txn.succeeded, txn.failed_compares], [false, [0]]);
  assert.equal(Buffer.from((await unary(kv, "Get", { key: root + "txn" })).value).toString(), "failure");
  return `${seen.length} keys over ${pages} pages`;
}
