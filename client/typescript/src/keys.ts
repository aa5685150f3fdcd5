// Bounded key encoding, identical in every SDK (client/fencepost/keys.py):
// encodeURIComponent, then `sha256:` + the hex digest of the encoded segment
// when it is over 256 bytes. client/fencepost/vectors/key_encoding.json holds
// the shared vectors.
import { createHash } from "node:crypto";

export const MAX_SEGMENT_BYTES = 256;

/** Encode one caller-controlled key segment (bounded, deterministic). */
export function encodeSegment(segment: string): string {
  const encoded = encodeURIComponent(segment);
  if (encoded.length > MAX_SEGMENT_BYTES) {
    return "sha256:" + createHash("sha256").update(encoded, "ascii").digest("hex");
  }
  return encoded;
}

/** Author KV keys `agentkit/v1/{agent}/kv/{key}` for one agent. */
export function authorKv(agent: string): (name: string) => string {
  const prefix = `agentkit/v1/${encodeSegment(agent)}/kv/`;
  return (name: string) => prefix + encodeSegment(name);
}
