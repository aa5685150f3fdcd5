// LeasedSession against a live server: acquire, renew every third of the TTL,
// commit on the head, and stop for good when a takeover fences it.
import assert from "node:assert/strict";
import { once } from "node:events";
import { after, test } from "node:test";

import { status } from "@grpc/grpc-js";

import { ErrorReason, FencepostClient, FencepostError, LeasedSession } from "../src";
import { expectReason, newClient, unique } from "./support";

const fp = newClient();
after(() => fp.close());
const enc = (s: string) => Buffer.from(s);

async function until(what: string, ok: () => boolean): Promise<void> {
  for (let i = 0; i < 400 && !ok(); i++) await new Promise((r) => setTimeout(r, 50));
  assert.ok(ok(), `gave up waiting for ${what}`);
}

test("acquires, renews at a third of the TTL, commits on the head, releases", async () => {
  const { sessionId } = await fp.openSession(unique("ts-agent"), "s");
  const s = await LeasedSession.acquire(fp, sessionId, { holderId: "A", ttlMs: 600 });
  assert.equal(s.renewEveryMs, 200);
  assert.equal(await s.commit([enc("turn-1")]), "1");
  await until("two renewals", () => s.renewals >= 2);
  assert.equal(await s.commit([enc("turn-2"), enc("turn-3")]), "3");
  await expectReason(fp.acquireLease(sessionId, "B", 30_000), status.FAILED_PRECONDITION, ErrorReason.LEASE_HELD);
  await s.release();
  assert.equal(s.signal.aborted, true);
  const b = await fp.acquireLease(sessionId, "B", 30_000);
  assert.equal(BigInt(b.generation), BigInt(s.generation) + 1n);
});

test("a takeover fences the old holder at its next renewal: it stops and never commits again", async () => {
  const { sessionId } = await fp.openSession(unique("ts-agent"), "s");
  const a = await LeasedSession.acquire(fp, sessionId, { holderId: "A", ttlMs: 600 });
  await a.commit([enc("a-1")]);
  const aborted = once(a.signal, "abort");
  // the takeover: A's lease is force-released (its holder was declared gone) and B is granted
  await fp.releaseLease(sessionId, a.generation, true);
  const b = await LeasedSession.acquire(fp, sessionId, { holderId: "B", ttlMs: 30_000 });
  await aborted;
  assert.equal(a.fenced?.reason, ErrorReason.LEASE_FENCED);
  assert.equal(a.fenced?.metadata.generation, a.generation);
  const renewals = a.renewals;
  await expectReason(a.commit([enc("a-late")]), status.FAILED_PRECONDITION, ErrorReason.LEASE_FENCED);
  assert.equal(await b.commit([enc("b-1")]), "2");
  assert.equal(a.renewals, renewals);
  await b.release();
});

test("a commit that meets the takeover first stops the session too", async () => {
  const { sessionId } = await fp.openSession(unique("ts-agent"), "s");
  const a = await LeasedSession.acquire(fp, sessionId, { holderId: "A", ttlMs: 60_000 }); // next renewal in 20 s
  await fp.releaseLease(sessionId, a.generation, true);
  const b = await fp.acquireLease(sessionId, "B", 30_000);
  const fenced = await expectReason(a.commit([enc("a-late")]), status.FAILED_PRECONDITION, ErrorReason.LEASE_FENCED);
  assert.equal(fenced.metadata.current_generation, b.generation);
  assert.equal(a.signal.aborted, true);
  assert.equal(a.fenced, fenced);
  await a.release(); // nothing to release once fenced: no call, no error
});

// A ledger that grants the lease and then fails as told (what a live server does not do on its own).
function flakyLedger(fail: { renew?: Error; head?: Error }) {
  const calls = { renewals: 0, released: [] as string[] };
  const ledger = {
    acquireLease: async () => ({ generation: "7" }),
    getSession: async () => {
      if (fail.head) throw fail.head;
      return { seq: "0" };
    },
    renewLease: async () => {
      calls.renewals += 1;
      if (fail.renew) throw fail.renew;
      return { generation: "7" };
    },
    releaseLease: async (_sid: string, generation: string) => {
      calls.released.push(generation);
      return "0";
    },
  };
  return { ledger: ledger as unknown as typeof fp, calls };
}

test("renewals failing for a whole TTL stop the holder as fenced: another holder may own the session", async () => {
  const gone = new FencepostError({ code: status.UNAVAILABLE, message: "server gone" });
  const { ledger, calls } = flakyLedger({ renew: gone });
  const s = await LeasedSession.acquire(ledger, "sid", { holderId: "A", ttlMs: 300 });
  await until("the holder to stop", () => s.fenced !== null);
  assert.equal(s.fenced?.reason, ErrorReason.LEASE_FENCED);
  assert.match(s.fenced?.message ?? "", /server gone/);
  assert.equal(s.signal.aborted, true);
  assert.ok(calls.renewals >= 2, "it kept trying while the lease could still be alive");
  await assert.rejects(s.commit([enc("late")]), (err: unknown) => err === s.fenced);
});

test("a failed read right after the grant gives the lease back", async () => {
  const gone = new FencepostError({ code: status.UNAVAILABLE, message: "server gone" });
  const { ledger, calls } = flakyLedger({ head: gone });
  await assert.rejects(LeasedSession.acquire(ledger, "sid", { holderId: "A", ttlMs: 30_000 }), (err: unknown) => err === gone);
  assert.deepEqual(calls.released, ["7"]);
});

test("a renewal that never answers fences the holder when the TTL runs out, not a renewal period later", async () => {
  // every renewal hangs until its deadline (the client's 30 s default when it has none)
  const timeouts: (number | undefined)[] = [];
  const stalled = {
    acquireLease: async () => ({ generation: "1" }),
    getSession: async () => ({ seq: "0" }),
    releaseLease: async () => "0",
    renewLease: (_s: string, _g: string, _h: string, _ttl: number, options: { timeoutMs?: number } = {}) => {
      timeouts.push(options.timeoutMs);
      return new Promise((_resolve, reject) => setTimeout(
        () => reject(new FencepostError({ code: status.DEADLINE_EXCEEDED, message: "Deadline Exceeded" })),
        options.timeoutMs ?? 30_000,
      ));
    },
  };
  const ttlMs = 3_000; // a renewal period (1 s) late is what the bound below catches
  const start = Date.now();
  const s = await LeasedSession.acquire(stalled as unknown as FencepostClient, "sid", { holderId: "A", ttlMs });
  try {
    await until("the holder to stop", () => s.fenced !== null);
    const lostAfter = Date.now() - start;
    assert.ok(lostAfter >= ttlMs && lostAfter < ttlMs + 600, `stopped after ${lostAfter} ms`);
    assert.ok(s.fenced instanceof FencepostError && s.fenced.reason === ErrorReason.LEASE_FENCED);
    assert.ok(timeouts.every((t) => t !== undefined && t <= ttlMs), JSON.stringify(timeouts));
  } finally {
    s.stop();
  }
});
