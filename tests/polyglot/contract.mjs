// fencepost contract suite, JavaScript side. Loads every .proto under proto/
// with @grpc/proto-loader and runs each check in checks/ against a running
// server (FENCEPOST_TARGET, e.g. 127.0.0.1:50051). Exit code 0 only when every
// check passed; a failure, or no checks at all, exits 1.
//
// Adding a check: drop `checks/<service>.mjs` exporting `name`, `services`
// (the fully qualified services it needs, e.g. "fencepost.v1.LedgerService")
// and `async run({ client, pkg })`. A check whose services are not in the
// loaded proto is reported as "not applicable" (the service has not landed).
import { readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

import { grpc, loadContract } from "./lib.mjs";

const target = process.env.FENCEPOST_TARGET;
if (!target) {
  console.error("FENCEPOST_TARGET is not set (host:port of a fencepost server)");
  process.exit(2);
}

const { files, services, pkg } = loadContract();
console.log(`# proto files: ${files.join(", ")}`);
console.log(`# services: ${services.join(", ")}`);

const clients = new Map();
function client(service) {
  if (!clients.has(service)) {
    const Ctor = service.split(".").reduce((obj, part) => obj?.[part], pkg);
    if (typeof Ctor !== "function") throw new Error(`service ${service} is not in the loaded proto`);
    clients.set(service, new Ctor(target, grpc.credentials.createInsecure()));
  }
  return clients.get(service);
}

const checksDir = join(dirname(fileURLToPath(import.meta.url)), "checks");
const only = process.env.FENCEPOST_CHECKS ? new Set(process.env.FENCEPOST_CHECKS.split(",")) : null;
let passed = 0;
let failed = 0;
const covered = new Set();
for (const file of readdirSync(checksDir).filter((f) => f.endsWith(".mjs")).sort()) {
  const check = await import(pathToFileURL(join(checksDir, file)).href);
  if (only && !only.has(file.replace(/\.mjs$/, ""))) continue;
  const missing = check.services.filter((s) => !services.includes(s));
  if (missing.length) {
    console.log(`# not applicable - ${check.name} (not in proto: ${missing.join(", ")})`);
    continue;
  }
  check.services.forEach((s) => covered.add(s));
  try {
    const note = await check.run({ client, pkg, services });
    console.log(`ok - ${check.name}${note ? ` (${note})` : ""}`);
    passed += 1;
  } catch (err) {
    console.log(`not ok - ${check.name}`);
    console.log(String(err?.stack ?? err).replace(/^/gm, "#   "));
    failed += 1;
  }
}
if (!only) for (const s of services.filter((s) => !covered.has(s))) console.log(`# note: no JavaScript check covers ${s} yet`);
for (const c of clients.values()) c.close();
console.log(`# pass ${passed} fail ${failed}`);
process.exit(failed === 0 && passed > 0 ? 0 : 1);
