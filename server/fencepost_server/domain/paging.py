"""AIP-158 page tokens: opaque, sealed, bound to the tenant and the listing
that issued them.

A token is the position a listing resumes after, sealed with AES-256-GCM-SIV
(authenticated encryption: its 128-bit tag is the MAC) under a per-deployment
key. The tenant and the listing (its name and every request parameter but
page_size) are the associated data, so:

- the caller cannot read the position (a key, an id, a timestamp): the token
  carries nothing in the clear;
- a token that was altered or truncated, or that is sent by another tenant or
  to another listing or with other parameters, fails authentication and is
  PAGE_TOKEN_INVALID: nothing is listed.

Every replica must seal and open with the same key, so by default the key
lives in the backend itself (`#/server/page-token-key`, created with
put_if_absent by the first replica that needs it; every other one reads it,
once per process). Anyone who can read the backend can read every position
anyway, so keeping the key there gives nothing away. An operator may supply
the key instead (`--page-token-key-file`, the same file on every replica).
Rotating it (delete the item, or change the file, then restart the replicas)
invalidates outstanding tokens: their callers restart their listings.
GCM-SIV stays safe if a random nonce ever repeats, so one key can seal any
number of tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV

from fencepost import reasons

from ..storage import BackendUnavailable, PersistenceUncertain, Storage
from .errors import InvalidArgument
from .keys import GLOBAL_PREFIX

T = TypeVar("T")
from .limits import Limits

#: where the deployment's page-token secret lives (server bookkeeping, no tenant)
PAGE_KEY_ITEM = GLOBAL_PREFIX + "server/page-token-key"
SECRET_BYTES = 32
_FORMAT = b"\x01"  # first byte of every token: the layout below
_NONCE_BYTES = 12
_TAG_BYTES = 16


def _invalid() -> InvalidArgument:
    return InvalidArgument(
        reasons.PAGE_TOKEN_INVALID,
        "page_token was not issued for this listing; restart without a token",
        field="page_token",
    )


class PageTokens:
    """Seals and opens page tokens under one deployment secret, fetched on
    first use (so a server starts, and reports its health, while the backend
    is still unreachable)."""

    __slots__ = ("_fetch", "_aead")

    def __init__(self, fetch_secret: Callable[[], Awaitable[bytes]]) -> None:
        self._fetch = fetch_secret
        self._aead: AESGCMSIV | None = None

    @classmethod
    def of_deployment(cls, storage: Storage) -> PageTokens:
        """The secret kept in the backend: every replica over it shares it."""
        return cls(lambda: _stored_secret(storage))

    @classmethod
    def with_secret(cls, secret: bytes) -> PageTokens:
        _check_secret(secret)

        async def fixed() -> bytes:
            return secret

        return cls(fixed)

    @classmethod
    def ephemeral(cls) -> PageTokens:
        """A key of this process only (domain tests; never a server's)."""
        return cls.with_secret(os.urandom(SECRET_BYTES))

    async def _cipher(self) -> AESGCMSIV:
        if self._aead is None:
            secret = await self._fetch()
            _check_secret(secret)
            # Derived, not the secret itself: the secret may key other things later.
            self._aead = AESGCMSIV(hmac.new(secret, b"fencepost page tokens v1", hashlib.sha256).digest())
        return self._aead

    @staticmethod
    def _bound_to(tenant: str, listing: Sequence[object]) -> bytes:
        return _FORMAT + json.dumps([tenant, *listing], separators=(",", ":")).encode()

    async def issue(self, tenant: str, listing: Sequence[object], position: str) -> str:
        """A token resuming `listing` (name + request parameters) of `tenant` after `position`."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = (await self._cipher()).encrypt(nonce, position.encode(), self._bound_to(tenant, listing))
        return base64.urlsafe_b64encode(_FORMAT + nonce + sealed).decode().rstrip("=")

    async def resume(self, tenant: str, listing: Sequence[object], token: str) -> str | None:
        """The position a token resumes after; None for the first page (no token).
        Anything not issued by `issue` for exactly this tenant and listing is
        PAGE_TOKEN_INVALID."""
        if not token:
            return None
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (ValueError, binascii.Error):
            raise _invalid() from None
        # The decoder skips characters outside the alphabet: only the exact
        # text `issue` wrote is a token, so any edit at all is refused.
        canonical = base64.urlsafe_b64encode(raw).decode().rstrip("=") == token
        if not canonical or len(raw) < 1 + _NONCE_BYTES + _TAG_BYTES or raw[:1] != _FORMAT:
            raise _invalid()
        nonce, sealed = raw[1:1 + _NONCE_BYTES], raw[1 + _NONCE_BYTES:]
        try:
            plain = (await self._cipher()).decrypt(nonce, sealed, self._bound_to(tenant, listing))
            return plain.decode()
        except (InvalidTag, UnicodeDecodeError):
            raise _invalid() from None


def secret_from_file(path: Path) -> bytes:
    """An operator-supplied secret: 64 hex digits (`openssl rand -hex 32`)."""
    text = path.read_text().strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path}: the page-token key must be {2 * SECRET_BYTES} hex digits") from None
    _check_secret(secret)
    return secret


def _check_secret(secret: bytes) -> None:
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"the page-token secret must be {SECRET_BYTES} bytes (got {len(secret)})")


#: rounds of put_if_absent + get before a listing gives up on the secret
_SECRET_ROUNDS = 3


async def _stored_secret(storage: Storage) -> bytes:
    """The secret under PAGE_KEY_ITEM, minted by whichever replica needs it first.

    Whatever is stored once the put is over is the deployment's secret, so a
    put of unknown outcome is settled by reading it back: a listing is a read
    and never reports PERSISTENCE_UNCERTAIN (its caller wrote nothing)."""
    for _ in range(_SECRET_ROUNDS):
        fresh = os.urandom(SECRET_BYTES)
        try:
            if (await storage.put_if_absent(PAGE_KEY_ITEM, fresh)).applied:
                return fresh
        except PersistenceUncertain:
            pass  # landed or not: the read below tells
        stored = await storage.get(PAGE_KEY_ITEM)
        if stored is not None:
            return stored.value
        # absent: the put did not land, or a rotation deleted it since: again
    raise BackendUnavailable(f"the page-token secret could not be stored in {_SECRET_ROUNDS} attempts")


def page_size(limits: Limits, requested: int) -> int:
    if requested < 0:
        raise InvalidArgument(
            reasons.PAGE_SIZE_INVALID, f"page_size must not be negative (got {requested})",
            {"page_size": requested}, field="page_size",
        )
    return limits.page_size(requested)


#: bytes a listed entry costs in a response beyond its own key and value
#: (field tags, lengths, versions, timestamps)
ENTRY_OVERHEAD = 64


def fits(sizes: Iterable[int], budget: int) -> int | None:
    """How many leading entries of a page stay within `budget` bytes (never
    fewer than one); None when all of them do. A response over the server's
    message limit fails whole, and AIP-158 lets a page hold fewer entries
    than asked: a listing ends its page early instead (Limits.max_page_bytes)."""
    total = 0
    for n, size in enumerate(sizes):
        total += size
        if total > budget and n:
            return n
    return None


def split_by_bytes(entries: Sequence[T], size: Callable[[T], int], budget: int) -> Iterator[Sequence[T]]:
    """A streamed page as consecutive parts of at most `budget` bytes each
    (one entry per part at the least)."""
    while entries:
        n = fits(map(size, entries), budget) or len(entries)
        yield entries[:n]
        entries = entries[n:]
