"""Authentication: bearer tokens, server-terminated mTLS (SPIFFE), and the
mesh sidecar's forwarded client certificate header."""

from .authn import (
    BearerTokenSource,
    ChainAuthenticator,
    ForwardedCertSource,
    MutualTlsSource,
    build_authenticator,
)
from .identity import IdentityMap, hash_token

__all__ = [
    "BearerTokenSource", "ChainAuthenticator", "ForwardedCertSource", "MutualTlsSource",
    "IdentityMap", "build_authenticator", "hash_token",
]
