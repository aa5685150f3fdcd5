// google.protobuf.Timestamp as the generated code keeps it: `{ seconds, nanos }`
// (seconds an int64 string), never a Date. The server keeps microseconds
// (nanoseconds for an A/B sample's `at`, part of its key) and a Date only
// milliseconds: a time read from the server and sent back as a Date names
// another instant (a re-sent sample lands beside the original instead of
// overwriting it; an imported memory entry moves). Pass Timestamps through
// as received; convert at the edges with these helpers.
import { Timestamp } from "./gen/google/protobuf/timestamp";

export { Timestamp };

const NANOS_PER_SECOND = 1_000_000_000n;

function fromNanos(nanos: bigint): Timestamp {
  // floor division: before 1970 the seconds go down and nanos stay in 0..999,999,999
  let seconds = nanos / NANOS_PER_SECOND;
  let rest = nanos % NANOS_PER_SECOND;
  if (rest < 0n) {
    seconds -= 1n;
    rest += NANOS_PER_SECOND;
  }
  return { seconds: seconds.toString(), nanos: Number(rest) };
}

function toNanos(ts: Timestamp): bigint {
  return BigInt(ts.seconds) * NANOS_PER_SECOND + BigInt(ts.nanos);
}

/** The Timestamp of a Date (exact: a Date holds whole milliseconds). Before
 * 1970 the seconds round down, so nanos stay in 0..999,999,999 (ts-proto's own
 * conversion sent them negative, which the server refuses as FIELD_INVALID). */
export function timestampFromDate(date: Date): Timestamp {
  const ms = date.getTime();
  if (!Number.isFinite(ms)) throw new RangeError("timestampFromDate: invalid Date");
  return fromNanos(BigInt(ms) * 1_000_000n);
}

/** The Date of a Timestamp, rounded down to the millisecond: for display and
 * arithmetic only. Send the Timestamp itself back, never this Date. */
export function dateFromTimestamp(ts: Timestamp): Date {
  return new Date(Number(floorDiv(toNanos(ts), 1_000_000n)));
}

/** The Timestamp `micros` microseconds from the epoch (negative: before 1970). */
export function timestampFromMicros(micros: bigint): Timestamp {
  return fromNanos(micros * 1_000n);
}

/** Microseconds since the epoch, rounded down as the server stores them. */
export function microsFromTimestamp(ts: Timestamp): bigint {
  return floorDiv(toNanos(ts), 1_000n);
}

/** The Timestamp `nanos` nanoseconds from the epoch (negative: before 1970). */
export function timestampFromNanos(nanos: bigint): Timestamp {
  return fromNanos(nanos);
}

/** Nanoseconds since the epoch: every digit a Timestamp holds. */
export function nanosFromTimestamp(ts: Timestamp): bigint {
  return toNanos(ts);
}

/** Now, from the local clock (millisecond resolution). */
export function timestampNow(): Timestamp {
  return timestampFromDate(new Date());
}

/** Negative, zero or positive as `a` is before, at or after `b`, to the nanosecond. */
export function compareTimestamps(a: Timestamp, b: Timestamp): number {
  const d = toNanos(a) - toNanos(b);
  return d < 0n ? -1 : d > 0n ? 1 : 0;
}

function floorDiv(a: bigint, b: bigint): bigint {
  const q = a / b;
  return a % b < 0n ? q - 1n : q;
}
