"""`fencepost serve` refuses a configuration mistake before starting anything:
one line on stderr naming the flag and what is expected, exit 2 for flags
and configuration files, exit 3 when this machine cannot run a valid
configuration (port taken, state root unusable), never a traceback."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencepost_server.cli import Exit

USAGE, START_FAILED = Exit.USAGE, Exit.START_FAILED


def serve(*argv: str, cwd: Path, prefix: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `fencepost serve` with a short-lived default state root; a
    mistake must end it well before `timeout` (a started server would not).
    A free port unless the test names one: runs in parallel never meet on the default."""
    if "--listen" not in argv:
        argv = ("--listen", "127.0.0.1:0", *argv)
    if "--backend" not in argv and "--state-root" not in argv:  # --state-root is the default backend's only
        argv = ("--state-root", str(cwd / "state"), *argv)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "fencepost_server", "serve", *argv],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def assert_refused(res: subprocess.CompletedProcess[str], code: int, *names: str) -> str:
    lines = res.stderr.splitlines()
    assert res.returncode == code, (res.returncode, res.stderr)
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    line = lines[0]
    assert line.startswith("fencepost: error: "), line
    for name in names:
        assert name in line, (name, line)
    return line


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(("backend", "expected", "example"), [
    pytest.param("memory", "no scheme", "memory://", id="no-scheme"),
    pytest.param("postgres://x", "'postgres'", "sqlite://", id="unknown-scheme"),
    pytest.param("sqlite://", "a path", "sqlite:///", id="sqlite-without-path"),
    pytest.param("dynamodb://", "a table", "dynamodb://TABLE", id="dynamodb-without-table"),
    # a region or folder written before the table was ignored, and the data went
    # to a table named after it ("us-east-1"; --create-table even created it)
    pytest.param("dynamodb://us-east-1/sessions", "'us-east-1/sessions'", "dynamodb://TABLE",
                 id="dynamodb-table-with-a-path"),
    pytest.param("dynamodb://me@sessions:8000", "'me@sessions:8000'", "3..255", id="dynamodb-table-not-a-name"),
    pytest.param("dynamodb://t", "'t'", "3..255", id="dynamodb-table-too-short"),
    # a typo must not quietly run with another durability than asked for (SQLite reads
    # an unknown synchronous value as NORMAL, and an unknown parameter was ignored)
    pytest.param("sqlite:///x.db?synchronous=ful", "'ful'", "FULL", id="sqlite-synchronous-unknown"),
    pytest.param("sqlite:///x.db?synchronus=OFF", "synchronus", "synchronous", id="sqlite-parameter-unknown"),
    # a number DynamoDB's client cannot use was accepted, and every call then
    # failed (a negative read timeout: "Read timeout"; nan: "cannot convert float NaN")
    pytest.param("dynamodb://tbl?region=r&read_timeout=-1", "read_timeout", "> 0", id="dynamodb-read-timeout-negative"),
    pytest.param("dynamodb://tbl?region=r&connect_timeout=nan", "connect_timeout", "> 0", id="dynamodb-timeout-nan"),
    pytest.param("dynamodb://tbl?region=r&pool=abc", "pool", ">= 1", id="dynamodb-pool-not-a-number"),
    # the server started NOT SERVING forever: "Invalid endpoint: localhost:8000"
    pytest.param("dynamodb://tbl?region=r&endpoint=localhost:8000", "'localhost:8000'", "http://HOST:PORT",
                 id="dynamodb-endpoint-without-scheme"),
    pytest.param("dynamodb://tbl?region=r&endpoint=ftp://h:1", "'ftp://h:1'", "http://HOST:PORT",
                 id="dynamodb-endpoint-not-http"),
    pytest.param("dynamodb://tbl?region=r&attempts=0", "attempts", ">= 1", id="dynamodb-attempts-zero"),
    pytest.param("dynamodb://tbl?region=r&partition_cache_ttl=inf", "partition_cache_ttl", ">= 0",
                 id="dynamodb-ttl-inf"),
])
def test_bad_backend_url(tmp_path: Path, backend: str, expected: str, example: str) -> None:
    # names the flag, the problem, and a form that would have worked
    assert_refused(serve("--backend", backend, cwd=tmp_path), USAGE, "--backend", expected, example)


