"""Authenticators: each source turns what a call carries into an Identity.

The chain tries, in order, a bearer token (`authorization: Bearer ...`), the
client certificate of a server-terminated mTLS connection (its SPIFFE URI
SAN), and — only when explicitly enabled — the mesh sidecar's
`x-forwarded-client-cert` header. A call that presents credentials which do
not verify is refused; it never falls through to a weaker source.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import grpc
from cryptography import x509

from fencepost import reasons

from ..api.base import Caller
from ..domain.errors import Unauthenticated
from .identity import Identity, IdentityMap

log = logging.getLogger("fencepost.security")


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str | None:
    """The one value of `key`; a call that sends it twice is refused rather
    than judged by whichever copy a proxy or client put first."""
    found = None
    for k, v in context.invocation_metadata() or ():
        if k == key:
            if found is not None:
                raise _refuse(f"'{key}' metadata sent more than once")
            found = v if isinstance(v, str) else v.decode()
    return found


def _refuse(message: str) -> Unauthenticated:
    return Unauthenticated(reasons.UNAUTHENTICATED, message)


class Source(Protocol):
    def identify(self, context: grpc.aio.ServicerContext) -> Identity | None:
        """The identity, None when the call carries nothing for this source,
        or raise Unauthenticated when it carries credentials that do not verify."""
        ...


class BearerTokenSource:
    def __init__(self, identities: IdentityMap) -> None:
        self.identities = identities

    def identify(self, context: grpc.aio.ServicerContext) -> Identity | None:
        header = _metadata(context, "authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _refuse("authorization metadata must be 'Bearer <token>'")
        identity = self.identities.by_token(token.strip())
        if identity is None:
            raise _refuse("unknown bearer token")
        return identity


def spiffe_ids(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith("spiffe://")]


class MutualTlsSource:
    """Identity from the verified client certificate (the server terminates TLS)."""

    def __init__(self, identities: IdentityMap) -> None:
        self.identities = identities

    def identify(self, context: grpc.aio.ServicerContext) -> Identity | None:
        pems = context.auth_context().get("x509_pem_cert")
        if not pems:
            return None
        try:
            # the TLS layer checked the signature, not every extension: the
            # reader parses them all (a SAN that is not UTF-8, a malformed SCT list)
            ids = spiffe_ids(x509.load_pem_x509_certificate(pems[0]))
        except ValueError as exc:
            raise _refuse(f"client certificate does not parse: {exc}") from None
        if not ids:
            raise _refuse("client certificate has no SPIFFE URI SAN")
        if len(ids) > 1:  # an X.509-SVID names exactly one: which one the call is would be a guess
            raise _refuse(f"client certificate has {len(ids)} SPIFFE URI SANs (an SVID has exactly one)")
        identity = self.identities.by_spiffe(ids[0])
        if identity is None:
            raise _refuse(f"SPIFFE id {ids[0]} is not mapped to a tenant")
        return identity


class ForwardedCertSource:
    """Trusts the sidecar's `x-forwarded-client-cert` (Envoy XFCC) header.
    Only safe when every path to the server goes through the sidecar."""

    header = "x-forwarded-client-cert"

    def __init__(self, identities: IdentityMap) -> None:
        self.identities = identities

    def identify(self, context: grpc.aio.ServicerContext) -> Identity | None:
        value = _metadata(context, self.header)
        if value is None:
            return None
        elements = xfcc_elements(value)
        if elements is None:
            raise _refuse("x-forwarded-client-cert is malformed (an unterminated quoted value)")
        # The last element is the hop closest to us (the sidecar's own peer).
        # Envoy writes one URI pair per URI SAN ("URI=" when there is none)
        # and DNS pairs unquoted: a SAN holding `;URI=spiffe://...` reads as
        # one pair more. An SVID has exactly one URI SAN, so an element with
        # two URI pairs, of any scheme, is refused rather than guessed at.
        uris = [v for k, v in elements[-1] if k.lower() == "uri"]
        if len(uris) > 1:
            raise _refuse(f"x-forwarded-client-cert carries {len(uris)} URI SANs (an SVID has exactly one)")
        if not uris or not uris[0].startswith("spiffe://"):
            raise _refuse("x-forwarded-client-cert carries no SPIFFE URI")
        identity = self.identities.by_spiffe(uris[0])
        if identity is None:
            raise _refuse(f"SPIFFE id {uris[0]} is not mapped to a tenant")
        return identity


def xfcc_elements(value: str) -> list[list[tuple[str, str]]] | None:
    """Envoy's XFCC header as elements (split on `,`) of key=value pairs (split
    on `;`), or None when a quoted value never ends. A value in double quotes
    may hold `,`, `;`, `=` and `\\"` (a certificate's Subject does): splitting
    on those characters blindly let a Subject holding `;URI=...` name any
    SPIFFE id."""
    elements: list[list[tuple[str, str]]] = [[]]
    token: list[str] = []
    quoted = escaped = False

    def end_pair() -> None:
        key, _, val = "".join(token).partition("=")
        if key.strip():
            elements[-1].append((key.strip(), val))
        token.clear()

    for ch in value:
        if escaped:
            token.append(ch)
            escaped = False
        elif quoted:
            if ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
            else:
                token.append(ch)
        elif ch == '"':
            quoted = True
        elif ch in ";,":
            end_pair()
            if ch == ",":
                elements.append([])
        else:
            token.append(ch)
    if quoted or escaped:
        return None
    end_pair()
    return elements


class ChainAuthenticator:
    def __init__(self, sources: Sequence[Source], description: str, identities: IdentityMap | None = None) -> None:
        self.sources = list(sources)
        self.description = description
        self.identities = identities

    @property
    def generation(self) -> int:
        """Moves when the identity files are reloaded (see api/base.py: streams)."""
        return self.identities.generation if self.identities is not None else 0

    def identify(self, context: grpc.aio.ServicerContext) -> Caller:
        for source in self.sources:
            identity = source.identify(context)
            if identity is not None:
                return Caller(identity.tenant, identity.role, identity.subject)
        raise _refuse("no credentials: send 'authorization: Bearer <token>' or a client certificate")

    def describe(self) -> str:
        return self.description


def build_authenticator(
    *, tokens_file: Path | None, spiffe_file: Path | None, mtls: bool, trust_xfcc: bool
) -> tuple[ChainAuthenticator, IdentityMap]:
    identities = IdentityMap(tokens_file, spiffe_file)
    sources: list[Source] = []
    parts = []
    if tokens_file:
        sources.append(BearerTokenSource(identities))
        parts.append("bearer tokens")
    if mtls:
        sources.append(MutualTlsSource(identities))
        parts.append("mTLS (SPIFFE)")
    if trust_xfcc:
        sources.append(ForwardedCertSource(identities))
        parts.append("x-forwarded-client-cert")
    return ChainAuthenticator(sources, "authentication: " + ", ".join(parts), identities), identities
