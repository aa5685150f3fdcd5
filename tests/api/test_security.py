"""Authentication, tenant isolation, mTLS, transport limits, metrics and logs."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

import fencepost
from fencepost import errors
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage import Storage
from fencepost_server.storage.memory import MemoryStorage
from tests.api.security_support import make_pki, write_spiffe, write_tokens
from tests.api.test_serve_process import free_port, start_server, stop_server


@pytest.fixture
async def secured(tmp_path: Path, storage: Storage):  # type: ignore[no-untyped-def]
    app = App(Settings(listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json")), storage=storage)
    await app.start()
    yield app
    await app.stop(grace=0.2)


def _client(app: App, token: str | None) -> fencepost.AsyncClient:
    return fencepost.AsyncClient(f"127.0.0.1:{app.port}", token=token, retry=fencepost.NO_RETRY, timeout=10)


async def test_missing_or_wrong_token_is_unauthenticated(secured: App) -> None:
    for token in (None, "wrong-token", "token-tenant-a-but-longer"):
        async with _client(secured, token) as c:
            with pytest.raises(errors.Unauthenticated) as info:
                await c.get("k")
            assert info.value.code == "UNAUTHENTICATED"
    async with _client(secured, "token-tenant-a") as c:
        assert await c.get("k") is None
    # a malformed authorization header is refused, never ignored
    async with fencepost.AsyncClient(f"127.0.0.1:{secured.port}", metadata=[("authorization", "Basic abc")],
                                     retry=fencepost.NO_RETRY) as c:
        with pytest.raises(errors.Unauthenticated):
            await c.get("k")



async def test_a_calls_metadata_replaces_the_clients_under_the_same_key(tmp_path: Path) -> None:
    """A per-call `authorization` is the one sent: both went out, the
    client's first, and the server reads the first, so the call ran as the
    client's identity (FENCEPOST_TOKEN's, when set) instead of the caller's."""
    app = App(Settings(listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json")),
              storage=MemoryStorage())
    await app.start()
    try:
        async with _client(app, "token-tenant-a") as a, _client(app, "token-tenant-b") as b:
            await a.put("per-call", b"b's", metadata={"authorization": "Bearer token-tenant-b"})
            await a.put("per-call-pairs", b"b's", metadata=[("authorization", "Bearer token-tenant-b")])
            assert await a.get("per-call") is None and await a.get("per-call-pairs") is None
            assert (await b.get("per-call")).value == (await b.get("per-call-pairs")).value == b"b's"
    finally:
        await app.stop(grace=0.2)

async def test_a_clients_authorization_metadata_and_its_token_send_one_header(
    secured: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `authorization` the client's metadata names and a token went out
    side by side, and the server refuses a call with two: with FENCEPOST_TOKEN
    exported, every call of a client built with its own authorization failed
    UNAUTHENTICATED. The environment's token only fills in; a `token`
    argument replaces the metadata's (explicit arguments win), as in the
    TypeScript client."""
    monkeypatch.setenv("FENCEPOST_TOKEN", "token-tenant-b")
    target = f"127.0.0.1:{secured.port}"
    own = {"authorization": "Bearer token-tenant-a"}
    async with fencepost.AsyncClient(target, metadata=own, retry=fencepost.NO_RETRY, timeout=10) as a:
        await a.put("whose", b"a's")
    async with fencepost.AsyncClient(target, metadata=[*own.items()], token="token-tenant-b",
                                     retry=fencepost.NO_RETRY, timeout=10) as b:
        await b.put("whose", b"b's")
    async with _client(secured, "token-tenant-a") as a, _client(secured, "token-tenant-b") as b:
        assert (await a.get("whose")).value == b"a's"  # type: ignore[union-attr]
        assert (await b.get("whose")).value == b"b's"  # type: ignore[union-attr]


async def test_health_stays_open_without_credentials(secured: App) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{secured.port}") as ch:
        res = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert res.status == health_pb2.HealthCheckResponse.SERVING


async def test_tenant_b_reaches_nothing_of_tenant_a_kv(secured: App) -> None:
    rng = random.Random(7)
    async with _client(secured, "token-tenant-a") as a, _client(secured, "token-tenant-b") as b:
        corpus: list[tuple[str, str]] = []
        for i in range(40):
            key = rng.choice(["", "agentkit/v1/", "../", "tenant-a/kv/", "%2F"]) + f"secret/{i}/é"
            corpus.append((key, await a.put(key, f"a-secret-{i}".encode())))
        attempts = leaks = 0
        for _ in range(260):
            key, version = rng.choice(corpus)
            variants = [key, "tenant-a/kv/" + key, "../tenant-a/kv/" + key, key.upper()]
            probe = rng.choice(variants)
            for result in (
                await b.get(probe),
                await b.get_with_version(probe),
                [e async for e in b.list(probe[: rng.randint(0, len(probe))])],
                (await b.put_if_version(probe, b"stolen", version)).applied,
            ):
                attempts += 1
                if result:
                    leaks += 1
        attempts += 1
        if await b.delete_if_version(corpus[0][0], corpus[0][1]) and (await a.get(corpus[0][0])) is None:
            leaks += 1
        assert attempts >= 1000 and leaks == 0
        # and A still has every key, untouched
        for key, version in corpus:
            entry = await a.get(key)
            assert entry is not None and entry.version == version


async def test_mtls_spiffe_identity_maps_to_its_tenant(tmp_path: Path) -> None:
    pki = make_pki()
    (tmp_path / "ca.pem").write_bytes(pki.ca_pem)
    (tmp_path / "server.pem").write_bytes(pki.server_cert)
    (tmp_path / "server.key").write_bytes(pki.server_key)
    spiffe = write_spiffe(tmp_path / "spiffe.json", {"spiffe://test.example/ns/a/sa/runtime": ("tenant-a", "service")})
    settings = Settings(listen="127.0.0.1:0", tls_cert=tmp_path / "server.pem", tls_key=tmp_path / "server.key",
                        tls_client_ca=tmp_path / "ca.pem", spiffe_map=spiffe,
                        tokens_file=write_tokens(tmp_path / "tokens.json"))
    app = App(settings, storage=MemoryStorage())
    await app.start()
    try:
        def creds(spiffe_id: str | None) -> grpc.ChannelCredentials:
            cert, key = pki.client(spiffe_id)
            return grpc.ssl_channel_credentials(pki.ca_pem, key, cert)

        opts = [("grpc.ssl_target_name_override", "localhost")]
        target = f"127.0.0.1:{app.port}"
        async with fencepost.AsyncClient(target, credentials=creds("spiffe://test.example/ns/a/sa/runtime"),
                                         options=opts, retry=fencepost.NO_RETRY) as c:
            await c.put("via-mtls", b"1")
        # the token of the same tenant sees it: same tenant, different identity source
        token_creds = grpc.ssl_channel_credentials(pki.ca_pem, *reversed(pki.client(None)))
        async with fencepost.AsyncClient(target, credentials=token_creds, token="token-tenant-a",
                                         options=opts, retry=fencepost.NO_RETRY) as c:
            assert (await c.get("via-mtls")) is not None
        async with fencepost.AsyncClient(target, credentials=creds("spiffe://test.example/ns/x/sa/unknown"),
                                         options=opts, retry=fencepost.NO_RETRY) as c:
            with pytest.raises(errors.Unauthenticated):
                await c.get("via-mtls")
        async with fencepost.AsyncClient(target, credentials=creds(None), options=opts,
                                         retry=fencepost.NO_RETRY) as c:
            with pytest.raises(errors.Unauthenticated):
                await c.get("via-mtls")
        # An SVID names exactly one SPIFFE id: a certificate naming two is ambiguous and
        # refused, whichever order they come in (other URI SANs are not identities)
        for uris in (("spiffe://test.example/ns/a/sa/runtime", "spiffe://test.example/ns/x/sa/other"),
                     ("spiffe://test.example/ns/x/sa/other", "spiffe://test.example/ns/a/sa/runtime")):
            cert, key = pki.client(*uris)
            async with fencepost.AsyncClient(target, credentials=grpc.ssl_channel_credentials(pki.ca_pem, key, cert),
                                             options=opts, retry=fencepost.NO_RETRY) as c:
                with pytest.raises(errors.Unauthenticated):
                    await c.get("via-mtls")
        cert, key = pki.client("spiffe://test.example/ns/a/sa/runtime", "https://test.example/docs")
        async with fencepost.AsyncClient(target, credentials=grpc.ssl_channel_credentials(pki.ca_pem, key, cert),
                                         options=opts, retry=fencepost.NO_RETRY) as c:
            assert (await c.get("via-mtls")) is not None
    finally:
        await app.stop(grace=0.2)


async def test_a_client_certificate_that_does_not_parse_is_unauthenticated(tmp_path: Path) -> None:
    """A certificate the TLS layer accepts (signed by the client CA) may hold
    an extension the identity reader cannot parse: a URI SAN that is not
    UTF-8, a malformed authority information access or SCT list. Such a
    call was answered INTERNAL, with a traceback logged per call, instead of
    being refused as unauthenticated."""
    from cryptography import x509
    from cryptography.x509.oid import ExtensionOID

    pki = make_pki()
    (tmp_path / "ca.pem").write_bytes(pki.ca_pem)
    (tmp_path / "server.pem").write_bytes(pki.server_cert)
    (tmp_path / "server.key").write_bytes(pki.server_key)
    good = "spiffe://test.example/ns/a/sa/runtime"
    spiffe = write_spiffe(tmp_path / "spiffe.json", {good: ("tenant-a", "service")})
    settings = Settings(listen="127.0.0.1:0", tls_cert=tmp_path / "server.pem", tls_key=tmp_path / "server.key",
                        tls_client_ca=tmp_path / "ca.pem", spiffe_map=spiffe)
    app = App(settings, storage=MemoryStorage())
    await app.start()
    not_utf8 = b"spiffe://test.example/\xff"
    san = b"\x30" + bytes([len(not_utf8) + 2]) + b"\x86" + bytes([len(not_utf8)]) + not_utf8
    not_a_sequence = b"\x30\x03\x02\x01\x01"  # a SEQUENCE holding an INTEGER where entries belong
    cases = {
        "URI SAN not UTF-8": (None, x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, san)),
        "malformed AIA": (good, x509.UnrecognizedExtension(ExtensionOID.AUTHORITY_INFORMATION_ACCESS,
                                                            not_a_sequence)),
        "malformed SCT list": (good, x509.UnrecognizedExtension(
            x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2"), b"\x04\x01\x01")),
    }
    outcomes = {}
    try:
        for name, (spiffe_id, extension) in cases.items():
            cert, key = pki.client(spiffe_id, extensions=(extension,))
            creds = grpc.ssl_channel_credentials(pki.ca_pem, key, cert)
            async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", credentials=creds, retry=fencepost.NO_RETRY,
                                             options=[("grpc.ssl_target_name_override", "localhost")]) as c:
                try:
                    await c.put("k", b"v")
                    outcomes[name] = "OK"
                except errors.FencepostError as exc:
                    outcomes[name] = exc.code
        assert outcomes == dict.fromkeys(cases, "UNAUTHENTICATED")
        assert [i.key for i in await app.storage.list("tenant-a/", None, 10)] == []
    finally:
        await app.stop(grace=0.2)


async def test_forwarded_client_cert_only_when_enabled(tmp_path: Path) -> None:
    spiffe = write_spiffe(tmp_path / "spiffe.json", {"spiffe://mesh/ns/b/sa/x": ("tenant-b", "service")})
    xfcc = [("x-forwarded-client-cert", 'By=spiffe://mesh/ns/fp/sa/fencepost;Hash=abc;URI=spiffe://mesh/ns/b/sa/x')]
    app = App(Settings(listen="127.0.0.1:0", spiffe_map=spiffe, trust_xfcc=True), storage=MemoryStorage())
    await app.start()
    try:
        async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", metadata=xfcc, retry=fencepost.NO_RETRY) as c:
            await c.put("k", b"v")
        assert [i.key for i in await app.storage.list("", None, 10)] == ["tenant-b/kv/k"]
    finally:
        await app.stop(grace=0.2)
    # not enabled: the header is ignored and the default tenant serves (loopback dev mode)
    plain = App(Settings(listen="127.0.0.1:0"), storage=MemoryStorage())
    await plain.start()
    try:
        async with fencepost.AsyncClient(f"127.0.0.1:{plain.port}", metadata=xfcc) as c:
            await c.put("k", b"v")
        assert [i.key for i in await plain.storage.list("", None, 10)] == ["default/kv/k"]
    finally:
        await plain.stop(grace=0.2)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_oversized_message_is_refused_without_memory_growth(tmp_path: Path) -> None:
    port = free_port()
    proc = start_server(tmp_path, port, "--max-receive-bytes", str(1024 * 1024), "--backend", "memory://")
    try:
        with fencepost.Client(f"127.0.0.1:{port}", retry=fencepost.NO_RETRY,
                              options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]) as c:
            c.put("warm", b"x")
            big = b"x" * (16 * 1024 * 1024)
            for _ in range(5):  # let the transport's buffers reach their steady size
                with pytest.raises(errors.ResourceExhausted):
                    c.put("big", big)
            before = _rss_kib(proc.pid)
            for _ in range(30):
                with pytest.raises(errors.ResourceExhausted):
                    c.put("big", big)
            after = _rss_kib(proc.pid)
            assert c.get("big") is None
        # 30 x 16 MiB = 480 MiB more were sent; a server that kept (or leaked) them
        # would grow by that much. Allow 64 MiB of allocator and transport noise.
        assert after - before < 64 * 1024, (before, after)
    finally:
        stop_server(proc)


def test_metrics_move_and_logs_never_carry_tokens_or_payloads(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    tokens = write_tokens(tmp_path / "tokens.json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{port}", "--backend",
         "memory://", "--tokens-file", str(tokens), "--metrics-listen", f"127.0.0.1:{metrics_port}",
         "--log-format", "json", "--log-level", "DEBUG"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and "fencepost serving on" in proc.stdout.readline()
        secret_payload = b"PAYLOAD-7f3a-should-never-be-logged"
        with fencepost.Client(f"127.0.0.1:{port}", token="token-tenant-a") as c:
            for i in range(25):
                c.put(f"k{i}", secret_payload)
                c.get(f"k{i}")
        with fencepost.Client(f"127.0.0.1:{port}", token="token-not-valid", retry=fencepost.NO_RETRY) as c:
            with pytest.raises(errors.Unauthenticated):
                c.get("k0")
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert 'fencepost_rpcs_total{code="OK",method="Kv/Put"} 25.0' in text
        assert 'fencepost_rpcs_total{code="UNAUTHENTICATED",method="Kv/Get"} 1.0' in text
        assert 'fencepost_backend_calls_total{operation="put",outcome="ok"} 25.0' in text
        assert "fencepost_rpc_seconds_bucket" in text
    finally:
        stop_server(proc)  # type: ignore[arg-type]
    logs = proc.stderr.read() if proc.stderr else ""
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert any(line.get("method") == "Kv/Put" for line in lines), logs[:2000]
    for needle in ("token-tenant-a", "token-not-valid", secret_payload.decode()):
        assert needle not in logs


async def test_forwarded_client_cert_quoted_values_name_no_identity(tmp_path: Path) -> None:
    """Envoy quotes a value holding `,` `;` or `=` (a certificate's Subject):
    a Subject holding `;URI=<another id>` named that id, an operator of
    another tenant here. Only the element's own URI pair counts, and a
    header whose quote never ends is refused."""
    spiffe = write_spiffe(tmp_path / "spiffe.json", {
        "spiffe://mesh/ns/b/sa/x": ("tenant-b", "service"),
        "spiffe://mesh/ns/a/sa/admin": ("tenant-a", "operator"),
    })
    app = App(Settings(listen="127.0.0.1:0", spiffe_map=spiffe, trust_xfcc=True), storage=MemoryStorage())
    await app.start()

    def client(xfcc: str) -> fencepost.AsyncClient:
        return fencepost.AsyncClient(f"127.0.0.1:{app.port}", metadata=[("x-forwarded-client-cert", xfcc)],
                                     retry=fencepost.NO_RETRY)

    try:
        for subject in ('"CN=e;URI=spiffe://mesh/ns/a/sa/admin"', '"O=x,CN=e;URI=spiffe://mesh/ns/a/sa/admin"',
                        '"CN=\\"q\\";URI=spiffe://mesh/ns/a/sa/admin"'):
            async with client(f"By=spiffe://mesh/ns/fp/sa/fencepost;Hash=abc;Subject={subject};"
                              "URI=spiffe://mesh/ns/b/sa/x") as c:
                await c.put("k", b"v")
        assert [i.key for i in await app.storage.list("", None, 10)] == ["tenant-b/kv/k"]
        async with client('URI=spiffe://mesh/ns/a/sa/admin;Subject="CN=e,By=x;URI=spiffe://mesh/ns/b/sa/x') as c:
            with pytest.raises(errors.Unauthenticated):
                await c.put("k", b"v")
        assert [i.key for i in await app.storage.list("", None, 10)] == ["tenant-b/kv/k"]
        # Envoy writes one URI pair per URI SAN ("URI=" for none) and URI and DNS
        # values unquoted: a SAN holding `;URI=<id>` (a URI SAN with a `;`, a DNS
        # SAN of a certificate with no URI SAN) reads as a second URI pair. An SVID
        # has exactly one URI SAN: an element with two URI pairs is refused.
        async with client("Hash=abc;URI=spiffe://mesh/ns/b/sa/x;DNS=b.mesh") as c:
            await c.put("k2", b"v")
        for uris in ("URI=spiffe://mesh/ns/b/sa/x;URI=spiffe://mesh/ns/a/sa/admin",
                     "URI=spiffe://mesh/ns/a/sa/admin;URI=spiffe://mesh/ns/b/sa/x",
                     "URI=https://mesh/docs;URI=spiffe://mesh/ns/a/sa/admin",
                     "URI=;DNS=x;URI=spiffe://mesh/ns/a/sa/admin",
                     "URI=;DNS=b.mesh"):
            async with client(f"Hash=abc;{uris}") as c:
                with pytest.raises(errors.Unauthenticated):
                    await c.put("k3", b"v")
        assert [i.key for i in await app.storage.list("", None, 10)] == ["tenant-b/kv/k", "tenant-b/kv/k2"]
    finally:
        await app.stop(grace=0.2)


async def test_health_follows_the_backend_probe() -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from fencepost_server.storage import BackendUnavailable

    class Flaky(MemoryStorage):
        down = False

        async def ping(self) -> None:
            if self.down:
                raise BackendUnavailable("probe refused")

    backend = Flaky()
    app = App(Settings(listen="127.0.0.1:0", health_probe_seconds=0.05), storage=backend)
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def status() -> int:
                return (await stub.Check(health_pb2.HealthCheckRequest(service=""))).status

            async def wait_for(want: int) -> None:
                for _ in range(200):
                    if await status() == want:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"health never became {want}")

            assert await status() == health_pb2.HealthCheckResponse.SERVING
            backend.down = True
            await wait_for(health_pb2.HealthCheckResponse.NOT_SERVING)
            backend.down = False
            await wait_for(health_pb2.HealthCheckResponse.SERVING)
    finally:
        await app.stop(grace=0.2)


async def test_health_is_not_serving_while_the_start_up_probe_waits() -> None:
    """The port serves before the first backend probe has answered (a slow
    or unreachable DynamoDB: up to 5 s). Health said SERVING for the whole
    server meanwhile (grpc's default), so a readiness check sent traffic to
    a server whose backend might be down."""
    import socket

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    answered = asyncio.Event()

    class Slow(MemoryStorage):
        async def ping(self) -> None:
            await answered.wait()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = App(Settings(listen=f"127.0.0.1:{port}"), storage=Slow())
    starting = asyncio.create_task(app.start())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for _ in range(100):  # until the port serves, the probe still waiting
                try:
                    res = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("the port never served")
            assert not starting.done()
            assert res.status == health_pb2.HealthCheckResponse.NOT_SERVING
            answered.set()
            await starting
            res = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            assert res.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        answered.set()
        await starting
        await app.stop(grace=0.2)


async def test_an_rpc_the_caller_gave_up_on_is_not_counted_ok() -> None:
    """A unary call past its deadline and a stream the caller cancelled end
    the handler with a cancellation, not an exception: they were counted as
    code OK, so timeouts never showed in an error rate."""
    from prometheus_client import generate_latest

    app = App(Settings(listen="127.0.0.1:0"), storage=MemoryStorage())
    await app.start()
    try:
        async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", retry=fencepost.NO_RETRY, timeout=10) as c:
            with pytest.raises(errors.FencepostError):
                await c.claim_orphan("w", ttl=5, wait=5, timeout=0.3)
            sid = (await c.open_session("agent", "k")).session_id
            gen = (await c.acquire_lease(sid, "A", ttl=60)).generation
            watch = asyncio.create_task(anext(aiter(c.watch_inbox(sid, gen))))
            await asyncio.sleep(0.3)
            watch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await watch
        await asyncio.sleep(0.5)  # the handlers see the cancellation
        text = generate_latest(app.metrics.registry).decode()
        assert 'code="OK",method="Ledger/ClaimOrphan"' not in text, text
        assert 'code="DEADLINE_EXCEEDED",method="Ledger/ClaimOrphan"} 1.0' in text, text
        assert 'code="OK",method="Ledger/WatchInbox"' not in text, text
        assert 'code="CANCELLED",method="Ledger/WatchInbox"} 1.0' in text, text
    finally:
        await app.stop(grace=0.2)
