// One call wrapper for every RPC: deadline, metadata, typed errors, and
// retries of UNAVAILABLE only for safe calls (the Python SDK's rules,
// client/fencepost/_call.py): reads, and writes that carry a request id
// (the client fills one in), so a retried write applies once.
import {
  CallOptions as GrpcCallOptions, ClientReadableStream, ClientUnaryCall, Metadata, ServiceError, status,
} from "@grpc/grpc-js";

import { FencepostError, errorFor, fromServiceError } from "./errors";

export interface RetryPolicy {
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
  multiplier: number;
}

export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 5, initialBackoffMs: 50, maxBackoffMs: 2000, multiplier: 2 };
export const NO_RETRY: RetryPolicy = { ...DEFAULT_RETRY, maxAttempts: 1 };

/** Full-jitter exponential backoff delays: one per retry. */
export function backoffDelays(policy: RetryPolicy): number[] {
  const out: number[] = [];
  let delay = policy.initialBackoffMs;
  for (let i = 0; i < policy.maxAttempts - 1; i++) {
    out.push(Math.random() * delay);
    delay = Math.min(delay * policy.multiplier, policy.maxBackoffMs);
  }
  return out;
}

/** Per-call options (each defaults to the client's). */
export interface CallOptions {
  /** Overall deadline across retries, in milliseconds. */
  timeoutMs?: number;
  metadata?: Record<string, string>;
  retry?: RetryPolicy;
  /** Cancels the call (CANCELLED) and any retry still to come. */
  signal?: AbortSignal;
}

/** A generated unary method, bound to its client. */
export type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<GrpcCallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

/** A generated server-streaming method, bound to its client. */
export type StreamMethod<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options?: Partial<GrpcCallOptions>,
) => ClientReadableStream<Res>;

/** Per-stream options. No deadline unless `timeoutMs` is given (streams may be
 * long-lived: the Python SDK's rule); `signal` cancels the call. */
export interface StreamOptions {
  /** Deadline for the whole stream, in milliseconds. */
  timeoutMs?: number;
  metadata?: Record<string, string>;
  signal?: AbortSignal;
}

/** The client's metadata with the call's: a key the call names replaces the
 * client's (keys compare as gRPC's, lowercase). Sending both would let the
 * client's win: the server reads the first `authorization`. */
function toMetadata(...maps: (Record<string, string> | undefined)[]): Metadata {
  const md = new Metadata();
  for (const map of maps) for (const [k, v] of Object.entries(map ?? {})) md.set(k, v);
  return md;
}

function once<Req, Res>(
  method: UnaryMethod<Req, Res>, request: Req, md: Metadata, remainingMs?: number, signal?: AbortSignal,
): Promise<Res> {
  const options: Partial<GrpcCallOptions> = remainingMs === undefined ? {} : { deadline: new Date(Date.now() + remainingMs) };
  return new Promise((resolve, reject) => {
    const cancel = () => call.cancel(); // grpc-js then answers CANCELLED through the callback
    const call = method(request, md, options, (err, res) => {
      signal?.removeEventListener("abort", cancel);
      if (err) reject(fromServiceError(err));
      else resolve(res);
    });
    signal?.addEventListener("abort", cancel, { once: true });
  });
}

const cancelled = () => errorFor({ code: status.CANCELLED, message: "the call was cancelled (its signal aborted)" });

/** Waits `ms`, or less: an abort of `signal` ends the wait at once (the loop then throws CANCELLED). */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** Calls `method` within the deadline; retries UNAVAILABLE only when `safe`. */
export async function callUnary<Req, Res>(
  method: UnaryMethod<Req, Res>,
  request: Req,
  safe: boolean,
  defaults: CallOptions,
  options: CallOptions = {},
): Promise<Res> {
  const timeoutMs = options.timeoutMs ?? defaults.timeoutMs;
  const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
  const delays = safe ? backoffDelays(options.retry ?? defaults.retry ?? DEFAULT_RETRY) : [];
  const md = toMetadata(defaults.metadata, options.metadata);
  const signal = options.signal;
  for (let attempt = 0; ; attempt++) {
    if (signal?.aborted) throw cancelled();
    const remaining = deadline === undefined ? undefined : deadline - Date.now();
    if (remaining !== undefined && remaining <= 0) {
      throw errorFor({ code: status.DEADLINE_EXCEEDED, message: "deadline exceeded before the call could be (re)tried" });
    }
    try {
      return await once(method, request, md, remaining, signal);
    } catch (e) {
      const err = e as FencepostError;
      const retryable = safe && err.code === status.UNAVAILABLE;
      if (attempt >= delays.length || !retryable) throw err;
      if (deadline !== undefined && Date.now() + delays[attempt] >= deadline) throw err;
      await sleep(delays[attempt], signal);
    }
  }
}

const isServiceError = (e: unknown): e is ServiceError =>
  e instanceof Error && typeof (e as Partial<ServiceError>).code === "number" && "metadata" in e;

/** The messages of a server-streaming call, with the client's metadata; a
 * failure is a FencepostError. Never retried (a stream may have delivered
 * part of its answer). Leaving the loop early, or `signal`, cancels the call. */
export async function* callStream<Req, Res>(
  method: StreamMethod<Req, Res>,
  request: Req,
  defaults: CallOptions,
  options: StreamOptions = {},
): AsyncGenerator<Res> {
  const grpcOptions: Partial<GrpcCallOptions> =
    options.timeoutMs === undefined ? {} : { deadline: new Date(Date.now() + options.timeoutMs) };
  const call = method(request, toMetadata(defaults.metadata, options.metadata), grpcOptions);
  const cancel = () => call.cancel();
  if (options.signal?.aborted) cancel();
  options.signal?.addEventListener("abort", cancel, { once: true });
  try {
    for await (const message of call) yield message as Res;
  } catch (e) {
    throw isServiceError(e) ? fromServiceError(e) : e;
  } finally {
    options.signal?.removeEventListener("abort", cancel);
    call.cancel();
  }
}
