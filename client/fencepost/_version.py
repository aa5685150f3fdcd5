"""Versions: the installed package and the API (proto) it speaks."""

from __future__ import annotations

import hashlib
from importlib import metadata

PROTO_PACKAGE = "fencepost.v1"


def package_version() -> str:
    try:
        return metadata.version("fencepost")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


__version__ = package_version()


def proto_fingerprint() -> str:
    """A short digest of the compiled proto files: two builds that print the
    same fingerprint speak exactly the same API revision."""
    from .v1 import evals_pb2, journal_pb2, kv_pb2, ledger_pb2, memory_pb2, schedule_pb2, store_api_pb2

    digest = hashlib.sha256()
    for module in (evals_pb2, journal_pb2, kv_pb2, ledger_pb2, memory_pb2, schedule_pb2, store_api_pb2):
        digest.update(module.DESCRIPTOR.serialized_pb)
    return digest.hexdigest()[:12]


def version_line(prog: str, server: str | None = None) -> str:
    """What `--version` prints: `fencepost 0.1.0 (server 0.1.0, sdk 0.1.0, proto fencepost.v1 @ 1a2b3c4d5e6f)`."""
    parts = [f"server {server}"] if server else []
    parts += [f"sdk {__version__}", f"proto {PROTO_PACKAGE} @ {proto_fingerprint()}"]
    return f"{prog} {server or __version__} ({', '.join(parts)})"
