// KV and compare-and-set against a live server.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { credentials, status } from "@grpc/grpc-js";

import { FencepostClient, FencepostError, NO_RETRY, kv } from "../src";
import { newClient, target, unique } from "./support";

const fp = newClient();
after(() => fp.close());
const enc = (s: string) => Buffer.from(s);

test("put / get / delete; a miss is null, never an error", async () => {
  const key = unique("ts/kv");
  assert.equal(await fp.get(key), null);
  const version = await fp.put(key, enc("v1"));
  const got = await fp.get(key);
  assert.deepEqual([got?.value.toString(), got?.version], ["v1", version]);
  assert.equal(await fp.delete(key), true);
  assert.equal(await fp.delete(key), false);
  assert.equal(await fp.getWithVersion(key), null);
});

test("compare-and-set: a failed compare is a result with the current version", async () => {
  const key = unique("ts/cas");
  const created = await fp.putIfAbsent(key, enc("a"));
  assert.equal(created.applied, true);
  const again = await fp.putIfAbsent(key, enc("b"));
  assert.deepEqual(again, { applied: false, version: created.version });

  const moved = await fp.putIfVersion(key, enc("c"), created.version);
  assert.equal(moved.applied, true);
  const stale = await fp.putIfVersion(key, enc("d"), created.version);
  assert.deepEqual(stale, { applied: false, version: moved.version });
  assert.equal((await fp.getWithVersion(key))?.value.toString(), "c");

  assert.equal((await fp.deleteIfVersion(key, created.version)).applied, false);
  assert.equal((await fp.deleteIfVersion(key, moved.version)).applied, true);
  assert.equal(await fp.get(key), null);
});

test("a retried write with the same request id applies once", async () => {
  const key = unique("ts/idem");
  const requestId = unique("req"); // a fixed id would be reused, and refused, by a second run against one server
  const first = await fp.put(key, enc("x"), { requestId });
  const retried = await fp.put(key, enc("x"), { requestId });
  assert.equal(retried, first);
});

test("List and ListKeys page in key order; the empty token ends", async () => {
  const prefix = unique("ts/list") + "/";
  const names = ["a", "b", "c", "d", "e"];
  for (const n of names) await fp.put(prefix + n, enc(n));
  const first = await fp.list(prefix, { pageSize: 2 });
  assert.deepEqual(first.items.map((e) => e.key), [prefix + "a", prefix + "b"]);
  assert.notEqual(first.nextPageToken, "");
  const all: string[] = [];
  for await (const e of fp.listAll(prefix, 2)) all.push(e.value.toString());
  assert.deepEqual(all, names);
  let token = "";
  const keys: string[] = [];
  do {
    const page = await fp.listKeys(prefix, { pageSize: 3, pageToken: token });
    keys.push(...page.items);
    token = page.nextPageToken;
  } while (token);
  assert.deepEqual(keys, names.map((n) => prefix + n));
});

test("Txn applies the success branch when every compare holds, else the failure branch", async () => {
  const key = unique("ts/txn");
  const other = key + "/other";
  const version = await fp.put(key, enc("1"));
  const ok = await fp.txn({
    compares: [kv.Compare.fromPartial({ key, version })],
    successOps: [kv.TxnOp.fromPartial({ put: { key, value: enc("2") } }), kv.TxnOp.fromPartial({ put: { key: other, value: enc("o") } })],
  });
  assert.equal(ok.succeeded, true);
  assert.equal(ok.versions.length, 2);
  const failed = await fp.txn({
    compares: [kv.Compare.fromPartial({ key, version }), kv.Compare.fromPartial({ key: other, exists: true })],
    successOps: [kv.TxnOp.fromPartial({ deleteKey: key })],
    failureOps: [kv.TxnOp.fromPartial({ deleteKey: other })],
  });
  assert.deepEqual([failed.succeeded, failed.failedCompares], [false, [0]]);
  assert.equal((await fp.get(key))?.value.toString(), "2");
  assert.equal(await fp.get(other), null);
});

