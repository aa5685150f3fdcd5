// fencepost TypeScript client: the generated messages and service clients
// (./gen, from proto/ with ts-proto) and a thin typed layer over them.
export * from "./call";
export * from "./client";
export * from "./errors";
export * from "./ids";
export * from "./keys";
export * from "./session";
export * from "./time";
export * as kv from "./gen/fencepost/v1/kv";
export * as ledger from "./gen/fencepost/v1/ledger";
export * as memory from "./gen/fencepost/v1/memory";
export * as journal from "./gen/fencepost/v1/journal";
export * as storeApi from "./gen/fencepost/v1/store_api";
export * as schedule from "./gen/fencepost/v1/schedule";
export * as evals from "./gen/fencepost/v1/evals";
export * as admin from "./gen/fencepost/v1/admin";
