// Request ids: UUIDv7 in lowercase, time first (the server keys their markers by the id).
import assert from "node:assert/strict";
import { test } from "node:test";

import { newRequestId } from "../src";

const UUID7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

test("newRequestId makes unique UUIDv7 ids whose leading 48 bits are the time", () => {
  const before = Date.now();
  const ids = Array.from({ length: 1000 }, () => newRequestId());
  const after = Date.now();
  assert.equal(new Set(ids).size, ids.length);
  for (const id of ids) {
    assert.match(id, UUID7);
    const millis = parseInt(id.slice(0, 8) + id.slice(9, 13), 16);
    assert.ok(before <= millis && millis <= after, `${id} is not stamped with the time it was made`);
  }
  const stamps = ids.map((id) => id.slice(0, 13));
  assert.deepEqual(stamps, [...stamps].sort());
});
