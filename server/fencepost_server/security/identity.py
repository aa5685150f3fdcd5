"""Who is who: token hashes and SPIFFE ids mapped to a tenant and a role.

Tokens file (JSON; only SHA-256 hashes are stored, never tokens):

    {"tokens": [{"name": "billing-svc", "sha256": "<hex>", "tenant": "billing", "role": "service"}]}

SPIFFE map (JSON):

    {"spiffe": [{"id": "spiffe://corp.example/ns/billing/sa/runtime", "tenant": "billing", "role": "service"}]}

Both are re-read on SIGHUP (`reload`); a file that fails to parse keeps its
previous map and logs why, so a bad edit never locks every caller out, while
the other file still takes effect.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("fencepost.security")

ROLES = ("service", "operator")


def hash_token(token: str) -> str:
    """The hex SHA-256 a tokens file stores for `token`."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    role: str
    subject: str


def _identity(entry: dict[str, str], subject: str, where: str) -> Identity:
    tenant, role = entry.get("tenant", ""), entry.get("role", "service")
    # JSON carries any type: a tenant that is not a string loaded, and then
    # every call of that identity failed as INTERNAL when its keys were built
    if not isinstance(tenant, str):
        raise ValueError(f"{where}: entry {subject!r} has a 'tenant' that is not a string")
    if not tenant:
        raise ValueError(f"{where}: entry {subject!r} has no tenant")
    # JSON's "\ud800" escape loads as a lone surrogate, which no key can hold
    try:
        tenant.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: entry {subject!r} has a 'tenant' that is not valid Unicode "
                         "(a lone surrogate)") from None
    if role not in ROLES:
        raise ValueError(f"{where}: entry {subject!r} has role {role!r} (expected one of {ROLES})")
    return Identity(tenant, role, subject)


_TOKENS_SHAPE = '{"tokens": [{"name", "sha256", "tenant", "role"}, ...]}'
_SPIFFE_SHAPE = '{"spiffe": [{"id", "tenant", "role"}, ...]}'


def _entries(path: Path, key: str, shape: str) -> list[dict[str, str]]:
    """The list under `key`, or ValueError saying what the file should hold."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); expected {shape}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start}); expected {shape}") from None
    except RecursionError:  # a config error like any other, not a crash at start-up
        raise ValueError(f"{path}: nested too deeply to read; expected {shape}") from None
    entries = data.get(key) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path}: expected {shape}")
    return entries


def _field(entry: dict[str, str], name: str, n: int, where: str, shape: str) -> str:
    value = entry.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: entry {n} has no {name!r}; expected {shape}")
    return value


T = TypeVar("T")


def _attempt(load: Callable[[], T], path: Path, strict: bool) -> T | None:
    """`load()`, or None (logged) when the file does not load; `strict` raises instead."""
    try:
        return load()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if strict:
            raise
        log.error("%s not reloaded, keeping its previous entries: %s", path, exc)
        return None


class IdentityMap:
    def __init__(self, tokens_file: Path | None = None, spiffe_file: Path | None = None) -> None:
        self.tokens_file = tokens_file
        self.spiffe_file = spiffe_file
        self._tokens: list[tuple[bytes, Identity]] = []
        self._spiffe: dict[str, Identity] = {}
        #: moves on every reload that took effect: open streams re-check their caller
        self.generation = 0
        self.reload(strict=True)

    def reload(self, *, strict: bool = False) -> None:
        """Each file stands alone: one that fails to load keeps its previous
        map, and the other still takes effect (a bad edit of the SPIFFE map
        must not keep a token revoked in a tokens file that parsed)."""
        loaded = False
        if self.tokens_file and (tokens := _attempt(self._load_tokens, self.tokens_file, strict)) is not None:
            self._tokens, loaded = tokens, True
        if self.spiffe_file and (spiffe := _attempt(self._load_spiffe, self.spiffe_file, strict)) is not None:
            self._spiffe, loaded = spiffe, True
        if loaded:
            self.generation += 1
            log.info("identities loaded: %d token(s), %d SPIFFE id(s)", len(self._tokens), len(self._spiffe))

    def _load_tokens(self) -> list[tuple[bytes, Identity]]:
        assert self.tokens_file is not None
        where = str(self.tokens_file)
        out = []
        for n, entry in enumerate(_entries(self.tokens_file, "tokens", _TOKENS_SHAPE)):
            name = entry.get("name", "token")
            if not isinstance(name, str):
                raise ValueError(f"{where}: entry {n} has a 'name' that is not a string")
            hexdigest = _field(entry, "sha256", n, where, _TOKENS_SHAPE)
            try:
                digest = bytes.fromhex(hexdigest)
            except ValueError:
                raise ValueError(f"{where}: sha256 of {name!r} is not hex (fencepost hash-token makes one)") from None
            if len(digest) != 32:
                raise ValueError(f"{where}: sha256 of {name!r} is not 32 bytes")
            identity = _identity(entry, name, where)
            for stored, other in out:
                if stored == digest and (other.tenant, other.role) != (identity.tenant, identity.role):
                    # one token, two identities: which one a call gets must not depend on file order
                    raise ValueError(f"{where}: {other.subject!r} and {name!r} have one sha256 but "
                                     "different tenants or roles")
            out.append((digest, identity))
        return out

    def _load_spiffe(self) -> dict[str, Identity]:
        assert self.spiffe_file is not None
        where = str(self.spiffe_file)
        out = {}
        for n, entry in enumerate(_entries(self.spiffe_file, "spiffe", _SPIFFE_SHAPE)):
            spiffe_id = _field(entry, "id", n, where, _SPIFFE_SHAPE)
            identity = _identity(entry, spiffe_id, where)
            other = out.get(spiffe_id)
            if other is not None and (other.tenant, other.role) != (identity.tenant, identity.role):
                raise ValueError(f"{where}: {spiffe_id!r} is mapped twice, to different tenants or roles")
            out[spiffe_id] = identity
        return out

    def tenants(self) -> set[str]:
        """Every tenant an identity maps to (retention names hashed tenant segments with it)."""
        return {i.tenant for _, i in self._tokens} | {i.tenant for i in self._spiffe.values()}

    def by_token(self, token: str) -> Identity | None:
        """Constant-time: every stored hash is compared, with no early exit."""
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for stored, identity in self._tokens:
            if hmac.compare_digest(stored, digest):
                found = identity
        return found

    def by_spiffe(self, spiffe_id: str) -> Identity | None:
        return self._spiffe.get(spiffe_id)
