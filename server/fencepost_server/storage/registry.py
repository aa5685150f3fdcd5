"""From a backend URL to a backend instance.

    memory://                               the in-process reference backend
    sqlite:///abs/path.db  sqlite://rel.db  the embedded default (WAL, group commit;
                                            ?synchronous=OFF|NORMAL|FULL|EXTRA, default FULL)
    dynamodb://TABLE?endpoint=URL&region=R  one DynamoDB table (aioboto3)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qs, unquote, urlsplit

from .base import Storage

Factory = Callable[[str, dict[str, str]], Storage]
_FACTORIES: dict[str, Factory] = {}


def register(scheme: str) -> Callable[[Factory], Factory]:
    def deco(factory: Factory) -> Factory:
        _FACTORIES[scheme] = factory
        return factory

    return deco


@register("memory")
def _memory(_location: str, _params: dict[str, str]) -> Storage:
    from .memory import MemoryStorage

    return MemoryStorage()


@register("sqlite")
def _sqlite(location: str, params: dict[str, str]) -> Storage:
    from .sqlite import SqliteStorage

    if not location:
        raise ValueError("sqlite URL needs a path: sqlite:///path/to/file.db")
    return SqliteStorage(location, synchronous=params.get("synchronous", "FULL").upper())


@register("dynamodb")
def _dynamodb(location: str, params: dict[str, str]) -> Storage:
    from .dynamodb import DynamoStorage  # imported lazily: aioboto3 is heavy

    if not location:
        raise ValueError("dynamodb URL needs a table: dynamodb://TABLE")
    return DynamoStorage.from_params(location, params)


def parse_backend_url(url: str) -> tuple[Factory, str, dict[str, str]]:
    """The factory, location and parameters of a backend URL; ValueError
    saying what is expected when the URL names no known backend or lacks
    its location. Opens nothing."""
    parts = urlsplit(url)
    factory = _FACTORIES.get(parts.scheme)
    known = ", ".join(f"{name}://" for name in sorted(_FACTORIES))
    if factory is None:
        got = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise ValueError(f"expected a backend URL ({known}), got {got} in {url!r}")
    if parts.scheme == "sqlite":
        location = unquote(parts.netloc + parts.path)
    else:
        location = unquote(parts.netloc or parts.path.lstrip("/"))
    if not location and parts.scheme in _NEEDS_LOCATION:
        raise ValueError(f"expected {_NEEDS_LOCATION[parts.scheme]}, got {url!r}")
    params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "sqlite":
        _check_sqlite_params(params, url)
    if parts.scheme == "dynamodb":
        _check_table(unquote(parts.netloc + parts.path) if parts.netloc else location, url)
    return factory, location, params


#: DynamoDB's table names: 3..255 of letters, digits, `_`, `-`, `.`
_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")


def _check_table(table: str, url: str) -> None:
    """Refused here, not by the first call: a path after the table (a region
    or folder written before it) was ignored, and the data went to a table
    named after the first part."""
    if not _TABLE.fullmatch(table):
        raise ValueError(f"expected a DynamoDB table name (3..255 of A-Z a-z 0-9 _ - .) in "
                         f"dynamodb://TABLE?endpoint=URL&region=R, got {table!r} in {url!r}")


#: PRAGMA synchronous levels (SQLite reads any other word as NORMAL, silently)
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def _check_sqlite_params(params: dict[str, str], url: str) -> None:
    unknown = sorted(set(params) - {"synchronous"})
    if unknown:
        raise ValueError(f"unknown sqlite URL parameter(s) {', '.join(unknown)} in {url!r}; "
                         "the one known is synchronous")
    level = params.get("synchronous")
    if level is not None and level.upper() not in _SYNCHRONOUS:
        raise ValueError(f"sqlite URL parameter synchronous={level!r} is none of {', '.join(_SYNCHRONOUS)} "
                         f"(default FULL) in {url!r}")


_NEEDS_LOCATION = {
    "sqlite": "a path: sqlite:///abs/path.db or sqlite://relative.db",
    "dynamodb": "a table: dynamodb://TABLE?endpoint=URL&region=R",
}


def open_backend(url: str) -> Storage:
    """Create the backend named by `url` (see the module docstring)."""
    factory, location, params = parse_backend_url(url)
    return factory(location, params)
