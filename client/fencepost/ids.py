"""Request ids the SDK sends with its writes.

A request id is UUIDv7-shaped (RFC 9562): 48 bits of Unix milliseconds, then
74 random bits. The server keys the marker of an id of this shape by the id
itself, so the markers of one moment sit next to each other in the store's
key order (a random id's marker lands on a random page of the index, and on
SQLite every such write adds a page of its own to the commit). Any client may
send ids of this shape; ids of any other shape are hashed and work the same,
only without the locality.
"""

from __future__ import annotations

import os
import re
import time

#: lowercase UUIDv7, as `new_request_id` writes it (the server matches the same)
UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def new_request_id() -> str:
    """A fresh UUIDv7 in lowercase hex with dashes (36 characters)."""
    raw = bytearray(os.urandom(16))
    raw[:6] = (time.time_ns() // 1_000_000).to_bytes(6, "big")
    raw[6] = raw[6] & 0x0F | 0x70  # version 7
    raw[8] = raw[8] & 0x3F | 0x80  # variant 10
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
