"""Key encoding: the shared vectors and properties (hypothesis)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from urllib.parse import unquote

from hypothesis import given
from hypothesis import strategies as st

from fencepost.keys import author_kv, encode_segment, load_vectors

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "key_encoding.json"
ENCODED_CHARS = re.compile(r"^(?:[A-Za-z0-9\-_.!~*'()]|%[0-9A-F]{2})*$")
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=120)


def test_reference_vectors_pass() -> None:
    vectors = load_vectors()
    assert len(vectors) >= 20
    for v in vectors:
        assert encode_segment(v["input"]) == v["encoded"], v["input"]


def test_sdk_ships_a_superset_of_the_shared_vectors() -> None:
    shipped = {(v["input"], v["encoded"]) for v in load_vectors()}
    if SHARED.exists():  # beside the project on every developer machine and in CI
        shared = {(v["input"], v["encoded"]) for v in json.loads(SHARED.read_text())["vectors"]}
        assert shared <= shipped


@given(text)
def test_short_segments_round_trip_and_use_only_safe_characters(s: str) -> None:
    out = encode_segment(s)
    if out.startswith("sha256:"):
        assert len(out) == 7 + 64
    else:
        assert ENCODED_CHARS.match(out)
        assert unquote(out) == s
        assert "/" not in out and "\\" not in out and len(out.encode()) <= 256


@given(st.text(min_size=90, max_size=400))
def test_long_segments_hash_the_encoded_form_deterministically(s: str) -> None:
    out = encode_segment(s)
    from urllib.parse import quote

    encoded = quote(s, safe="-_.!~*'()")
    if len(encoded) > 256:
        assert out == "sha256:" + hashlib.sha256(encoded.encode()).hexdigest()
    else:
        assert out == encoded
    assert encode_segment(s) == out


@given(text, text)
def test_distinct_short_segments_never_collide(a: str, b: str) -> None:
    if a != b and not encode_segment(a).startswith("sha256:") and not encode_segment(b).startswith("sha256:"):
        assert encode_segment(a) != encode_segment(b)


def test_boundary_exactly_256_bytes_is_kept_257_is_hashed() -> None:
    assert encode_segment("a" * 256) == "a" * 256
    assert encode_segment("a" * 257).startswith("sha256:")
    assert encode_segment("é" * 42) == "%C3%A9" * 42  # 252 bytes
    assert encode_segment("é" * 43).startswith("sha256:")  # 258 bytes


def test_author_kv_builds_bounded_keys() -> None:
    kv = author_kv("agent/one")
    assert kv.key("k y") == "agentkit/v1/agent%2Fone/kv/k%20y"
    assert kv("x" * 1000).startswith("agentkit/v1/agent%2Fone/kv/sha256:")
