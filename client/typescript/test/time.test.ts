// google.protobuf.Timestamp: the server keeps microseconds (nanoseconds for an
// A/B sample's `at`), a Date milliseconds. Times travel as `{ seconds, nanos }`
// and come back exactly; Dates before 1970 become valid Timestamps.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { BinaryWriter } from "@bufbuild/protobuf/wire";

import {
  Timestamp, compareTimestamps, dateFromTimestamp, evals, memory, microsFromTimestamp, nanosFromTimestamp,
  timestampFromDate, timestampFromMicros, timestampFromNanos,
} from "../src";
import { newClient, unique } from "./support";

const fp = newClient();
after(() => fp.close());

const ts = (seconds: string, nanos: number): Timestamp => ({ seconds, nanos });

test("a Timestamp decoded from the server re-encodes to the same bytes", () => {
  const w = new BinaryWriter();
  w.uint32(10).string("exp");
  Timestamp.encode(ts("1700000000", 123_456_789), w.uint32(26).fork()).join();
  const wire = w.finish();
  assert.deepEqual(Buffer.from(evals.AbSample.encode(evals.AbSample.decode(wire)).finish()), Buffer.from(wire));
});

test("timestampFromDate keeps nanos in 0..999,999,999 before 1970", () => {
  assert.deepEqual(timestampFromDate(new Date(-1)), ts("-1", 999_000_000));
  assert.deepEqual(timestampFromDate(new Date(-1500)), ts("-2", 500_000_000));
  assert.deepEqual(timestampFromDate(new Date(-2000)), ts("-2", 0));
  assert.deepEqual(timestampFromDate(new Date(1500)), ts("1", 500_000_000));
  assert.deepEqual(timestampFromDate(new Date("0001-01-01T00:00:00.001Z")), ts("-62135596800", 1_000_000));
  assert.throws(() => timestampFromDate(new Date("not a date")), RangeError);
  for (const ms of [-62135596800000, -1500, -1, 0, 1, 1700000000123]) {
    assert.equal(dateFromTimestamp(timestampFromDate(new Date(ms))).getTime(), ms);
  }
});

test("dateFromTimestamp rounds down; the micro and nano helpers are exact", () => {
  assert.equal(dateFromTimestamp(ts("-1", 999_999_999)).getTime(), -1);
  assert.equal(dateFromTimestamp(ts("1", 999_999)).getTime(), 1000);
  assert.deepEqual(timestampFromMicros(-1n), ts("-1", 999_999_000));
  assert.deepEqual(timestampFromMicros(1_700_000_000_123_456n), ts("1700000000", 123_456_000));
  assert.equal(microsFromTimestamp(ts("-1", 999_999_999)), -1n);
  assert.equal(microsFromTimestamp(ts("1700000000", 123_456_789)), 1_700_000_000_123_456n);
  assert.deepEqual(timestampFromNanos(-1n), ts("-1", 999_999_999));
  assert.equal(nanosFromTimestamp(ts("253402300799", 999_999_999)), 253_402_300_799_999_999_999n);
  assert.equal(compareTimestamps(ts("5", 1), ts("5", 2)), -1);
  assert.equal(compareTimestamps(ts("-1", 999_999_999), ts("0", 0)), -1);
  assert.equal(compareTimestamps(ts("7", 3), ts("7", 3)), 0);
  assert.equal(compareTimestamps(ts("8", 0), ts("7", 999_999_999)), 1);
});

test("JSON keeps every digit and reads times before 1970 as valid Timestamps", () => {
  const entry = memory.MemoryEntry.fromPartial({ id: "m", createdAt: ts("1700000000", 123_456_000), validFrom: ts("-2", 500_000_001) });
  const json = memory.MemoryEntry.toJSON(entry) as Record<string, unknown>;
  assert.deepEqual([json.createdAt, json.validFrom], ["2023-11-14T22:13:20.123456Z", "1969-12-31T23:59:58.500000001Z"]);
  assert.deepEqual(memory.MemoryEntry.fromJSON(json), entry);
  const parsed = memory.MemoryEntry.fromJSON({ id: "m", createdAt: "1969-12-31T23:59:58.500123Z", validFrom: new Date(-1500) });
  assert.deepEqual([parsed.createdAt, parsed.validFrom], [ts("-2", 500_123_000), ts("-2", 500_000_000)]);
});

