// FencepostClient: one channel, every generated service client, and typed
// helpers for KV / compare-and-set and the ledger calls a session needs.
// Any other RPC: `fp.call(fp.memory.append.bind(fp.memory), request, { safe })`,
// or for a server stream `fp.stream(fp.ledger.readLog.bind(fp.ledger), request)`.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { Channel, ChannelCredentials, ChannelOptions, credentials as grpcCredentials, status } from "@grpc/grpc-js";

import {
  CallOptions, DEFAULT_RETRY, RetryPolicy, StreamMethod, StreamOptions, UnaryMethod, callStream, callUnary,
} from "./call";
import { DOMAIN, errorFor } from "./errors";
import { AdminServiceClient } from "./gen/fencepost/v1/admin";
import { EvalServiceClient } from "./gen/fencepost/v1/evals";
import { JournalServiceClient } from "./gen/fencepost/v1/journal";
import { Compare, KeyValue, KvServiceClient, TxnOp, TxnResponse } from "./gen/fencepost/v1/kv";
import { Lease, LedgerServiceClient, Session } from "./gen/fencepost/v1/ledger";
import { MemoryServiceClient } from "./gen/fencepost/v1/memory";
import { ScheduleServiceClient } from "./gen/fencepost/v1/schedule";
import { StoreApiServiceClient } from "./gen/fencepost/v1/store_api";
import { newRequestId } from "./ids";

export interface ClientOptions extends CallOptions {
  /** Default: TLS when a FENCEPOST_TLS_* variable is set, else insecure (loopback development). */
  credentials?: ChannelCredentials;
  channelOptions?: ChannelOptions;
  /** Bearer token, sent as `authorization: Bearer ...` (replacing one `metadata` names). Default:
   * FENCEPOST_TOKEN, unless `metadata` names an authorization; "" sends none. */
  token?: string;
}

/** Where a client without a target connects when FENCEPOST_ENDPOINT is unset (as the Python SDK and CLI). */
export const DEFAULT_ENDPOINT = "127.0.0.1:50051";

/** Each call's deadline when the client's options name none (the Python SDK's DEFAULT_TIMEOUT);
 * `timeoutMs: undefined`, given explicitly, sends calls without one. */
export const DEFAULT_TIMEOUT_MS = 30_000;

/** TLS from the variables the Python SDK and the CLI read (client/fencepost/_env.py): any of
 * them turns TLS on; undefined when none is set (an empty one counts as unset). A bearer token
 * then never goes out over a plain-text channel to a server set up for TLS. */
export function tlsFromEnv(env: NodeJS.ProcessEnv = process.env): { credentials: ChannelCredentials; channelOptions: ChannelOptions } | undefined {
  const ca = env.FENCEPOST_TLS_CA || "";
  const cert = env.FENCEPOST_TLS_CERT || "";
  const key = env.FENCEPOST_TLS_KEY || "";
  const serverName = env.FENCEPOST_TLS_SERVER_NAME || "";
  if (!ca && !cert && !key && !serverName) return undefined;
  if (!cert !== !key) {
    throw new Error("a TLS client certificate and key go together (FENCEPOST_TLS_CERT / FENCEPOST_TLS_KEY)");
  }
  const read = (path: string, variable: string): Buffer | null => {
    if (!path) return null;
    try {
      return readFileSync(path);
    } catch (err) {
      throw new Error(`cannot read the TLS file ${path} (${variable}): ${(err as Error).message}`);
    }
  };
  const credentials = grpcCredentials.createSsl(
    read(ca, "FENCEPOST_TLS_CA"), read(key, "FENCEPOST_TLS_KEY"), read(cert, "FENCEPOST_TLS_CERT"),
  );
  return { credentials, channelOptions: serverName ? { "grpc.ssl_target_name_override": serverName } : {} };
}

/** The token itself, when a header can carry it (printable ASCII), as the Python
 * SDK's `check_token`. Anything else fails here, by position and never quoting the
 * token, instead of at every call with grpc-js's error quoting the whole header. The
 * usual cause is a line end kept from a file (`FENCEPOST_TOKEN=$(cat token.txt)`). */
function checkToken(token: string): string {
  for (let at = 0; at < token.length; at++) {
    const c = token.charCodeAt(at);
    if (c < 0x20 || c > 0x7e) {
      throw new Error(`the bearer token (FENCEPOST_TOKEN or the token option) has ${JSON.stringify(token[at])} at `
        + `position ${at}: a token is printable ASCII only (a line end copied from a file?)`);
    }
  }
  return token;
}

/** An entry read with its version. */
export interface Entry {
  key: string;
  value: Buffer;
  version: string;
}

