// LeasedSession: holds one session's lease the way the Python SDK's Session
// does. It acquires, renews in the background every third of the TTL,
// commits on the current head, and stops for good on LEASE_FENCED (from a
// renewal or a commit): `fenced` is set, `signal` aborts, and every later
// commit throws that error. Other renewal failures are transient: the next
// tick retries (a renewal is idempotent), and a takeover meanwhile shows up
// as LEASE_FENCED.
import { FencepostClient } from "./client";
import { ErrorReason, FencepostError, isReason } from "./errors";
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

  private constructor(
    readonly client: FencepostClient,
    readonly sessionId: string,
    readonly options: LeasedSessionOptions,
    generation: string,
    seq: string,
  ) {
    this.generation = generation;
    this.seq = seq;
  }

  /** Acquire the lease (LEASE_HELD when another holder has it) and start renewing. */
  static async acquire(client: FencepostClient, sessionId: string, options: LeasedSessionOptions): Promise<LeasedSession> {
    const lease = await client.acquireLease(sessionId, options.holderId, options.ttlMs);
    const head = await client.getSession(sessionId);
    const session = new LeasedSession(client, sessionId, options, lease.generation, head.seq);
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
    try {
      await this.client.renewLease(this.sessionId, this.generation, this.options.holderId, this.options.ttlMs, {
        timeoutMs: this.renewEveryMs,
      });
      this.renewals += 1;
    } catch (err) {
      if (isReason(err, ErrorReason.LEASE_FENCED)) {
        this.lost(err);
        return;
      }
      // transient (UNAVAILABLE past the retries, a deadline): the next tick tries again
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