const listSamples = (agent: string) =>
  fp.call(fp.evals.listAbSamples.bind(fp.evals), { agent, experiment: "e", sessionId: "", pageSize: 0, pageToken: "" }, { safe: true });
const putSample = (agent: string, at: Timestamp, sample: Record<string, unknown>) =>
  fp.call(fp.evals.putAbSample.bind(fp.evals), { agent, experiment: "e", sessionId: "s", at, sample, requestId: "" }, { safe: true });

test("an instant before 1970 with a millisecond part is accepted and read back", async () => {
  const agent = unique("ts-agent");
  await putSample(agent, timestampFromDate(new Date(-1500)), { n: 1 }); // 1969-12-31T23:59:58.500Z
  const { samples } = await listSamples(agent);
  assert.deepEqual(samples.map((s) => s.at), [ts("-2", 500_000_000)]);
});

test("a sample re-sent with the `at` it was read with overwrites itself", async () => {
  const agent = unique("ts-agent");
  await putSample(agent, ts("1700000000", 123_456_789), { n: 1 });
  const [read] = (await listSamples(agent)).samples;
  await putSample(agent, read.at!, { n: 2 });
  const { samples } = await listSamples(agent);
  assert.deepEqual(samples.map((s) => [s.at, s.sample]), [[ts("1700000000", 123_456_789), { n: 2 }]]);
});

const audit = async (agentId: string) =>
  (await fp.call(fp.memory.audit.bind(fp.memory), { agentId, pageSize: 0, pageToken: "" }, { safe: true })).entries;
const importEntries = (agentId: string, entries: memory.MemoryEntry[]) =>
  fp.call(fp.memory.import.bind(fp.memory), { agentId, entries }, { safe: true });

test("Audit -> Import keeps every time exactly", async () => {
  const from = unique("ts-mem");
  const to = unique("ts-mem");
  const validFrom = timestampFromDate(new Date(-1500));
  const validUntil = timestampFromMicros(4_102_444_800_000_001n); // 2100-01-01T00:00:00.000001Z
  await fp.call(
    fp.memory.append.bind(fp.memory),
    memory.MemoryServiceAppendRequest.fromPartial({ agentId: from, content: "a fact", validFrom, validUntil, requestId: unique("r") }),
    { safe: true },
  );
  const original = await audit(from);
  assert.deepEqual([original[0].validFrom, original[0].validUntil], [validFrom, validUntil]);
  assert.equal((await importEntries(to, original)).imported, 1);
  const copied = await audit(to);
  const times = (e: memory.MemoryEntry) => [e.id, e.createdAt, e.validFrom, e.validUntil];
  assert.deepEqual(copied.map(times), original.map(times));
});

test("two entries written within one millisecond keep their order through Import", async () => {
  const agent = unique("ts-mem");
  // ids sort against time order: a tie on created_at (times cut to the
  // millisecond) would put m-a first
  const entry = (id: string, nanos: number) =>
    memory.MemoryEntry.fromPartial({ id, content: `fact ${id}`, createdAt: ts("1700000000", nanos) });
  await importEntries(agent, [entry("m-b", 123_400_000), entry("m-a", 123_900_000)]);
  const list = await fp.call(fp.memory.list.bind(fp.memory), memory.MemoryServiceListRequest.fromPartial({ agentId: agent }), { safe: true });
  assert.deepEqual(list.entries.map((e) => [e.id, e.createdAt]), [["m-b", ts("1700000000", 123_400_000)], ["m-a", ts("1700000000", 123_900_000)]]);
});
