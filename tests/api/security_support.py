"""Helpers for security tests: token files, SPIFFE maps, a throwaway CA, and
any RPC called by name under a given token."""

from __future__ import annotations

import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import duration_pb2, message_factory, struct_pb2
from google.protobuf.descriptor import ServiceDescriptor
from google.rpc import error_details_pb2, status_pb2

from fencepost.v1 import (
    admin_pb2,
    evals_pb2,
    journal_pb2,
    kv_pb2,
    ledger_pb2,
    memory_pb2,
    schedule_pb2,
    store_api_pb2,
)
from fencepost_server.security import hash_token

TOKENS = {
    "token-tenant-a": ("tenant-a", "service"),
    "token-tenant-b": ("tenant-b", "service"),
    "token-operator-a": ("tenant-a", "operator"),
    "token-operator-b": ("tenant-b", "operator"),
}


def write_tokens(path: Path, tokens: dict[str, tuple[str, str]] = TOKENS) -> Path:
    entries = [{"name": f"t{i}", "sha256": hash_token(tok), "tenant": tenant, "role": role}
               for i, (tok, (tenant, role)) in enumerate(tokens.items())]
    path.write_text(json.dumps({"tokens": entries}))
    return path


def write_spiffe(path: Path, ids: dict[str, tuple[str, str]]) -> Path:
    path.write_text(json.dumps({"spiffe": [{"id": i, "tenant": t, "role": r} for i, (t, r) in ids.items()]}))
    return path


@dataclass
class Pki:
    ca_pem: bytes
    server_cert: bytes
    server_key: bytes

    def client(self, spiffe_id: str | None, *more_uris: str,
               extensions: tuple[x509.ExtensionType, ...] = ()) -> tuple[bytes, bytes]:
        return _issue(self, "client", spiffe_id=spiffe_id, more_uris=more_uris, extensions=extensions)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


_CA_KEY: dict[bytes, ec.EllipticCurvePrivateKey] = {}


def make_pki() -> Pki:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fencepost test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    _CA_KEY[ca_pem] = key
    pki = Pki(ca_pem, b"", b"")
    pki.server_cert, pki.server_key = _issue(pki, "localhost", server=True)
    return pki


def _issue(pki: Pki, cn: str, *, server: bool = False, spiffe_id: str | None = None,
           more_uris: tuple[str, ...] = (), extensions: tuple[x509.ExtensionType, ...] = ()) -> tuple[bytes, bytes]:
    ca_key = _CA_KEY[pki.ca_pem]
    ca = x509.load_pem_x509_certificate(pki.ca_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    sans: list[x509.GeneralName] = []
    if server:
        sans += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    if spiffe_id:
        sans.append(x509.UniformResourceIdentifier(spiffe_id))
    sans += [x509.UniformResourceIdentifier(uri) for uri in more_uris]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


# -- any RPC by name, as raw protobuf, under one bearer token -------------------

_PB2 = (admin_pb2, kv_pb2, ledger_pb2, journal_pb2, memory_pb2, schedule_pb2, evals_pb2, store_api_pb2)
SERVICES: dict[str, ServiceDescriptor] = {
    s.name: s for module in _PB2 for s in module.DESCRIPTOR.services_by_name.values()
}
PROTO_DIR = Path(__file__).resolve().parents[2] / "proto" / "fencepost" / "v1"


def every_rpc() -> set[str]:
    """`Service/Method` of every RPC the server's protos declare."""
    return {f"{s.name}/{m.name}" for s in SERVICES.values() for m in s.methods}


class ManualClock:
    """A wall clock the test moves (the schedule's reminders fall due at once)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def secs(n: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(n * 1e9))
    return d


def reason_of(exc: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason a failed call carried ("" when none)."""
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info.reason
    return ""


class Rpc:
    """Calls any fencepost RPC by `Service/Method` with one bearer token.
    A server stream is read to its end (`first_only`: its first message)."""

    def __init__(self, channel: grpc.aio.Channel, token: str | None = None) -> None:
        self.channel = channel
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    async def __call__(self, rpc: str, /, *, first_only: bool = False, **fields: Any) -> Any:
        service, method = rpc.split("/")
        desc = SERVICES[service].methods_by_name[method]
        request_cls = message_factory.GetMessageClass(desc.input_type)
        response_cls = message_factory.GetMessageClass(desc.output_type)
        path = f"/{desc.containing_service.full_name}/{method}"
        request = request_cls(**fields)
        if not desc.server_streaming:
            call = self.channel.unary_unary(path, request_cls.SerializeToString, response_cls.FromString)
            return await call(request, metadata=self.metadata, timeout=30)
        stream = self.channel.unary_stream(path, request_cls.SerializeToString, response_cls.FromString)(
            request, metadata=self.metadata, timeout=30
        )
        out = []
        async for message in stream:
            out.append(message)
            if first_only:
                stream.cancel()
                break
        return out
