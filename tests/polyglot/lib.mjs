// Shared helpers of the fencepost JavaScript contract suite: loading the
// contract from proto/, promisified unary calls, decoding typed error details,
// and the key-encoding rule as a JavaScript client implements it.
import { createHash } from "node:crypto";
import { readdirSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, "..", "..");
export const protoRoot = resolve(process.env.FENCEPOST_PROTO_ROOT ?? join(repoRoot, "proto"));

function protoFiles(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? protoFiles(join(dir, e.name)) : e.name.endsWith(".proto") ? [join(dir, e.name)] : [],
  );
}

// Every .proto under proto/, loaded exactly as a generic JS client would.
export function loadContract() {
  const files = protoFiles(protoRoot).map((f) => relative(protoRoot, f)).sort();
  const definition = protoLoader.loadSync(files, {
    includeDirs: [protoRoot],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const services = Object.entries(definition)
    .filter(([, v]) => v && typeof v === "object" && !("format" in v) && Object.values(v).some((m) => m?.path))
    .map(([name]) => name);
  return { files, services, pkg: grpc.loadPackageDefinition(definition) };
}

// google.rpc.Status / ErrorInfo / BadRequest, bundled with the suite.
const rpcRoot = new protobuf.Root();
rpcRoot.resolvePath = (_origin, target) =>
  target.startsWith("google/rpc/") ? join(here, "protos", target) : protobuf.util.path.resolve(_origin, target);
rpcRoot.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
const Status = rpcRoot.lookupType("google.rpc.Status");
const ErrorInfo = rpcRoot.lookupType("google.rpc.ErrorInfo");
const BadRequest = rpcRoot.lookupType("google.rpc.BadRequest");

// The typed details of a failed call, decoded from `grpc-status-details-bin`.
export function errorDetails(err) {
  const raw = err?.metadata?.get("grpc-status-details-bin") ?? [];
  assert.equal(raw.length, 1, `expected one grpc-status-details-bin trailer, got ${raw.length} (${err})`);
  const status = Status.decode(raw[0]);
  const out = { code: status.code, message: status.message, errorInfo: null, fieldViolations: [] };
  for (const any of status.details) {
    const type = any.type_url.slice(any.type_url.lastIndexOf("/") + 1);
    if (type === "google.rpc.ErrorInfo") out.errorInfo = ErrorInfo.toObject(ErrorInfo.decode(any.value));
    if (type === "google.rpc.BadRequest")
      out.fieldViolations = BadRequest.toObject(BadRequest.decode(any.value)).field_violations ?? [];
  }
  return out;
}

// A promise for one unary call.
export function unary(client, method, request, deadlineSeconds = 10) {
  return new Promise((resolvePromise, reject) => {
    const deadline = new Date(Date.now() + deadlineSeconds * 1000);
    client[method](request, { deadline }, (err, res) => (err ? reject(err) : resolvePromise(res)));
  });
}

// A promise for every message of one server-streaming call.
export function serverStream(client, method, request, deadlineSeconds = 10) {
  return new Promise((resolvePromise, reject) => {
    const deadline = new Date(Date.now() + deadlineSeconds * 1000);
    const messages = [];
    const call = client[method](request, { deadline });
    call.on("data", (m) => messages.push(m));
    call.on("error", reject);
    call.on("end", () => resolvePromise(messages));
  });
}

// Expect a call to fail with `code` and ErrorInfo `reason`; returns the details.
export async function expectError(promise, code, reason) {
  let err;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, `expected ${reason}, but the call succeeded`);
  assert.equal(err.code, code, `status code (${err.details})`);
  const details = errorDetails(err);
  assert.equal(details.code, code);
  assert.ok(details.errorInfo, "no google.rpc.ErrorInfo in the status details");
  assert.equal(details.errorInfo.reason, reason);
  assert.equal(details.errorInfo.domain, "fencepost.dev");
  return details;
}

// encode_segment as a JavaScript client writes it: encodeURIComponent, then
// `sha256:` + hex of the encoded segment when it is over 256 bytes.
export function encodeSegment(segment) {
  const encoded = encodeURIComponent(segment);
  if (Buffer.byteLength(encoded, "utf8") > 256) {
    return "sha256:" + createHash("sha256").update(encoded, "utf8").digest("hex");
  }
  return encoded;
}

// A google.protobuf.Struct (as proto-loader represents it) from a JSON object, and back.
export function toStruct(obj) {
  return { fields: Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, toValue(v)])) };
}

function toValue(v) {
  if (v === null) return { nullValue: "NULL_VALUE" };
  if (typeof v === "number") return { numberValue: v };
  if (typeof v === "string") return { stringValue: v };
  if (typeof v === "boolean") return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  return { structValue: toStruct(v) };
}

export function fromStruct(struct) {
  return Object.fromEntries(Object.entries(struct?.fields ?? {}).map(([k, v]) => [k, fromValue(v)]));
}

function fromValue(v) {
  switch (v.kind) {
    case "nullValue":
      return null;
    case "numberValue":
      return v.numberValue;
    case "stringValue":
      return v.stringValue;
    case "boolValue":
      return v.boolValue;
    case "listValue":
      return (v.listValue.values ?? []).map(fromValue);
    case "structValue":
      return fromStruct(v.structValue);
    default:
      throw new Error(`unknown Value kind ${v.kind}`);
  }
}

export { assert, grpc };
