"""The error contract as the proto declares it (proto/fencepost/v1/errors.proto).

`ErrorReason` lists every ErrorInfo reason the server returns; the reason
string is the enum value name without the `ERROR_REASON_` prefix. Each RPC
declares what it can return: its service's `common_reasons` option plus its
own `reasons` option. `fencepost.reasons` and `fencepost.errors` are checked
against this module by the test suite, and the suite fails when the server
returns a reason an RPC does not declare.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from google.protobuf import descriptor_pool

from . import v1
from .v1 import errors_pb2

PREFIX = "ERROR_REASON_"
ERRORS_PROTO = "proto/fencepost/v1/errors.proto"


def reason_of(value: int) -> str:
    """The reason string of an ErrorReason number ("" for UNSPECIFIED)."""
    name = errors_pb2.ErrorReason.Name(value)
    return "" if name == f"{PREFIX}UNSPECIFIED" else name[len(PREFIX):]


def enum_reasons() -> list[str]:
    """Every reason string of the ErrorReason enum, in enum order."""
    return [reason_of(v) for v in errors_pb2.ErrorReason.values() if reason_of(v)]


@cache
def _load_services() -> None:
    """Import every generated module so each service's descriptor is in the pool."""
    for info in pkgutil.iter_modules(v1.__path__):
        if info.name.endswith("_pb2"):
            importlib.import_module(f"{v1.__name__}.{info.name}")


def declared_reasons(method: str) -> frozenset[str] | None:
    """The reasons `method` ("/fencepost.v1.KvService/Get") declares, or None
    when it is not a fencepost RPC."""
    _load_services()
    service_name, _, rpc = method.lstrip("/").partition("/")
    if not service_name.startswith("fencepost."):
        return None
    try:
        service = descriptor_pool.Default().FindServiceByName(service_name)
    except KeyError:
        return None
    found = service.methods_by_name.get(rpc)
    if found is None:
        return None
    common = service.GetOptions().Extensions[errors_pb2.common_reasons]
    own = found.GetOptions().Extensions[errors_pb2.reasons]
    return frozenset(reason_of(v) for v in (*common, *own))


def proto_file_of(method: str) -> str:
    """The proto file (under proto/) that defines `method`'s service."""
    _load_services()
    service_name = method.lstrip("/").partition("/")[0]
    return "proto/" + descriptor_pool.Default().FindServiceByName(service_name).file.name


def undeclared(seen: set[tuple[str, str, str]]) -> list[str]:
    """One instruction per (method, code, reason) the server returned that the
    proto does not declare: exactly what to add, and where."""
    known = set(enum_reasons())
    out = []
    for method, code, reason in sorted(seen):
        declared = declared_reasons(method)
        if declared is None:
            continue  # health, reflection: not part of fencepost's contract
        rpc = method.rsplit("/", 1)[1]
        where = proto_file_of(method)
        if not reason:
            out.append(f"{method} returned {code} with no ErrorInfo: every error must carry one (api/base.py)")
            continue
        if reason == "INTERNAL":
            out.append(f"{method} returned INTERNAL: a server bug (an unhandled exception); fix it, never declare it")
        elif reason not in known:
            out.append(
                f"{method} returned {code}/{reason}, which is not in the ErrorReason enum: add "
                f"`{PREFIX}{reason} = <next number>;` to {ERRORS_PROTO} (and to fencepost/reasons.py, "
                "fencepost/errors.py), "
                f"then declare it on rpc {rpc} in {where}"
            )
        elif reason not in declared:
            out.append(
                f"{method} returned {code}/{reason}, which it does not declare: add "
                f"`option (fencepost.v1.reasons) = {PREFIX}{reason};` to rpc {rpc} in {where}"
            )
    return out
