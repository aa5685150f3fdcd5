// Request ids the client sends with its writes (client/fencepost/ids.py):
// UUIDv7 (RFC 9562), 48 bits of Unix milliseconds then 74 random bits, in
// lowercase hex with dashes. The server names the marker of an id of this
// shape by the id itself, so markers written together sit together in the
// store's key order; any other id is hashed and works the same.
import { randomBytes } from "node:crypto";

/** A fresh UUIDv7 request id. */
export function newRequestId(): string {
  const raw = randomBytes(16);
  raw.writeUIntBE(Date.now(), 0, 6);
  raw[6] = (raw[6] & 0x0f) | 0x70; // version 7
  raw[8] = (raw[8] & 0x3f) | 0x80; // variant 10
  const h = raw.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
