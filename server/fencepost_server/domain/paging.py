"""AIP-158 page tokens: opaque, bound to the listing they came from."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

from fencepost import reasons

from .errors import InvalidArgument
from .limits import Limits


def _scope_tag(scope: str) -> str:
    return hashlib.sha256(scope.encode()).hexdigest()[:16]


def encode_token(scope: str, last: str) -> str:
    """A token resuming a listing of `scope` after `last`."""
    raw = json.dumps({"s": _scope_tag(scope), "a": last}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(scope: str, token: str) -> str | None:
    """The position a token resumes after; None for the first page.
    A token from another listing (or garbage) is PAGE_TOKEN_INVALID."""
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        if data["s"] == _scope_tag(scope) and isinstance(data["a"], str):
            return data["a"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        pass
    raise InvalidArgument(
        reasons.PAGE_TOKEN_INVALID,
        "page_token was not issued for this listing; restart without a token",
        field="page_token",
    )


def page_size(limits: Limits, requested: int) -> int:
    if requested < 0:
        raise InvalidArgument(
            reasons.PAGE_SIZE_INVALID, f"page_size must not be negative (got {requested})",
            {"page_size": requested}, field="page_size",
        )
    return limits.page_size(requested)