@pytest.mark.parametrize(("flag", "value", "expected"), [
    pytest.param("--listen", "notaport", "HOST:PORT", id="listen-no-port"),
    pytest.param("--listen", "127.0.0.1:99999", "1..65535", id="listen-port-out-of-range"),
    pytest.param("--listen", "127.0.0.1:-1", "1..65535", id="listen-negative-port"),
    pytest.param("--log-level", "bogus", "DEBUG, INFO", id="log-level"),
    pytest.param("--grace", "-5", ">= 0", id="grace-negative"),
    pytest.param("--grace", "nan", ">= 0", id="grace-nan"),
    pytest.param("--max-receive-bytes", "0", ">= 1048576", id="max-receive-bytes-zero"),
    pytest.param("--max-receive-bytes", "1048575", "list page", id="max-receive-bytes-under-a-page"),
    # gRPC's limit is a 32-bit int: past it the server failed with "unexpected OverflowError", exit 1
    pytest.param("--max-receive-bytes", "2147483648", "<= 2147483647", id="max-receive-bytes-over-int32"),
    pytest.param("--metrics-listen", "9090", "HOST:PORT", id="metrics-listen-no-host"),
    # brackets hold an IPv6 address: these failed at bind as exit 3 with a gRPC core
    # log line ("Unparsable name"), or served /metrics on 127.0.0.1 named "http://[]:port"
    pytest.param("--listen", "[]:0", "IPv6", id="listen-empty-brackets"),
    pytest.param("--listen", "[127.0.0.1]:0", "IPv6", id="listen-ipv4-in-brackets"),
    pytest.param("--metrics-listen", "[]:0", "IPv6", id="metrics-listen-empty-brackets"),
    pytest.param("--retention-seconds", "0", "> 0", id="retention-seconds-zero"),  # passes back to back
])
def test_bad_flag_value(tmp_path: Path, flag: str, value: str, expected: str) -> None:
    assert_refused(serve(f"{flag}={value}", cwd=tmp_path), USAGE, flag, expected, value)


def test_port_in_use(tmp_path: Path, busy_port: int) -> None:
    assert_refused(serve("--listen", f"127.0.0.1:{busy_port}", cwd=tmp_path), START_FAILED,
                   "--listen", str(busy_port), "in use")


def test_metrics_port_in_use_and_no_event_loop_noise(tmp_path: Path, busy_port: int) -> None:
    res = serve("--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{busy_port}", cwd=tmp_path)
    assert_refused(res, START_FAILED, "--metrics-listen", str(busy_port), "in use")
    assert "Event loop is closed" not in res.stderr


def test_state_root_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file, not a directory")
    assert_refused(serve(cwd=tmp_path), START_FAILED, "--state-root", "not a directory")


def test_state_root_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    res = serve("--state-root", str(tmp_path / "file" / "sub"), cwd=tmp_path)
    assert_refused(res, START_FAILED, "--state-root", "Not a directory")


def test_state_root_unreadable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o000)
    # root passes every mode check: as root the server runs without the
    # capabilities that override them, so the mode bits apply as for anyone
    prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search") if os.geteuid() == 0 else ()
    try:
        res = serve(cwd=tmp_path, prefix=prefix)
    finally:
        state.chmod(0o700)
    assert_refused(res, START_FAILED, "--state-root", "not readable and writable")


def test_state_root_holds_a_non_database(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "fencepost.db").write_bytes(b"this is not a SQLite database, just text" * 40)
    assert_refused(serve(cwd=tmp_path), START_FAILED, "--state-root", "not a database")


def test_tokens_file_missing(tmp_path: Path) -> None:
    assert_refused(serve("--tokens-file", str(tmp_path / "absent.json"), cwd=tmp_path), USAGE,
                   "--tokens-file", "No such file")