test("without a target the client connects to FENCEPOST_ENDPOINT, as the Python SDK and the CLI", async () => {
  const saved = process.env.FENCEPOST_ENDPOINT;
  process.env.FENCEPOST_ENDPOINT = target();
  const fromEnv = new FencepostClient(undefined, { timeoutMs: 10_000 });
  try {
    const key = unique("ts/env");
    await fromEnv.put(key, enc("v"));
    assert.equal((await fp.get(key))?.value.toString(), "v");
  } finally {
    fromEnv.close();
    if (saved === undefined) delete process.env.FENCEPOST_ENDPOINT;
    else process.env.FENCEPOST_ENDPOINT = saved;
  }
});

test("every service of the proto has its client on FencepostClient", async () => {
  // AdminService (erasures) had none: the README promised every service's client
  const op = await fp.call(fp.admin.getOperation.bind(fp.admin), { name: "operations/erase-none" }, { safe: true })
    .catch((err: unknown) => err);
  assert.ok(op instanceof FencepostError && op.reasonString === "OPERATION_NOT_FOUND", String(op));
});

test("FENCEPOST_TLS_* turn TLS on, as for the Python SDK and the CLI: the token never goes out in clear text", async () => {
  // The client read FENCEPOST_ENDPOINT and FENCEPOST_TOKEN but not the TLS
  // variables: set up for a TLS server, it sent the bearer token over plain
  // HTTP/2. Against this plain-text server, a TLS client must fail the handshake.
  const names = ["FENCEPOST_TLS_CA", "FENCEPOST_TLS_CERT", "FENCEPOST_TLS_KEY", "FENCEPOST_TLS_SERVER_NAME"];
  const saved = Object.fromEntries(names.map((n) => [n, process.env[n]]));
  const restore = () => {
    for (const n of names) {
      if (saved[n] === undefined) delete process.env[n];
      else process.env[n] = saved[n];
    }
  };
  try {
    for (const n of names) delete process.env[n];
    process.env.FENCEPOST_TLS_SERVER_NAME = "localhost";
    const tls = new FencepostClient(target(), { timeoutMs: 3_000, retry: NO_RETRY });
    try {
      const err = await tls.get(unique("ts/tls")).then(() => "answered in clear text", (e: unknown) => e);
      assert.ok(err instanceof FencepostError && err.code === status.UNAVAILABLE, String(err));
    } finally {
      tls.close();
    }
    process.env.FENCEPOST_TLS_CA = "/nonexistent/ca.pem";
    assert.throws(() => new FencepostClient(target()), /FENCEPOST_TLS_CA/);
    delete process.env.FENCEPOST_TLS_CA;
    process.env.FENCEPOST_TLS_CERT = "/nonexistent/cert.pem";
    assert.throws(() => new FencepostClient(target()), /FENCEPOST_TLS_CERT.*FENCEPOST_TLS_KEY/);
    // explicit credentials win over the variables; an empty variable counts as unset
    const explicit = new FencepostClient(target(), { timeoutMs: 10_000, credentials: credentials.createInsecure() });
    for (const n of names) process.env[n] = "";
    const unset = new FencepostClient(target(), { timeoutMs: 10_000 });
    try {
      assert.equal(await explicit.get(unique("ts/tls")), null);
      assert.equal(await unset.get(unique("ts/tls")), null);
    } finally {
      explicit.close();
      unset.close();
    }
  } finally {
    restore();
  }
});

test("a token no header can carry is refused by name, as by the Python SDK, and never echoed", () => {
  // A line end kept from a file (FENCEPOST_TOKEN=$(cat token.txt) of a CRLF
  // file) made every call fail with grpc-js's plain Error quoting the whole
  // authorization value: the bearer token went into the caller's logs.
  const saved = process.env.FENCEPOST_TOKEN;
  try {
    for (const make of [
      () => new FencepostClient(target(), { token: "s3cret-token\r" }),
      () => {
        process.env.FENCEPOST_TOKEN = "s3cret-token\n";
        return new FencepostClient(target());
      },
    ]) {
      assert.throws(make, (err: unknown) => {
        const message = err instanceof Error ? err.message : String(err);
        assert.match(message, /FENCEPOST_TOKEN.*position 12/);
        assert.doesNotMatch(message, /s3cret/);
        return true;
      });
    }
  } finally {
    if (saved === undefined) delete process.env.FENCEPOST_TOKEN;
    else process.env.FENCEPOST_TOKEN = saved;
  }
});
