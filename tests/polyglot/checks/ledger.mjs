// LedgerService from JavaScript: a session, a lease, a fenced commit, a
// takeover (by expiry and by a forced release), and LEASE_FENCED decoded from
// the ErrorInfo trailer for the replaced holder.
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

import { assert, expectError, grpc, unary } from "../lib.mjs";

export const name = "LedgerService leases, fenced commits and takeover";
export const services = ["fencepost.v1.LedgerService"];

function readLog(ledger, session_id) {
  return new Promise((resolve, reject) => {
    const out = [];
    const call = ledger.ReadLog({ session_id, from_seq: 1 }, { deadline: new Date(Date.now() + 10_000) });
    call.on("data", (page) => out.push(...page.records));
    call.on("error", reject);
    call.on("end", () => resolve(out));
  });
}

export async function run({ client }) {
  const ledger = client("fencepost.v1.LedgerService");
  const agent = `polyglot-${randomUUID()}`;

  const opened = await unary(ledger, "OpenSession", { agent, session_key: "chan/é" });
  assert.equal(opened.created, true);
  const sid = opened.session.session_id;
  const again = await unary(ledger, "OpenSession", { agent, session_key: "chan/é" });
  assert.deepEqual([again.created, again.session.session_id], [false, sid]);

  // A holds the session (a short ttl, so B can take over after expiry)
  const a = (await unary(ledger, "AcquireLease", { session_id: sid, holder_id: "A", ttl: { seconds: 0, nanos: 200e6 } })).lease;
  assert.equal(a.holder_id, "A");
  assert.equal(a.live, true);
  const first = await unary(ledger, "Commit", {
    session_id: sid, generation: a.generation, expected_seq: 0, records: [Buffer.from("turn-1")], commit_id: randomUUID(),
  });
  assert.equal(first.seq, "1");
  const held = await expectError(
    unary(ledger, "AcquireLease", { session_id: sid, holder_id: "B", ttl: { seconds: 30 } }),
    grpc.status.FAILED_PRECONDITION, "LEASE_HELD",
  );
  assert.equal(held.errorInfo.metadata.holder, "A");

  // takeover 1: A's lease expires, B is granted the next generation
  await sleep(400);
  const b = (await unary(ledger, "AcquireLease", { session_id: sid, holder_id: "B", ttl: { seconds: 30 } })).lease;
  assert.equal(BigInt(b.generation), BigInt(a.generation) + 1n);
  const fenced = await expectError(
    unary(ledger, "Commit", {
      session_id: sid, generation: a.generation, expected_seq: 1, records: [Buffer.from("late")], commit_id: randomUUID(),
    }),
    grpc.status.FAILED_PRECONDITION, "LEASE_FENCED",
  );
  assert.equal(fenced.errorInfo.metadata.generation, String(a.generation));
  assert.equal(fenced.errorInfo.metadata.current_generation, String(b.generation));
  await unary(ledger, "Commit", {
    session_id: sid, generation: b.generation, expected_seq: 1, records: [Buffer.from("turn-2")], commit_id: randomUUID(),
  });

  // takeover 2: B force-releases (its holder gave up), C takes the session
  await unary(ledger, "ReleaseLease", { session_id: sid, generation: b.generation, force: true });
  const c = (await unary(ledger, "AcquireLease", { session_id: sid, holder_id: "C", ttl: { seconds: 30 } })).lease;
  assert.equal(BigInt(c.generation), BigInt(b.generation) + 1n);
  await expectError(
    unary(ledger, "Commit", {
      session_id: sid, generation: b.generation, expected_seq: 2, records: [Buffer.from("late")], commit_id: randomUUID(),
    }),
    grpc.status.FAILED_PRECONDITION, "LEASE_FENCED",
  );
  await expectError(
    unary(ledger, "Commit", {
      session_id: sid, generation: c.generation, expected_seq: 0, records: [Buffer.from("stale")], commit_id: randomUUID(),
    }),
    grpc.status.FAILED_PRECONDITION, "SEQUENCE_MISMATCH",
  );

  const log = await readLog(ledger, sid);
  assert.deepEqual(log.map((r) => [r.seq, Buffer.from(r.data).toString()]), [["1", "turn-1"], ["2", "turn-2"]]);
  await unary(ledger, "ReleaseLease", { session_id: sid, generation: c.generation });
  return `generations ${a.generation}..${c.generation}`;
}
