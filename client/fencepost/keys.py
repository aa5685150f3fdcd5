"""Bounded key encoding, shared by the client SDK and the server.

`encode_segment` percent-encodes exactly as JavaScript's `encodeURIComponent`
(UTF-8; `A-Z a-z 0-9 - _ . ! ~ * ' ( )` kept) and replaces a result over 256
bytes with `sha256:` + the hex digest of the encoded segment, so every language
derives the same bounded key. `key_encoding.json` beside this module holds
the reference vectors.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from urllib.parse import quote

MAX_SEGMENT_BYTES = 256
_UNRESERVED = "-_.!~*'()"


def encode_segment(segment: str) -> str:
    """Encode one caller-controlled key segment (bounded, deterministic)."""
    encoded = quote(segment, safe=_UNRESERVED, encoding="utf-8", errors="strict")
    if len(encoded) > MAX_SEGMENT_BYTES:
        return "sha256:" + hashlib.sha256(encoded.encode("ascii")).hexdigest()
    return encoded


def join_key(*segments: str) -> str:
    """Join already-built parts with `/`."""
    return "/".join(segments)


class AuthorKv:
    """Builds author KV keys `agentkit/v1/{agent}/kv/{key}` for one agent."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.prefix = f"agentkit/v1/{encode_segment(agent)}/kv/"

    def key(self, name: str) -> str:
        return self.prefix + encode_segment(name)

    __call__ = key


def author_kv(agent: str) -> AuthorKv:
    """Key builder for an agent's author KV namespace."""
    return AuthorKv(agent)


def load_vectors() -> list[dict[str, str]]:
    """The reference encoding vectors shipped with the SDK."""
    text = resources.files("fencepost").joinpath("vectors/key_encoding.json").read_text("utf-8")
    return json.loads(text)["vectors"]
