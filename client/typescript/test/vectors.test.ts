// The shared key-encoding vectors (client/fencepost/vectors/key_encoding.json).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { test } from "node:test";

import { authorKv, encodeSegment } from "../src";

// dist/test -> client/fencepost/vectors
const file = process.env.FENCEPOST_VECTORS ?? resolve(__dirname, "..", "..", "..", "fencepost", "vectors", "key_encoding.json");

test("encodeSegment agrees with every shared vector", () => {
  const { vectors } = JSON.parse(readFileSync(file, "utf8")) as { vectors: { input: string; encoded: string }[] };
  assert.ok(vectors.length > 0);
  let hashed = 0;
  for (const { input, encoded } of vectors) {
    assert.equal(encodeSegment(input), encoded, `vector ${JSON.stringify(input).slice(0, 60)}`);
    if (encoded.startsWith("sha256:")) hashed += 1;
  }
  assert.ok(hashed > 0, "the vectors never exercise the sha256 rule");
});

test("authorKv builds agentkit/v1/{agent}/kv/{key}", () => {
  assert.equal(authorKv("bot/1")("a b"), "agentkit/v1/bot%2F1/kv/a%20b");
});