@pytest.mark.parametrize(("content", "expected"), [
    pytest.param('{"tokens": [{"name": "a", "tenant": "t"}]}', "'sha256'", id="entry-without-sha256"),
    pytest.param("{not json", "not JSON", id="not-json"),
    pytest.param('["a list"]', '{"tokens": [', id="wrong-shape"),
    pytest.param('{"tokens": [{"name": "a", "sha256": "zz", "tenant": "t"}]}', "not hex", id="sha256-not-hex"),
    pytest.param('{"tokens": [{"name": "a", "sha256": "' + "ab" * 32 + '"}]}', "no tenant", id="no-tenant"),
    pytest.param('{"tokens": [{"name": "a", "sha256": "' + "ab" * 32 + '", "tenant": "t"}, '
                 '{"name": "b", "sha256": "' + "ab" * 32 + '", "tenant": "u"}]}', "one sha256",
                 id="one-token-two-tenants"),
    # a tenant or role of another JSON type loaded, and every call of the token was INTERNAL
    pytest.param('{"tokens": [{"name": "a", "sha256": "' + "ab" * 32 + '", "tenant": 5}]}', "'tenant'",
                 id="tenant-not-a-string"),
    pytest.param('{"tokens": [{"name": "a", "sha256": "' + "ab" * 32 + '", "tenant": ["t"]}]}', "'tenant'",
                 id="tenant-a-list"),
    pytest.param('{"tokens": [{"name": ["a"], "sha256": "' + "ab" * 32 + '", "tenant": "t"}]}', "'name'",
                 id="name-not-a-string"),
])
def test_tokens_file_malformed(tmp_path: Path, content: str, expected: str) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(content)
    assert_refused(serve("--tokens-file", str(tokens), cwd=tmp_path), USAGE, "--tokens-file", expected)


@pytest.mark.parametrize("content", ["ab" * 31, "zz" * 32, ""])
def test_page_token_key_file_malformed(tmp_path: Path, content: str) -> None:
    key = tmp_path / "page.key"
    key.write_text(content)
    assert_refused(serve("--page-token-key-file", str(key), cwd=tmp_path), USAGE, "--page-token-key-file",
                   "64 hex digits" if content.startswith("zz") else "32 bytes")


