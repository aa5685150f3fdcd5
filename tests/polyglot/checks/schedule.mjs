// ScheduleService from JavaScript: a reminder created under a lease, listed
// with its derived status, an unsupported rule refused, and a Dispatch by a
// replaced holder refused with LEASE_FENCED.
import { randomUUID } from "node:crypto";

import { assert, expectError, grpc, unary } from "../lib.mjs";

export const name = "ScheduleService reminders under the session lease";
export const services = ["fencepost.v1.LedgerService", "fencepost.v1.ScheduleService"];

export async function run({ client }) {
  const ledger = client("fencepost.v1.LedgerService");
  const schedule = client("fencepost.v1.ScheduleService");
  const agent = `polyglot-${randomUUID()}`;
  const sid = (await unary(ledger, "OpenSession", { agent, session_key: "k" })).session.session_id;
  const a = (await unary(ledger, "AcquireLease", { session_id: sid, holder_id: "A", ttl: { seconds: 30 } })).lease;

  const made = await unary(schedule, "CreateReminder", {
    session_id: sid, generation: a.generation, prompt: "  follow up  ", after_seconds: 3600,
  });
  assert.deepEqual(
    [made.reminder.id, made.reminder.prompt, made.reminder.status, made.reminder.delivery_mode],
    ["rem_1", "follow up", "REMINDER_STATUS_SCHEDULED", "DELIVERY_MODE_SESSION_LOCAL"],
  );
  const listed = await unary(schedule, "ListReminders", { session_id: sid });
  assert.deepEqual(listed.reminders.map((r) => r.id), ["rem_1"]);
  assert.equal(listed.next_page_token, "");
  assert.deepEqual((await unary(schedule, "DueReminders", { session_id: sid })).reminders, []);

  const rule = await expectError(
    unary(schedule, "CreateReminder", { session_id: sid, generation: a.generation, prompt: "p", cron: "0 9 * * *" }),
    grpc.status.INVALID_ARGUMENT, "RULE_UNSUPPORTED",
  );
  assert.equal(rule.errorInfo.metadata.rule, "cron");
  await expectError(
    unary(schedule, "CreateReminder", { session_id: sid, generation: a.generation, prompt: " ", after_seconds: 5 }),
    grpc.status.INVALID_ARGUMENT, "REMINDER_INVALID",
  );

  await unary(ledger, "ReleaseLease", { session_id: sid, generation: a.generation, force: true });
  const b = (await unary(ledger, "AcquireLease", { session_id: sid, holder_id: "B", ttl: { seconds: 30 } })).lease;
  await expectError(
    unary(schedule, "Dispatch", { session_id: sid, generation: a.generation, id: "rem_1" }),
    grpc.status.FAILED_PRECONDITION, "LEASE_FENCED",
  );
  const deleted = await unary(schedule, "DeleteReminder", { session_id: sid, generation: b.generation, id: "rem_1" });
  assert.equal(deleted.found, true);
  assert.deepEqual((await unary(schedule, "ListReminders", { session_id: sid })).reminders, []);
  await unary(ledger, "ReleaseLease", { session_id: sid, generation: b.generation });
}
