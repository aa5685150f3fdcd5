// EvalService from JavaScript: Struct snapshots, Timestamps, typed errors.
import { randomUUID } from "node:crypto";

import { assert, expectError, fromStruct, grpc, toStruct, unary } from "../lib.mjs";

export const name = "EvalService runs, A/B samples and snapshot";
export const services = ["fencepost.v1.EvalService"];

export async function run({ client }) {
  const evals = client("fencepost.v1.EvalService");
  const agent = `polyglot-${randomUUID()}`;

  const snapshot = { status: "running", cases: [1, "two", null], nested: { ok: true } };
  const put = await unary(evals, "PutEvalRun", { agent, run_id: "run-é", snapshot: toStruct(snapshot) });
  assert.equal(put.run.run_id, "run-é");
  await unary(evals, "PutEvalRun", { agent, run_id: "run-é", snapshot: toStruct({ status: "done" }) });
  const listed = await unary(evals, "ListEvalRuns", { agent });
  assert.deepEqual(listed.runs.map((r) => [r.run_id, fromStruct(r.snapshot)]), [["run-é", { status: "done" }]]);
  await expectError(unary(evals, "GetEvalRun", { agent, run_id: "nope" }), grpc.status.NOT_FOUND, "EVAL_RUN_NOT_FOUND");

  const at = { seconds: "1714564800", nanos: 5 };
  await Promise.all(
    Array.from({ length: 16 }, (_, i) =>
      unary(evals, "PutAbSample", {
        agent, experiment: "exp/α", session_id: `s${i}`, at, sample: toStruct({ turn: i }),
      }),
    ),
  );
  const turns = [];
  let token = "";
  do {
    const page = await unary(evals, "ListAbSamples", { agent, experiment: "exp/α", page_size: 5, page_token: token });
    for (const s of page.samples) {
      assert.deepEqual([s.at.seconds, s.at.nanos], [at.seconds, at.nanos]);
      turns.push(fromStruct(s.sample).turn);
    }
    token = page.next_page_token;
  } while (token);
  assert.deepEqual(turns.sort((a, b) => a - b), Array.from({ length: 16 }, (_, i) => i));

  assert.equal((await unary(evals, "GetAbSnapshot", { agent })).found, false);
  await unary(evals, "PutAbSnapshot", { agent, snapshot: toStruct({ v: 1 }) });
  await unary(evals, "PutAbSnapshot", { agent, snapshot: toStruct({ v: 2 }) });
  const snap = await unary(evals, "GetAbSnapshot", { agent });
  assert.deepEqual([snap.found, fromStruct(snap.snapshot)], [true, { v: 2 }]);

  const bad = await expectError(
    unary(evals, "PutAbSample", { agent, experiment: "", session_id: "s", at, sample: toStruct({}) }),
    grpc.status.INVALID_ARGUMENT,
    "FIELD_INVALID",
  );
  assert.deepEqual(bad.fieldViolations.map((v) => v.field), ["experiment"]);
  return `${turns.length} samples`;
}