/** The outcome of a compare-and-set: a failed compare is a result, not an error. */
export interface CasResult {
  applied: boolean;
  /** The new version when applied, else the current one ("" when absent). */
  version: string;
}

export interface Page<T> {
  items: T[];
  nextPageToken: string;
}

export interface WriteOptions extends CallOptions {
  /** AIP-155 request id; filled in when absent, which makes the write safe to retry.
   * `""` sends none: a conditional write or Txn is then never resent. */
  requestId?: string;
}

export interface TxnRequestInit {
  compares?: Compare[];
  successOps?: TxnOp[];
  failureOps?: TxnOp[];
}

/** Whether a conditional write may be resent: only with its request id. Sent
 * with `requestId: ""` (none), its first attempt may have applied, and a resend
 * would answer `applied = false` against the caller's own write, or apply a
 * Txn's failure branch after its success branch. */
const resendable = (requestId: string) => requestId !== "";

/** A UTF-16 surrogate without its pair: text no UTF-8 can carry. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Refuses a string field that is not well-formed Unicode, before it is sent.
 * protobuf would encode each lone surrogate as U+FFFD, so "k\uD83D" and
 * "k\uDBFF" (strings cut inside an emoji, say) would both name the stored key
 * "k\uFFFD": a write to one overwrites the other. The error is the server's
 * for a key (KEY_INVALID) or another field (FIELD_INVALID) that is not UTF-8. */
function checkText(field: string, value: string, reason: "KEY_INVALID" | "FIELD_INVALID" = "FIELD_INVALID"): void {
  if (!LONE_SURROGATE.test(value)) return;
  const message = `${field} is not valid UTF-8 (it holds a lone surrogate)`;
  throw errorFor({
    code: status.INVALID_ARGUMENT, message, reason, domain: DOMAIN, fieldViolations: { [field]: message },
  });
}

const checkKey = (field: string, key: string) => checkText(field, key, "KEY_INVALID");

function checkOps(field: string, ops: TxnOp[]): void {
  ops.forEach((op, i) => {
    if (op.put) checkKey(`${field}[${i}].put.key`, op.put.key);
    if (op.deleteKey !== undefined) checkKey(`${field}[${i}].delete_key`, op.deleteKey);
  });
}

/** The write's request id: the caller's (checked), else a fresh one. */
function requestIdOf(options: WriteOptions): string {
  if (options.requestId === undefined) return newRequestId();
  checkText("request_id", options.requestId);
  return options.requestId;
}

/** A Duration of `ms` milliseconds, rounded to whole nanoseconds (an int32
 * field: a fraction, as in a TTL of 10 / 3 * 1000 ms, failed the encoding). */
function msToDuration(ms: number): { seconds: string; nanos: number } {
  const nanos = BigInt(Math.round(ms * 1e6));
  return { seconds: String(nanos / 1_000_000_000n), nanos: Number(nanos % 1_000_000_000n) };
}

export class FencepostClient {
  readonly channel: Channel;
  readonly kv: KvServiceClient;
  readonly ledger: LedgerServiceClient;
  readonly memory: MemoryServiceClient;
  readonly journal: JournalServiceClient;
  readonly storeApi: StoreApiServiceClient;
  readonly schedule: ScheduleServiceClient;
  readonly evals: EvalServiceClient;
  readonly admin: AdminServiceClient;
  private readonly defaults: CallOptions;

  /** `target` (host:port) defaults to FENCEPOST_ENDPOINT, else 127.0.0.1:50051, the token to
   * FENCEPOST_TOKEN, and the credentials to TLS when any of FENCEPOST_TLS_CA, FENCEPOST_TLS_CERT /
   * FENCEPOST_TLS_KEY, FENCEPOST_TLS_SERVER_NAME is set (else insecure): the variables the Python
   * SDK and the CLI read (an empty one counts as unset). */
  constructor(target?: string, options: ClientOptions = {}) {
    target = target || process.env.FENCEPOST_ENDPOINT || DEFAULT_ENDPOINT;
    const token = checkToken(options.token ?? (process.env.FENCEPOST_TOKEN || ""));
    // One authorization (keys compare lowercase, as gRPC's): a `token` option replaces the
    // metadata's, FENCEPOST_TOKEN only fills in (the Python SDK's rule).
    const own = Object.entries(options.metadata ?? {});
    const named = own.some(([k]) => k.toLowerCase() === "authorization");
    const metadata = token && (options.token !== undefined || !named)
      ? { ...Object.fromEntries(own.filter(([k]) => k.toLowerCase() !== "authorization")), authorization: `Bearer ${token}` }
      : options.metadata;
    const tls = options.credentials ? undefined : tlsFromEnv();
    const creds = options.credentials ?? tls?.credentials ?? grpcCredentials.createInsecure();
    this.channel = new Channel(target, creds, { ...tls?.channelOptions, ...options.channelOptions });
    const shared = { channelOverride: this.channel };
    this.kv = new KvServiceClient(target, creds, shared);
    this.ledger = new LedgerServiceClient(target, creds, shared);
    this.memory = new MemoryServiceClient(target, creds, shared);
    this.journal = new JournalServiceClient(target, creds, shared);
    this.storeApi = new StoreApiServiceClient(target, creds, shared);
    this.schedule = new ScheduleServiceClient(target, creds, shared);
    this.evals = new EvalServiceClient(target, creds, shared);
    this.admin = new AdminServiceClient(target, creds, shared);
    // A call without a deadline to a server that stalls never returns.
    const timeoutMs = "timeoutMs" in options ? options.timeoutMs : DEFAULT_TIMEOUT_MS;
    this.defaults = { timeoutMs, metadata, retry: options.retry ?? DEFAULT_RETRY };
  }