def test_tls_cert_without_key(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    assert_refused(serve("--tls-cert", str(cert), cwd=tmp_path), USAGE, "--tls-cert", "--tls-key")


def test_debug_log_level_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file")
    res = serve("--log-level", "DEBUG", cwd=tmp_path)
    assert res.returncode == START_FAILED
    assert "Traceback" in res.stderr and "fencepost: error: --state-root" in res.stderr


def test_client_timeout_must_be_positive(tmp_path: Path) -> None:
    for prog in ("fencepost_server", "fencepost"):
        res = subprocess.run([sys.executable, "-m", prog, "kv", "get", "k", "--timeout", "-1"],
                             capture_output=True, text=True, timeout=60)
        assert_refused(res, USAGE, "--timeout", "> 0", "-1")


def test_version(tmp_path: Path) -> None:
    import fencepost

    server = subprocess.run([sys.executable, "-m", "fencepost_server", "--version"],
                            capture_output=True, text=True, timeout=60)
    assert server.returncode == 0 and server.stderr == ""
    line = server.stdout.strip()
    assert line.startswith(f"fencepost {fencepost.__version__} ")
    assert f"server {fencepost.__version__}" in line and f"sdk {fencepost.__version__}" in line
    assert "proto fencepost.v1 @ " in line
    client = subprocess.run([sys.executable, "-m", "fencepost", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert client.returncode == 0 and f"sdk {fencepost.__version__}" in client.stdout
    assert line.split("@ ")[1] == client.stdout.strip().split("@ ")[1]  # one proto revision


def test_create_table_needs_a_dynamodb_backend(tmp_path: Path) -> None:
    assert_refused(serve("--create-table", "--backend", "memory://", cwd=tmp_path), USAGE,
                   "--create-table", "dynamodb://")


@pytest.mark.parametrize("backend", ["memory://", "sqlite://{tmp}/elsewhere.db", "dynamodb://tbl?region=us-east-1"])
def test_state_root_with_a_backend_is_refused(tmp_path: Path, backend: str) -> None:
    """--state-root only places the default SQLite file: with --backend it
    would be ignored, and an operator who gave both (expecting the data under
    the state root) would find it elsewhere."""
    res = serve("--state-root", str(tmp_path / "state"), "--backend", backend.format(tmp=tmp_path), cwd=tmp_path,
                timeout=30)
    line = assert_refused(res, USAGE, "--state-root", "--backend")
    assert "default SQLite backend" in line, line
    assert not (tmp_path / "state").exists() and not (tmp_path / "elsewhere.db").exists()


def test_create_table_that_fails_is_a_start_failure(tmp_path: Path) -> None:
    """--create-table must create the table: when it cannot (endpoint down,
    credentials refused) that is this machine's problem, exit 3 with the
    cause, not "unexpected EndpointConnectionError" (exit 1, "a bug")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens there once closed
    res = serve("--listen", "127.0.0.1:0", "--create-table", "--log-level", "WARNING",
                "--backend", f"dynamodb://tbl?region=us-east-1&endpoint=http://127.0.0.1:{closed}&attempts=1",
                cwd=tmp_path, prefix=("env", "AWS_ACCESS_KEY_ID=x", "AWS_SECRET_ACCESS_KEY=y"))
    assert_refused(res, START_FAILED, "--create-table", "endpoint unreachable")


def test_create_table_accepts_a_dynamodb_scheme_in_any_case() -> None:
    """The backend accepts DynamoDB://T (URL schemes are case-insensitive), so
    --create-table must too."""
    from fencepost_server.cli import _preflight, build_parser

    args = build_parser().parse_args(["serve", "--create-table", "--backend", "DynamoDB://tbl?region=us-east-1",
                                      "--listen", "127.0.0.1:0"])
    assert _preflight(args).backend == "DynamoDB://tbl?region=us-east-1"


@pytest.mark.parametrize("flag", ["--retention-seconds=30", "--retention-batch=50"])
def test_retention_pacing_without_anything_to_retain_is_refused(tmp_path: Path, flag: str) -> None:
    """--retention-seconds reads as "keep this long": alone it only paced
    passes that never run, and the server kept everything, saying nothing."""
    assert_refused(serve(flag, cwd=tmp_path), USAGE, flag.split("=")[0], "--retain-idle-sessions")


def test_retention_pacing_with_something_to_retain_passes_the_checks() -> None:
    from fencepost_server.cli import _preflight, build_parser

    args = build_parser().parse_args(["serve", "--backend", "memory://", "--listen", "127.0.0.1:0",
                                      "--retain-commit-markers", "600", "--retention-seconds", "30",
                                      "--retention-batch", "50"])
    settings = _preflight(args)
    assert (settings.retention_seconds, settings.retention_batch) == (30.0, 50)
    defaults = _preflight(build_parser().parse_args(["serve", "--backend", "memory://", "--listen", "127.0.0.1:0"]))
    assert (defaults.retention_seconds, defaults.retention_batch) == (60.0, 1000)


def test_non_loopback_without_authentication(tmp_path: Path) -> None:
    assert_refused(serve("--listen", "0.0.0.0:0", cwd=tmp_path), USAGE, "without authentication", "--insecure")


def test_spiffe_map_without_a_source_of_spiffe_ids(tmp_path: Path) -> None:
    """With neither mTLS nor the sidecar's header, nothing reads the map: the
    server started with no authentication at all (every caller the default
    tenant's operator) although the operator configured identities."""
    spiffe = tmp_path / "spiffe.json"
    spiffe.write_text('{"spiffe": [{"id": "spiffe://corp/ns/a/sa/x", "tenant": "a", "role": "service"}]}')
    assert_refused(serve("--spiffe-map", str(spiffe), "--listen", "127.0.0.1:0", cwd=tmp_path), USAGE,
                   "--spiffe-map", "--tls-client-ca", "--trust-xfcc")


def test_spiffe_map_names_one_id_twice(tmp_path: Path) -> None:
    """The later entry silently won: which tenant a caller got depended on file order."""
    spiffe = tmp_path / "spiffe.json"
    spiffe.write_text('{"spiffe": [{"id": "spiffe://corp/x", "tenant": "a", "role": "service"}, '
                      '{"id": "spiffe://corp/x", "tenant": "a", "role": "operator"}]}')
    assert_refused(serve("--spiffe-map", str(spiffe), "--trust-xfcc", "--listen", "127.0.0.1:0", cwd=tmp_path),
                   USAGE, "--spiffe-map", "mapped twice")


@pytest.fixture(scope="module")
def tls_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two self-signed certificates with their keys, and a file that is no PEM at all."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    root = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.timezone.utc)
    files = {}
    for name in ("a", "b"):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                .sign(key, hashes.SHA256()))
        files[f"{name}.crt"] = root / f"{name}.crt"
        files[f"{name}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{name}.key"] = root / f"{name}.key"
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        files[f"{name}.key"].write_bytes(pem)
    files["garbage"] = root / "garbage.pem"
    files["garbage"].write_text("not a certificate\n")
    return files


@pytest.mark.parametrize(("cert", "key", "ca", "expected"), [
    pytest.param("garbage", "a.key", None, "--tls-cert", id="cert-not-pem"),
    pytest.param("a.crt", "garbage", None, "--tls-key", id="key-not-pem"),
    pytest.param("a.crt", "b.key", None, "not the certificate's", id="key-of-another-certificate"),
    pytest.param("a.crt", "a.key", "garbage", "--tls-client-ca", id="client-ca-not-pem"),
])
def test_tls_files_that_do_not_parse(tmp_path: Path, tls_pairs: dict[str, Path], cert: str, key: str,
                                     ca: str | None, expected: str) -> None:
    # gRPC found these only at bind time: core log lines, then "Failed to bind
    # to address 127.0.0.1:0" and exit 3, naming the port instead of the file
    argv = ["--listen", "127.0.0.1:0", "--tls-cert", str(tls_pairs[cert]), "--tls-key", str(tls_pairs[key])]
    if ca:
        argv += ["--tls-client-ca", str(tls_pairs[ca])]
    assert_refused(serve(*argv, cwd=tmp_path), USAGE, expected)


def test_tls_files_that_parse_pass_the_check(tls_pairs: dict[str, Path], tmp_path: Path) -> None:
    from fencepost_server.config import Settings
    from fencepost_server.startup import check_config

    spiffe = tmp_path / "spiffe.json"
    spiffe.write_text('{"spiffe": [{"id": "spiffe://corp/ns/a/sa/x", "tenant": "a", "role": "service"}]}')
    check_config(Settings(listen="127.0.0.1:0", tls_cert=tls_pairs["a.crt"], tls_key=tls_pairs["a.key"],
                          tls_client_ca=tls_pairs["b.crt"], spiffe_map=spiffe))


@pytest.mark.parametrize("source", ["--tls-client-ca", "--trust-xfcc"])
def test_a_source_of_spiffe_ids_without_a_map_or_tokens(tmp_path: Path, tls_pairs: dict[str, Path],
                                                       source: str) -> None:
    """Without --spiffe-map no SPIFFE id maps to a tenant, and without
    --tokens-file nothing else can: the server started, and refused every
    call ("SPIFFE id ... is not mapped to a tenant")."""
    argv = ["--listen", "127.0.0.1:0"]
    if source == "--tls-client-ca":
        argv += ["--tls-cert", str(tls_pairs["a.crt"]), "--tls-key", str(tls_pairs["a.key"]),
                 "--tls-client-ca", str(tls_pairs["b.crt"])]
    else:
        argv += ["--trust-xfcc"]
    assert_refused(serve(*argv, cwd=tmp_path, timeout=20), USAGE, source, "--spiffe-map", "--tokens-file")


@pytest.mark.parametrize(("listen", "metrics", "workers"), [
    pytest.param("127.0.0.1:{p}", "127.0.0.1:{p}", "1", id="same-address"),
    pytest.param("127.0.0.1:{p}", "0.0.0.0:{p}", "1", id="wildcard-metrics"),
    pytest.param("127.0.0.1:{p}", "127.0.0.1:{q}", "2", id="second-worker-metrics"),
])
def test_metrics_on_the_grpc_port(tmp_path: Path, listen: str, metrics: str, workers: str) -> None:
    # both ports were free when checked one by one, so the second bind failed
    # later: "cannot listen: [Errno 98] Address already in use", exit 3, no flag named
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    fill = {"p": p, "q": p - 1}
    assert_refused(serve("--listen", listen.format(**fill), "--metrics-listen", metrics.format(**fill),
                         "--workers", workers, cwd=tmp_path), USAGE, "--listen", "--metrics-listen")


@contextlib.contextmanager
def _busy_after_a_free_one() -> Iterator[int]:
    """A port held busy whose predecessor was free when picked (the suite's
    other servers take ports of their own meanwhile: any busy_port - 1 may be one)."""
    for _ in range(100):
        with socket.socket() as free, socket.socket() as busy:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
            try:
                busy.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            busy.listen()
            free.close()
            yield port + 1
            return
    raise AssertionError("no free port followed by a free one")


def test_metrics_ports_of_every_worker_are_checked(tmp_path: Path) -> None:
    """Worker i serves /metrics on port + i: a port past 65535 (a traceback in
    the worker, restarted forever) or a taken one is refused before any worker
    starts, as the first worker's port is."""
    res = serve("--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:65535", "--workers", "2", cwd=tmp_path)
    assert_refused(res, USAGE, "--metrics-listen", "--workers", "65536")
    with _busy_after_a_free_one() as busy_port:
        res = serve("--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{busy_port - 1}", "--workers", "2",
                    cwd=tmp_path)
        assert_refused(res, START_FAILED, "--metrics-listen", str(busy_port), "in use")


def test_metrics_on_the_grpc_port_by_another_name(tmp_path: Path) -> None:
    """localhost and 127.0.0.1 are different text, one address: the checks
    pass, gRPC takes the port, and /metrics then failed with "cannot listen:
    [Errno 98] Address already in use", naming neither flag nor port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = serve("--listen", f"localhost:{port}", "--metrics-listen", f"127.0.0.1:{port}", cwd=tmp_path)
    assert_refused(res, START_FAILED, "--metrics-listen", f"127.0.0.1:{port}", "in use")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_metrics_on_an_ipv6_address() -> None:
    """--metrics-listen [::1]:PORT passes the flag check (IPv6 in brackets, as
    for --listen) and must then serve: the brackets are URL syntax, not the
    host ("cannot listen: Name or service not known", exit 3)."""
    import urllib.request

    from fencepost_server.observability import Metrics

    metrics = Metrics()
    port = metrics.serve("[::1]:0")
    try:
        assert b"fencepost_" in urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=10).read()
    finally:
        metrics.stop()


def _secret_files(tmp_path: Path, mode: int) -> list[str]:
    """A tokens file and a page-token key file with `mode`; the serve flags naming them."""
    from tests.api.security_support import write_tokens

    tokens = write_tokens(tmp_path / "tokens.json", {"tok": ("a", "service")})
    key = tmp_path / "page.key"
    key.write_text("ab" * 32 + "\n")
    for path in (tokens, key):
        path.chmod(mode)
    return ["--tokens-file", str(tokens), "--page-token-key-file", str(key)]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o622])
def test_secret_files_open_to_group_or_others_are_warned_about(
        tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture) -> None:
    """A tokens file or page-token key file that group or others may read (or
    write: add a token, swap the key) is named at start-up with its mode, as
    ssh names a private key; the server still starts (a mounted secret's
    mode is not always the operator's to choose)."""
    from fencepost_server.cli import _preflight, build_parser

    argv = ["serve", "--listen", "127.0.0.1:0", "--backend", "memory://", *_secret_files(tmp_path, mode)]
    with caplog.at_level("WARNING", logger="fencepost"):
        _preflight(build_parser().parse_args(argv))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 2, warned
    tokens, key = warned
    assert f"--tokens-file {tmp_path / 'tokens.json'}" in tokens and f"mode {mode:04o}" in tokens
    assert f"--page-token-key-file {tmp_path / 'page.key'}" in key and f"mode {mode:04o}" in key
    assert all("chmod 600" in line for line in warned)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_secret_files_are_not_warned_about(tmp_path: Path, mode: int,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    from fencepost_server.cli import _preflight, build_parser

    argv = ["serve", "--listen", "127.0.0.1:0", "--backend", "memory://", *_secret_files(tmp_path, mode)]
    with caplog.at_level("WARNING", logger="fencepost"):
        _preflight(build_parser().parse_args(argv))
    assert [r for r in caplog.records if r.levelname == "WARNING"] == []


#: configures logging as `fencepost serve --log-level LEVEL` does (argv[1]),
#: then logs one warning from botocore and one from fencepost
_LOG_AT_LEVEL = """
import logging, sys
from fencepost_server import cli
cli._configure_logging(cli.build_parser().parse_args(["serve", "--log-level", sys.argv[1]]))
logging.getLogger("botocore.credentials").warning("botocore says so")
logging.getLogger("fencepost").warning("fencepost says so")
logging.getLogger("botocore.credentials").info("Found credentials in environment variables.")
"""


@pytest.mark.parametrize(("level", "shown"), [
    ("DEBUG", ["botocore says so", "fencepost says so", "Found credentials"]),
    ("INFO", ["botocore says so", "fencepost says so"]),
    ("WARNING", ["botocore says so", "fencepost says so"]),
    ("ERROR", []),
    ("CRITICAL", []),
])
def test_the_aws_libraries_never_log_past_the_operator_s_level(level: str, shown: list[str]) -> None:
    """The AWS libraries are kept at WARNING to hide their routine INFO lines,
    never made louder than --log-level: at ERROR their warnings stay out
    too, as fencepost's own do."""
    res = subprocess.run([sys.executable, "-c", _LOG_AT_LEVEL, level], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    said = [text for text in ("botocore says so", "fencepost says so", "Found credentials") if text in res.stderr]
    assert said == shown, res.stderr
