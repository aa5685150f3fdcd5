// The shared key-encoding vectors: JavaScript's encodeURIComponent plus the
// sha256 rule must agree with every vector the SDKs ship.
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { assert, encodeSegment, repoRoot } from "../lib.mjs";

export const name = "key-encoding vectors";
export const services = [];

export async function run() {
  const file = process.env.FENCEPOST_VECTORS ?? join(repoRoot, "client", "fencepost", "vectors", "key_encoding.json");
  const { vectors } = JSON.parse(readFileSync(file, "utf8"));
  assert.ok(Array.isArray(vectors) && vectors.length > 0, "no vectors");
  let hashed = 0;
  for (const { input, encoded } of vectors) {
    assert.equal(encodeSegment(input), encoded, `vector ${JSON.stringify(input).slice(0, 60)}`);
    if (encoded.startsWith("sha256:")) {
      assert.match(encoded, /^sha256:[0-9a-f]{64}$/);
      hashed += 1;
    } else {
      assert.ok(Buffer.byteLength(encoded) <= 256, "an unhashed segment is at most 256 bytes");
    }
  }
  assert.ok(hashed > 0, "the vectors never exercise the sha256 rule");
  return `${vectors.length} vectors (${hashed} hashed)`;
}
