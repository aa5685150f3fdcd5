// A runnable tour of the TypeScript client (see README.md):
//   npm ci && npx tsc -p . && FENCEPOST_ENDPOINT=127.0.0.1:50051 node dist/example/quickstart.js
import { randomUUID } from "node:crypto";

import { ErrorReason, FencepostClient, LeasedSession, authorKv, dateFromTimestamp, isReason } from "../src";

async function main(): Promise<void> {
  const fp = new FencepostClient(undefined, { timeoutMs: 5_000 }); // FENCEPOST_ENDPOINT, else 127.0.0.1:50051
  try {
    // KV with compare-and-set: a failed compare is a result, not an error
    const key = authorKv("quickstart")(`greeting ${randomUUID()}`);
    const version = await fp.put(key, Buffer.from("hello"));
    const cas = await fp.putIfVersion(key, Buffer.from("hello again"), version);
    console.log(`put ${key} -> ${version}; compare-and-set applied=${cas.applied}`);

    // typed errors: the ErrorInfo reason as an enum
    try {
      await fp.get("");
    } catch (err) {
      if (isReason(err, ErrorReason.KEY_INVALID)) console.log(`empty key refused: ${err.reasonString} (${err.codeName})`);
      else throw err;
    }

    // a session held by this process: renewed in the background, fenced on takeover
    // times are Timestamps ({ seconds, nanos }, every digit the server sent): send back
    // what was read; a Date (milliseconds) is for display
    const { sessionId, createTime } = await fp.openSession("quickstart", `chat-${randomUUID()}`);
    console.log(`session opened at ${dateFromTimestamp(createTime!).toISOString()} (${createTime!.seconds} s + ${createTime!.nanos} ns)`);
    const session = await LeasedSession.acquire(fp, sessionId, { holderId: `pod-${process.pid}`, ttlMs: 10_000 });
    const seq = await session.commit([Buffer.from("turn 1"), Buffer.from("turn 2")]);
    console.log(`session ${sessionId}: generation ${session.generation}, head seq ${seq}`);
    await session.release();
  } finally {
    fp.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