  close(): void {
    this.channel.close();
  }

  /** Any unary RPC with the client's deadline, metadata and retry rules.
   * `safe`: a read, or a write carrying a request id (retried on UNAVAILABLE). */
  call<Req, Res>(method: UnaryMethod<Req, Res>, request: Req, options: CallOptions & { safe: boolean }): Promise<Res> {
    return callUnary(method, request, options.safe, this.defaults, options);
  }

  /** Any server-streaming RPC (ReadLog, WatchInbox, ReadJournal, ReadArchive,
   * WatchDue) with the client's metadata; its messages as they arrive, a
   * failure as a FencepostError. No deadline unless `timeoutMs` is given. */
  stream<Req, Res>(method: StreamMethod<Req, Res>, request: Req, options: StreamOptions = {}): AsyncGenerator<Res> {
    return callStream(method, request, this.defaults, options);
  }

  // -- KV ------------------------------------------------------------------
  async put(key: string, value: Uint8Array, options: WriteOptions = {}): Promise<string> {
    checkKey("key", key);
    const req = { key, value: Buffer.from(value), requestId: requestIdOf(options) };
    return (await this.call(this.kv.put.bind(this.kv), req, { ...options, safe: true })).version;
  }

  /** The entry, or null on a miss (a miss is never an error). */
  async get(key: string, options: CallOptions = {}): Promise<Entry | null> {
    checkKey("key", key);
    const res = await this.call(this.kv.get.bind(this.kv), { key }, { ...options, safe: true });
    return res.found ? { key, value: Buffer.from(res.value), version: res.version } : null;
  }

  async getWithVersion(key: string, options: CallOptions = {}): Promise<Entry | null> {
    checkKey("key", key);
    const res = await this.call(this.kv.getWithVersion.bind(this.kv), { key }, { ...options, safe: true });
    return res.found ? { key, value: Buffer.from(res.value), version: res.version } : null;
  }

  /** Whether the key existed. */
  async delete(key: string, options: WriteOptions = {}): Promise<boolean> {
    checkKey("key", key);
    const req = { key, requestId: requestIdOf(options) };
    return (await this.call(this.kv.delete.bind(this.kv), req, { ...options, safe: true })).existed;
  }

  async putIfAbsent(key: string, value: Uint8Array, options: WriteOptions = {}): Promise<CasResult> {
    checkKey("key", key);
    const req = { key, value: Buffer.from(value), requestId: requestIdOf(options) };
    const res = await this.call(this.kv.putIfAbsent.bind(this.kv), req, { ...options, safe: resendable(req.requestId) });
    return { applied: res.applied, version: res.version };
  }

  async putIfVersion(key: string, value: Uint8Array, expectedVersion: string, options: WriteOptions = {}): Promise<CasResult> {
    checkKey("key", key);
    const req = { key, value: Buffer.from(value), expectedVersion, requestId: requestIdOf(options) };
    const res = await this.call(this.kv.putIfVersion.bind(this.kv), req, { ...options, safe: resendable(req.requestId) });
    return { applied: res.applied, version: res.version };
  }

  async deleteIfVersion(key: string, expectedVersion: string, options: WriteOptions = {}): Promise<CasResult> {
    checkKey("key", key);
    const req = { key, expectedVersion, requestId: requestIdOf(options) };
    const res = await this.call(this.kv.deleteIfVersion.bind(this.kv), req, { ...options, safe: resendable(req.requestId) });
    return { applied: res.applied, version: res.version };
  }

