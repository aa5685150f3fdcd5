// LeasedSession: holds one session's lease the way the Python SDK's Session
// does. It acquires, renews in the background every third of the TTL,
// commits on the current head, and stops for good on LEASE_FENCED (from a
// renewal or a commit): `fenced` is set, `signal` aborts, and every later
// commit throws that error. Other renewal failures: the next tick retries (a
// renewal is idempotent), and a takeover meanwhile shows up as LEASE_FENCED;
// once no renewal has got through for a whole TTL, another holder may own
// the session, so the holder stops as if fenced.
import { status } from "@grpc/grpc-js";

import { FencepostClient } from "./client";
import { ErrorReason, FencepostError, errorFor, isReason } from "./errors";
import { CallOptions } from "./call";

export interface LeasedSessionOptions {
  holderId: string;
  ttlMs: number;
}

export class LeasedSession {
  /** The generation this holder was granted (int64 as a string). */
  readonly generation: string;
  /** The head seq this holder commits on. */
  seq: string;
  /** Set once the lease is lost: the LEASE_FENCED error. */
  fenced: FencepostError | null = null;
  /** Successful background renewals. */
  renewals = 0;
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  /** When the last granted request (acquire or renewal) was sent: the TTL runs from no earlier. */
  private renewedAt: number;

  private constructor(
    readonly client: FencepostClient,
    readonly sessionId: string,
    readonly options: LeasedSessionOptions,
    generation: string,
    seq: string,
    grantedAt: number,
  ) {
    this.renewedAt = grantedAt;
    this.generation = generation;
    this.seq = seq;
  }

  /** Acquire the lease (LEASE_HELD when another holder has it) and start renewing. */
  static async acquire(client: FencepostClient, sessionId: string, options: LeasedSessionOptions): Promise<LeasedSession> {
    const sent = Date.now();
    const lease = await client.acquireLease(sessionId, options.holderId, options.ttlMs);
    let head;
    try {
      head = await client.getSession(sessionId);
    } catch (err) {
      // not holding it for nobody until the TTL runs out: give it back if the server lets us
      await client.releaseLease(sessionId, lease.generation, true).catch(() => undefined);
      throw err;
    }
    const session = new LeasedSession(client, sessionId, options, lease.generation, head.seq, sent);
    session.schedule();
    return session;
  }

  /** Aborts when the lease is lost or the session is released. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get renewEveryMs(): number {
    return this.options.ttlMs / 3;
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => void this.renewOnce(), this.renewEveryMs);
  }

  private async renewOnce(): Promise<void> {
    const sent = Date.now();
    try {
      // a renewal not answered by the end of the TTL is too late: its deadline
      // is what is left of it (a third of the TTL stopped the holder a third late)
      await this.client.renewLease(this.sessionId, this.generation, this.options.holderId, this.options.ttlMs, {
        timeoutMs: Math.max(this.renewedAt + this.options.ttlMs - sent, 1),
      });
      this.renewals += 1;
      this.renewedAt = sent;
    } catch (err) {
      if (isReason(err, ErrorReason.LEASE_FENCED)) {
        this.lost(err);
        return;
      }
      if (Date.now() - this.renewedAt >= this.options.ttlMs) {
        const last = err instanceof Error ? err.message : String(err);
        this.lost(errorFor({
          code: status.FAILED_PRECONDITION,
          reason: "LEASE_FENCED",
          message: `the lease was not renewed within its ttl of ${this.options.ttlMs} ms (last error: ${last})`,
        }, { cause: err }));
        return;
      }
      // the lease may still be alive (UNAVAILABLE past the retries, a deadline): the next tick tries again
    }
    this.schedule();
  }

  private lost(err: FencepostError): void {
    this.fenced = err;
    this.stop();
  }

  /** Stop renewing (the lease then expires on its own). */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    this.controller.abort(this.fenced ?? undefined);
  }

  /** Commit records at the head; throws LEASE_FENCED (and stops) once the lease is lost. */
  async commit(records: Uint8Array[], options: CallOptions & { consumeInboxIds?: string[]; commitId?: string } = {}): Promise<string> {
    if (this.fenced) throw this.fenced;
    if (this.stopped) throw new Error(`session ${this.sessionId} was released by this holder`);
    try {
      const res = await this.client.commit(this.sessionId, this.generation, this.seq, records, options);
      this.seq = res.seq;
      return res.seq;
    } catch (err) {
      if (isReason(err, ErrorReason.LEASE_FENCED)) this.lost(err);
      throw err;
    }
  }

  /** Stop renewing and give the lease up (nothing to release once fenced). */
  async release(force = false): Promise<void> {
    const fenced = this.fenced;
    this.stop();
    if (!fenced) await this.client.releaseLease(this.sessionId, this.generation, force);
  }
}
