"""Where a client connects, from explicit arguments first and the
environment second, so the SDK and the CLI agree on what
`FENCEPOST_ENDPOINT` (and the rest) mean:

| variable                     | meaning                                            |
|------------------------------|----------------------------------------------------|
| `FENCEPOST_ENDPOINT`         | host:port of the server (default 127.0.0.1:50051)  |
| `FENCEPOST_TOKEN`            | bearer token                                       |
| `FENCEPOST_TLS_CA`           | CA bundle (PEM) that signed the server certificate |
| `FENCEPOST_TLS_CERT` / `_KEY`| client certificate and key (PEM), for mTLS         |
| `FENCEPOST_TLS_SERVER_NAME`  | name to check the server certificate against       |

Any TLS variable turns TLS on. An empty variable counts as unset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

DEFAULT_ENDPOINT = "127.0.0.1:50051"
ENV_ENDPOINT = "FENCEPOST_ENDPOINT"
ENV_TOKEN = "FENCEPOST_TOKEN"
ENV_TLS_CA = "FENCEPOST_TLS_CA"
ENV_TLS_CERT = "FENCEPOST_TLS_CERT"
ENV_TLS_KEY = "FENCEPOST_TLS_KEY"
ENV_TLS_SERVER_NAME = "FENCEPOST_TLS_SERVER_NAME"


class ConnectionConfigError(ValueError):
    """The connection settings cannot be used (a TLS file is missing, a half
    pair, a token no header can carry)."""


@dataclass(frozen=True)
class Tls:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert or self.key or self.server_name)

    def credentials(self) -> tuple[grpc.ChannelCredentials, list[tuple[str, Any]]]:
        """Channel credentials and the channel options they need."""
        if bool(self.cert) != bool(self.key):
            raise ConnectionConfigError("a TLS client certificate and key go together (--tls-cert/--tls-key, "
                                        f"{ENV_TLS_CERT}/{ENV_TLS_KEY})")
        try:
            root = self.ca.read_bytes() if self.ca else None
            key = self.key.read_bytes() if self.key else None
            cert = self.cert.read_bytes() if self.cert else None
        except OSError as exc:
            raise ConnectionConfigError(f"cannot read a TLS file: {exc}") from exc
        self._check_pem()
        creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)
        options = [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return creds, options

    def _check_pem(self) -> None:
        """Refuse files gRPC cannot use now, by name: it would only fail at the
        handshake, as core log lines and UNAVAILABLE, as if the server were down."""
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.ca:
            try:
                context.load_verify_locations(cafile=str(self.ca))
            except ssl.SSLError as exc:
                raise ConnectionConfigError(
                    f"the TLS CA file {self.ca} (--tls-ca, {ENV_TLS_CA}) holds no PEM certificate") from exc
        if self.cert and self.key:
            try:  # password b"": an encrypted key fails here instead of prompting (gRPC cannot use one)
                context.load_cert_chain(str(self.cert), str(self.key), password=b"")
            except ssl.SSLError as exc:
                raise ConnectionConfigError(
                    f"the TLS client certificate {self.cert} and key {self.key} (--tls-cert/--tls-key, "
                    f"{ENV_TLS_CERT}/{ENV_TLS_KEY}) are not a PEM certificate and its unencrypted key") from exc


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value else None


def resolve_target(target: str | None, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return target or env.get(ENV_ENDPOINT) or DEFAULT_ENDPOINT


def resolve_token(token: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """An explicit token wins, even "" (no token although the variable is set)."""
    env = os.environ if env is None else env
    if token is not None:
        return check_token(token) or None
    return check_token(env.get(ENV_TOKEN) or "") or None


def check_token(token: str) -> str:
    """The token itself, when a gRPC header can carry it (printable ASCII).
    Anything else fails here, by name, instead of inside gRPC's call batch
    with an opaque error; the usual cause is a line end kept from a file
    (`FENCEPOST_TOKEN=$(cat token.txt)` of a file saved with CRLF)."""
    for at, char in enumerate(token):
        if not " " <= char <= "~":
            raise ConnectionConfigError(
                f"the bearer token ({ENV_TOKEN} or --token) has {char!r} at position {at}: a token is "
                "printable ASCII only (a line end copied from a file?)")
    return token


def resolve_tls(
    *,
    ca: str | Path | None = None,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    server_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Tls:
    """Each TLS setting from its argument, else its variable."""
    env = os.environ if env is None else env
    return Tls(
        ca=_path(ca) or _path(env.get(ENV_TLS_CA)),
        cert=_path(cert) or _path(env.get(ENV_TLS_CERT)),
        key=_path(key) or _path(env.get(ENV_TLS_KEY)),
        server_name=server_name or env.get(ENV_TLS_SERVER_NAME) or None,
    )