  /** One page of entries under `prefix` (AIP-158: an empty token ends the listing). */
  async list(prefix: string, page: { pageSize?: number; pageToken?: string } = {}, options: CallOptions = {}): Promise<Page<Entry>> {
    checkKey("prefix", prefix);
    const req = { prefix, pageSize: page.pageSize ?? 0, pageToken: page.pageToken ?? "" };
    const res = await this.call(this.kv.list.bind(this.kv), req, { ...options, safe: true });
    return { items: res.entries.map((e: KeyValue) => ({ ...e, value: Buffer.from(e.value) })), nextPageToken: res.nextPageToken };
  }

  /** Every entry under `prefix`, page after page. */
  async *listAll(prefix: string, pageSize = 0, options: CallOptions = {}): AsyncGenerator<Entry> {
    let pageToken = "";
    do {
      const page = await this.list(prefix, { pageSize, pageToken }, options);
      yield* page.items;
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  async listKeys(prefix: string, page: { pageSize?: number; pageToken?: string } = {}, options: CallOptions = {}): Promise<Page<string>> {
    checkKey("prefix", prefix);
    const req = { prefix, pageSize: page.pageSize ?? 0, pageToken: page.pageToken ?? "" };
    const res = await this.call(this.kv.listKeys.bind(this.kv), req, { ...options, safe: true });
    return { items: res.keys, nextPageToken: res.nextPageToken };
  }

  /** Atomic compare-then-apply (a failed compare is `succeeded = false`). */
  async txn(init: TxnRequestInit, options: WriteOptions = {}): Promise<TxnResponse> {
    (init.compares ?? []).forEach((c, i) => checkKey(`compares[${i}].key`, c.key));
    checkOps("success_ops", init.successOps ?? []);
    checkOps("failure_ops", init.failureOps ?? []);
    const req = {
      compares: init.compares ?? [],
      successOps: init.successOps ?? [],
      failureOps: init.failureOps ?? [],
      requestId: requestIdOf(options),
    };
    return this.call(this.kv.txn.bind(this.kv), req, { ...options, safe: resendable(req.requestId) });
  }

  // -- ledger (what a session holder needs) ----------------------------------
  async openSession(agent: string, sessionKey: string, options: CallOptions = {}): Promise<Session> {
    checkText("agent", agent);
    checkText("session_key", sessionKey);
    const req = { agent, sessionKey, metadata: {} };
    return (await this.call(this.ledger.openSession.bind(this.ledger), req, { ...options, safe: true })).session!;
  }

  async getSession(sessionId: string, options: CallOptions = {}): Promise<Session> {
    return (await this.call(this.ledger.getSession.bind(this.ledger), { sessionId }, { ...options, safe: true })).session!;
  }

  async acquireLease(sessionId: string, holderId: string, ttlMs: number, options: CallOptions = {}): Promise<Lease> {
    checkText("holder_id", holderId);
    const req = { sessionId, holderId, ttl: msToDuration(ttlMs), generation: "0" };
    return (await this.call(this.ledger.acquireLease.bind(this.ledger), req, { ...options, safe: true })).lease!;
  }

  async renewLease(sessionId: string, generation: string, holderId: string, ttlMs: number, options: CallOptions = {}): Promise<Lease> {
    checkText("holder_id", holderId);
    const req = { sessionId, generation, holderId, ttl: msToDuration(ttlMs) };
    return (await this.call(this.ledger.renewLease.bind(this.ledger), req, { ...options, safe: true })).lease!;
  }

  /** Gives the lease up; returns the events left pending (force only). */
  async releaseLease(sessionId: string, generation: string, force = false, options: CallOptions = {}): Promise<string> {
    const req = { sessionId, generation, force };
    return (await this.call(this.ledger.releaseLease.bind(this.ledger), req, { ...options, safe: true })).pending;
  }

  /** A fenced append at expectedSeq + 1...; returns the new head seq. `commitId`
   * (filled in when absent) makes a retry apply it once; `""` sends none, and
   * the commit is then never resent. */
  async commit(
    sessionId: string,
    generation: string,
    expectedSeq: string,
    records: Uint8Array[],
    options: CallOptions & { consumeInboxIds?: string[]; commitId?: string } = {},
  ): Promise<{ seq: string; pending: string; replayed: boolean }> {
    const req = {
      sessionId, generation, expectedSeq,
      records: records.map((r) => Buffer.from(r)),
      consumeInboxIds: options.consumeInboxIds ?? [],
      commitId: options.commitId ?? randomUUID(),
    };
    checkText("commit_id", req.commitId);
    // Resent on UNAVAILABLE only with its commit id (the server then replays
    // the first result): a commit sent with `commitId: ""` whose first attempt
    // applied would be answered SEQUENCE_MISMATCH against the caller's own commit.
    return this.call(this.ledger.commit.bind(this.ledger), req, { ...options, safe: resendable(req.commitId) });
  }
}

export type { RetryPolicy };
