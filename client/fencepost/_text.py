"""Text no request can carry: a str holding a surrogate code point (U+D800..U+DFFF,
what "\\udc80" or bytes decoded with "surrogateescape" give) has no UTF-8 form,
and protobuf raises a bare UnicodeEncodeError while the request is built.

(protobuf's pure-Python implementation, PyPy's, raises a ValueError while
handling that UnicodeEncodeError instead: the same failure.)

Every client method is wrapped once (client.py) so that this becomes the typed
error the server gives text that is not UTF-8: KeyInvalid for a KV key or
prefix, FieldInvalid for any other argument, naming the argument (as the
TypeScript client does for its lone surrogates). Nothing is sent. Only the
failure path looks at the arguments, so a well-formed call costs nothing.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

from . import reasons
from .errors import FieldInvalid, InvalidArgument, KeyInvalid

F = TypeVar("F", bound=Callable[..., Any])

_SURROGATE = re.compile("[\ud800-\udfff]")
_MAX_DEPTH = 32  # JSON-like arguments (Struct payloads) nest; a cycle must not recurse forever


def invalid_text(field: str, *, key: bool = False) -> InvalidArgument:
    """The error for `field` holding a surrogate (KeyInvalid when it is a KV key)."""
    message = f"{field} is not valid UTF-8 (it holds a lone surrogate)"
    cls, reason = (KeyInvalid, reasons.KEY_INVALID) if key else (FieldInvalid, reasons.FIELD_INVALID)
    return cls(message, code="INVALID_ARGUMENT", reason=reason, field_violations={field: message})


def check_text(field: str, value: str, *, key: bool = False) -> None:
    """Raise the typed error when `value` holds a surrogate (for messages built outside a client method).
    Anything but a str is left to protobuf, as before the check (it takes UTF-8 bytes for text)."""
    if isinstance(value, str) and _SURROGATE.search(value):
        raise invalid_text(field, key=key)


def find_surrogate(path: str, value: object, depth: int = 0) -> str | None:
    """The path of the first str holding a surrogate in `value` (`name[i]` for a
    list item, `name.k` for a mapping's value, `name` for a mapping's key), else None."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if depth >= _MAX_DEPTH or isinstance(value, (bytes, bytearray)):
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and _SURROGATE.search(k):
                return path
            found = find_surrogate(f"{path}.{k}", v, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, Sequence):
        for i, v in enumerate(value):
            found = find_surrogate(f"{path}[{i}]", v, depth + 1)
            if found is not None:
                return found
    return None


def refuse_unencodable(fn: F, keys: frozenset[str] = frozenset()) -> F:
    """`fn` (a coroutine or async-generator method) raising the typed error for
    the argument that made protobuf's encoding fail; `keys` name KV-key arguments."""
    sig = inspect.signature(fn)
    named = [
        name for name, p in sig.parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)  # **opts is call options
    ]

    def typed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> InvalidArgument | None:
        try:
            bound = sig.bind(*args, **kwargs).arguments
        except TypeError:
            return None
        for name in named:
            if name in bound and (path := find_surrogate(name, bound[name])) is not None:
                return invalid_text(path, key=name in keys)
        return None  # not from an argument: left as it is

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def gen(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            inner = fn(*args, **kwargs)
            try:
                async for item in inner:
                    yield item
            except ValueError as exc:
                err = typed(args, kwargs) if _unencodable(exc) else None
                if err is None:
                    raise
                raise err from exc
            finally:
                await inner.aclose()  # an early exit ends the call (a stream is cancelled) now, not at GC

        return gen  # type: ignore[return-value]

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except ValueError as exc:
            err = typed(args, kwargs) if _unencodable(exc) else None
            if err is None:
                raise
            raise err from exc

    return call  # type: ignore[return-value]


def _unencodable(exc: ValueError) -> bool:
    """protobuf could not encode text: its UnicodeEncodeError (upb), or the
    ValueError the pure-Python implementation raises while handling one."""
    return isinstance(exc, UnicodeEncodeError) or isinstance(exc.__context__, UnicodeEncodeError)
