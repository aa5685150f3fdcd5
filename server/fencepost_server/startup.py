"""Checks that run before `fencepost serve` starts anything.

Two kinds of failure, two exit codes (docs/cli.md):
- `ConfigError` (exit 2): the flags or a configuration file say something
  that cannot work (an unknown backend scheme, a malformed tokens file, a
  non-loopback listen without authentication). Fix the command line.
- `StartFailure` (exit 3): the configuration is fine but this machine cannot
  run it now (the port is taken, the state root cannot be used, the SQLite
  file is not a database). Fix the environment.

Both carry one line that names the flag and what is expected; `cli.py`
prints it as `fencepost: error: ...`. Per-flag syntax is checked earlier by
the argparse `type=` checkers in `fencepost.cli.args`.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

from .config import Settings
from .storage import Storage, StorageError, open_backend
from .storage import private
from .storage.registry import parse_backend_url


log = logging.getLogger("fencepost")


class ConfigError(Exception):
    """The configuration cannot work (exit 2)."""


class StartFailure(Exception):
    """The configuration is valid but the server cannot start here (exit 3)."""


def check_config(settings: Settings, *, insecure: bool = False) -> None:
    """Everything about the configuration that can be known without binding
    or opening anything."""
    if settings.backend is not None:
        try:
            parse_backend_url(settings.backend)
        except ValueError as exc:
            raise ConfigError(f"argument --backend: {exc}") from exc
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ConfigError("arguments --tls-cert and --tls-key go together (a certificate and its key)")
    if settings.tls_client_ca and not settings.tls_configured():
        raise ConfigError("argument --tls-client-ca needs --tls-cert and --tls-key (mTLS is TLS first)")
    if settings.spiffe_map and not (settings.tls_client_ca or settings.trust_xfcc):
        # else nothing reads the map, and every caller would be the default
        # tenant with the operator role: the map says the operator meant otherwise
        raise ConfigError("argument --spiffe-map needs a source of SPIFFE ids: --tls-client-ca (mTLS) "
                          "or --trust-xfcc (the sidecar's x-forwarded-client-cert)")
    if (settings.tls_client_ca or settings.trust_xfcc) and not (settings.spiffe_map or settings.tokens_file):
        # every caller would be refused: no SPIFFE id maps to a tenant, and no token does
        source = "--tls-client-ca" if settings.tls_client_ca else "--trust-xfcc"
        raise ConfigError(f"argument {source}: a SPIFFE id needs --spiffe-map to name its tenant and role "
                          "(or give --tokens-file for bearer tokens); without either every call is refused")
    check_tls_files(settings)
    if settings.tokens_file or settings.spiffe_map:
        from .security import IdentityMap

        try:
            IdentityMap(settings.tokens_file, settings.spiffe_map)
        except (OSError, ValueError) as exc:
            flag = "--spiffe-map" if settings.spiffe_map and str(settings.spiffe_map) in str(exc) else "--tokens-file"
            raise ConfigError(f"argument {flag}: {exc}") from exc
        if settings.tokens_file:
            warn_if_not_private(settings.tokens_file, "--tokens-file", "the token hashes")
    if settings.page_token_key_file:
        from .domain.paging import secret_from_file

        try:
            secret_from_file(settings.page_token_key_file)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"argument --page-token-key-file: {exc}") from exc
        warn_if_not_private(settings.page_token_key_file, "--page-token-key-file", "the page-token secret")
    if not settings.listen_is_loopback() and not settings.auth_configured() and not insecure:
        raise ConfigError(
            f"refusing to listen on {settings.listen} without authentication; "
            "configure authentication (--tokens-file, --tls-client-ca, --trust-xfcc) or pass --insecure")


def warn_if_not_private(path: Path, flag: str, holds: str) -> None:
    """Warn when group or others may read or write a file of secrets (a
    reader can forge page tokens or brute-force a weak token offline; a
    writer can add a token). A warning, not a refusal: a mounted secret's
    mode is not always the operator's to choose (Kubernetes' default is 0644)."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return  # read a moment ago: a file that went since is the reader's error to report
    if mode & 0o066:
        log.warning("%s %s is open to group or others (mode %04o) and holds %s: chmod 600 it",
                    flag, path, mode, holds)


def check_tls_files(settings: Settings) -> None:
    """The PEM files parse and the key is the certificate's. gRPC would only
    find out when binding, as core log lines and "Failed to bind to
    address", which names the port instead of the file."""
    if not settings.tls_configured():
        return
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # password b"": an encrypted key fails here instead of prompting (gRPC cannot use one)
        context.load_cert_chain(settings.tls_cert, settings.tls_key, password=b"")  # type: ignore[arg-type]
    except ssl.SSLError as exc:
        why = ("the key is not the certificate's" if exc.reason == "KEY_VALUES_MISMATCH"
               else "expected a PEM certificate (chain) and its unencrypted PEM private key")
        raise ConfigError(f"arguments --tls-cert {settings.tls_cert} / --tls-key {settings.tls_key}: {why}") from exc
    if settings.tls_client_ca:
        try:
            context.load_verify_locations(cafile=str(settings.tls_client_ca))
        except ssl.SSLError as exc:
            raise ConfigError(f"argument --tls-client-ca: {settings.tls_client_ca} holds no PEM certificate") from exc


def check_listen(listen: str, flag: str) -> None:
    """Fail now, with the OS's reason, when `listen` cannot be bound (gRPC's
    own bind failure is a core log line plus an opaque RuntimeError)."""
    host, _, port_text = listen.rpartition(":")
    port = int(port_text)
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartFailure(f"cannot listen on {listen} ({flag}): cannot resolve {host!r}: {exc.strerror}") from exc
    failures: list[OSError] = []
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                failures.append(exc)
    in_use = [f for f in failures if f.errno == errno.EADDRINUSE]
    if in_use or (failures and len(failures) == len(addresses)):
        reason = (in_use or failures)[0].strerror
        hint = "; is another fencepost running? pick another port" if in_use else ""
        raise StartFailure(f"cannot listen on {listen} ({flag}): {reason}{hint}")


def prepare_state_root(settings: Settings) -> None:
    """The default backend keeps `fencepost.db` under --state-root: it must be
    (or become) a directory this process can read and write."""
    if settings.backend is not None:
        return
    root = settings.state_root
    if root.exists() and not root.is_dir():
        raise StartFailure(f"--state-root {root} is not a directory (expected a directory for fencepost.db)")
    try:
        private.make_dirs(root)
    except OSError as exc:
        raise StartFailure(f"cannot create --state-root {root}: {exc.strerror or exc}") from exc
    if not os.access(root, os.R_OK | os.W_OK | os.X_OK):
        raise StartFailure(f"--state-root {root} is not readable and writable by this user")
    db = root / "fencepost.db"
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):
        raise StartFailure(f"--state-root {root}: {db.name} is not readable and writable by this user")


def open_storage(settings: Settings) -> Storage:
    """The configured backend, opened (SQLite opens its file here; DynamoDB
    connects lazily, and an unreachable table is reported by the start-up
    probe instead)."""
    prepare_state_root(settings)
    url = settings.backend_url()
    flag = "--backend" if settings.backend else "--state-root"
    try:
        return open_backend(url)
    except ValueError as exc:
        raise ConfigError(f"argument {flag}: {exc}") from exc
    except (StorageError, OSError) as exc:
        raise StartFailure(f"cannot open the backend {url} ({flag}): {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]

