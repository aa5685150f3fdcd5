"""The identity files' entries are typed: a tenant, role or name that is not
a string, or a tenant no key can hold (a lone surrogate), is refused when the
file is read (at start-up, and on SIGHUP, which keeps the previous map), never
accepted and turned into INTERNAL on every call of that identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fencepost_server.security import IdentityMap, hash_token


def _tokens(path: Path, **entry: object) -> Path:
    path.write_text(json.dumps({"tokens": [{"name": "a", "sha256": hash_token("tok"), **entry}]}))
    return path


@pytest.mark.parametrize("entry", [
    pytest.param({"tenant": 5}, id="tenant-int"),
    pytest.param({"tenant": {"x": 1}}, id="tenant-object"),
    pytest.param({"tenant": "t", "role": None}, id="role-null"),
    pytest.param({"tenant": "t", "name": 7}, id="name-int"),
    # JSON's \ud800 escape loads as a lone surrogate: no key can be built from it
    pytest.param({"tenant": "\ud800"}, id="tenant-lone-surrogate"),
])
def test_a_mistyped_entry_is_refused_and_a_reload_keeps_the_previous_map(tmp_path: Path, entry: dict) -> None:
    path = _tokens(tmp_path / "tokens.json", tenant="t", role="service")
    identities = IdentityMap(path)
    assert identities.by_token("tok") is not None
    with pytest.raises(ValueError):
        IdentityMap(_tokens(tmp_path / "bad.json", **entry))
    _tokens(path, **entry)
    identities.reload()
    found = identities.by_token("tok")
    assert found is not None and found.tenant == "t"  # the previous map, still typed


def test_a_mistyped_spiffe_entry_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "spiffe.json"
    path.write_text(json.dumps({"spiffe": [{"id": "spiffe://corp/x", "tenant": 12, "role": "service"}]}))
    with pytest.raises(ValueError, match="'tenant'"):
        IdentityMap(None, path)
    path.write_text(json.dumps({"spiffe": [{"id": "spiffe://corp/x", "tenant": "t\udc80", "role": "service"}]}))
    with pytest.raises(ValueError, match="'tenant'"):
        IdentityMap(None, path)


def test_a_bad_spiffe_map_does_not_keep_a_token_revoked_in_a_good_tokens_file(tmp_path: Path) -> None:
    """Each file stands alone on SIGHUP: a reload that found the SPIFFE map
    broken kept the previous tokens too, so a token revoked in a tokens file
    that parsed stayed valid until the map was fixed and another SIGHUP sent."""
    tokens = _tokens(tmp_path / "tokens.json", tenant="t", role="service")
    spiffe = tmp_path / "spiffe.json"
    spiffe.write_text(json.dumps({"spiffe": [{"id": "spiffe://corp/x", "tenant": "t", "role": "service"}]}))
    identities = IdentityMap(tokens, spiffe)
    generation = identities.generation
    tokens.write_text(json.dumps({"tokens": []}))  # "tok" revoked
    spiffe.write_text("{not json")  # and a bad edit of the other file
    identities.reload()
    assert identities.by_token("tok") is None
    assert identities.generation != generation  # open streams re-check their callers
    kept = identities.by_spiffe("spiffe://corp/x")  # the broken file's previous map is kept
    assert kept is not None and kept.tenant == "t"
    # and the other way round: a broken tokens file keeps its tokens, the map takes effect
    _tokens(tokens, tenant="t", role="service")
    spiffe.write_text(json.dumps({"spiffe": [{"id": "spiffe://corp/x", "tenant": "t", "role": "service"}]}))
    identities.reload()
    tokens.write_text("{not json")
    spiffe.write_text(json.dumps({"spiffe": []}))
    identities.reload()
    assert identities.by_spiffe("spiffe://corp/x") is None
    assert identities.by_token("tok") is not None


@pytest.mark.parametrize("text", [
    pytest.param("[" * 100_000, id="nested-too-deep"),
    pytest.param(b"\xff\xfe{".decode("latin-1"), id="not-utf8"),
])
def test_a_file_json_cannot_read_is_refused_and_a_reload_keeps_the_previous_map(tmp_path: Path, text: str) -> None:
    """A file the JSON reader gives up on (nested past its recursion limit,
    bytes that are not UTF-8) is refused as a ValueError like any other bad
    file: start-up reports it as a config error and SIGHUP keeps the previous
    map, rather than the server dying on a RecursionError."""
    path = _tokens(tmp_path / "tokens.json", tenant="t", role="service")
    identities = IdentityMap(path)
    bad = tmp_path / "bad.json"
    bad.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match="bad.json"):
        IdentityMap(bad)
    path.write_bytes(text.encode("latin-1"))
    identities.reload()
    found = identities.by_token("tok")
    assert found is not None and found.tenant == "t"
