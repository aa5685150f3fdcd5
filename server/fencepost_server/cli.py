"""The `fencepost` command: `serve` and operator subcommands."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fencepost.cli import register as register_client_commands
from fencepost.cli.args import (
    Parser,
    add_version_flag,
    host_port,
    int_between,
    log_level,
    non_negative_seconds,
    positive_int,
    positive_seconds,
    readable_file,
)

from . import __version__, cli_dynamodb, cli_lifecycle, tracing, workers
from .config import Settings
from .startup import ConfigError, StartFailure, check_config, check_listen, open_storage

if TYPE_CHECKING:
    from .app import App
    from .storage import Storage

log = logging.getLogger("fencepost")


class Exit:
    """Exit codes of `fencepost serve` (docs/cli.md; the client subcommands
    have their own table, `fencepost.cli.Exit`)."""

    OK = 0
    ERROR = 1  # an unexpected failure (the traceback is logged with --log-level DEBUG)
    USAGE = 2  # a flag or configuration file that cannot work (argparse's own code)
    START_FAILED = 3  # valid configuration, but this machine cannot run it: port taken, state root unusable
    INTERRUPTED = 130


# A page of a listing is at most half the message limit, and one entry of the
# largest key and value (256 KiB) must fit in a page: below this some stored
# items could be written but never listed. gRPC takes the limit as a 32-bit int.
_MESSAGE_BYTES = int_between(1024 * 1024, 2**31 - 1, "1 MiB: a largest key and value must fit in one list page, "
                                                     "half of it; gRPC's limit is a 32-bit integer")

_STATE_ROOT = Path(".fencepost")
_RETENTION_SECONDS, _RETENTION_BATCH = 60.0, 1000
_WORKERS = int_between(1, workers.MAX_WORKERS, "each worker is a whole server process")


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the gRPC server", description="run the gRPC server",
                       epilog="exit codes: 0 stopped, 1 unexpected failure, 2 a flag or configuration file "
                              "that cannot work, 3 cannot start here (port in use, state root unusable); "
                              "see docs/cli.md")
    p.add_argument("--listen", type=host_port, metavar="HOST:PORT", default="127.0.0.1:50051",
                   help="HOST:PORT to serve gRPC on, PORT 1..65535 or 0 for any free one (default %(default)s)")
    # default None: given together with --backend it is refused, not ignored (see _preflight)
    p.add_argument("--state-root", default=None, type=Path, metavar="DIR",
                   help=f"directory of the default SQLite backend's fencepost.db, not with --backend "
                        f"(default {_STATE_ROOT})")
    p.add_argument("--backend", default=None, metavar="URL",
                   help="backend URL: memory://, sqlite:///path.db, dynamodb://TABLE?endpoint=URL&region=R "
                        "(default: sqlite under --state-root)")
    p.add_argument("--grace", type=non_negative_seconds, metavar="SECONDS", default=10.0,
                   help="seconds >= 0 to drain in-flight RPCs on shutdown (default %(default)s)")
    p.add_argument("--max-receive-bytes", type=_MESSAGE_BYTES, metavar="BYTES", default=8 * 1024 * 1024,
                   help="largest request or response message in bytes (default %(default)s)")
    p.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True,
                   help="run on uvloop when installed (default: on)")
    p.add_argument("--workers", type=_WORKERS, metavar="N", default=1,
                   help=f"server processes sharing the port, one event loop each, 1..{workers.MAX_WORKERS}; "
                        "sqlite or dynamodb (default %(default)s, see docs/performance.md)")
    sec = p.add_argument_group("security (see README: running behind a mesh)")
    sec.add_argument("--tokens-file", type=readable_file, metavar="FILE", help="JSON file of SHA-256 token hashes -> tenant + role")
    sec.add_argument("--spiffe-map", type=readable_file, metavar="FILE", help="JSON file of SPIFFE ids -> tenant + role")
    sec.add_argument("--tls-cert", type=readable_file, metavar="PEM", help="server certificate (PEM)")
    sec.add_argument("--tls-key", type=readable_file, metavar="PEM", help="server private key (PEM)")
    sec.add_argument("--tls-client-ca", type=readable_file, metavar="PEM", help="CA for client certificates: turns on mTLS")
    sec.add_argument("--trust-xfcc", action="store_true",
                     help="trust the sidecar's x-forwarded-client-cert header (mesh-terminated mTLS)")
    sec.add_argument("--page-token-key-file", type=readable_file, metavar="FILE",
                     help="64 hex digits keying page tokens (default: a key kept in the backend)")
    sec.add_argument("--insecure", action="store_true",
                     help="allow a non-loopback --listen without authentication (never in production)")
    obs = p.add_argument_group("observability (tracing: the standard OTEL_* variables, see README)")
    obs.add_argument("--metrics-listen", type=host_port, metavar="HOST:PORT", help="HOST:PORT for Prometheus /metrics (off by default)")
    obs.add_argument("--log-format", choices=("text", "json"), default="text", help="log line format (default text)")
    obs.add_argument("--log-level", type=log_level, default="INFO", metavar="LEVEL",
                     help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default INFO); DEBUG also prints "
                          "the traceback of a failed start")
    p.add_argument("--create-table", action="store_true", help="create the DynamoDB table if missing")
    ret = p.add_argument_group("retention (docs/lifecycle.md; 0 = keep forever, the default)")
    ret.add_argument("--retain-idle-sessions", type=non_negative_seconds, default=0.0, metavar="SECONDS",
                     help="erase sessions idle longer than this (sessions with a live lease, live forks or "
                          "pending events wait)")
    ret.add_argument("--retain-journal-archives", type=non_negative_seconds, default=0.0, metavar="SECONDS",
                     help="delete journal archives rotated longer ago than this")
    ret.add_argument("--retain-commit-markers", type=non_negative_seconds, default=0.0, metavar="SECONDS",
                     help="delete commit_id idempotency markers older than this (a retry after it is "
                          "not replayed; it fails with SEQUENCE_MISMATCH)")
    # default None: given without a --retain-* flag it is refused, not ignored (see _preflight)
    ret.add_argument("--retention-seconds", type=positive_seconds, default=None, metavar="SECONDS",
                     help=f"one bounded retention pass this often, with a --retain-* flag "
                          f"(default {_RETENTION_SECONDS})")
    ret.add_argument("--retention-batch", type=positive_int, default=None, metavar="N",
                     help=f"list calls per retention pass, with a --retain-* flag (default {_RETENTION_BATCH})")
    p.set_defaults(func=_cmd_serve)


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        listen=args.listen,
        state_root=args.state_root or _STATE_ROOT,
        backend=args.backend,
        grace_seconds=args.grace,
        max_receive_bytes=args.max_receive_bytes,
        uvloop=args.uvloop,
        tokens_file=args.tokens_file,
        spiffe_map=args.spiffe_map,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        trust_xfcc=args.trust_xfcc,
        page_token_key_file=args.page_token_key_file,
        metrics_listen=args.metrics_listen,
        retain_idle_sessions_seconds=args.retain_idle_sessions,
        retain_journal_archives_seconds=args.retain_journal_archives,
        retain_commit_markers_seconds=args.retain_commit_markers,
        retention_seconds=args.retention_seconds or _RETENTION_SECONDS,
        retention_batch=args.retention_batch or _RETENTION_BATCH,
    )


async def serve(settings: Settings, *, create_table: bool = False, tracing_line: str | None = None) -> int:
    from .app import App

    loop = asyncio.get_running_loop()
    # SIGHUP is handled from here on, before the identity files are read and
    # through the whole start-up (the backend probe can take seconds): its
    # default action would kill the server, and a reload asked for before the
    # handler existed would be lost (a revoked token kept working).
    # Signals run as loop callbacks, so one that arrives while App() reads the
    # files is handled after: a second, harmless read.
    built: list[App] = []
    loop.add_signal_handler(signal.SIGHUP, lambda: built and built[0].reload_identities())
    # SIGTERM / SIGINT are handled from here on too: one that arrives while
    # the server starts (the backend open, the probe) cancels the start-up,
    # and what was opened is closed. SIGTERM's default action would kill the
    # process with the SQLite writer and connections never closed.
    stop = asyncio.Event()
    starting = asyncio.current_task()
    cancel_on_stop = True  # only while starting: never a drain or a close cut short

    def on_stop() -> None:
        if cancel_on_stop and not stop.is_set() and starting is not None:
            starting.cancel()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)
    storage = open_storage(settings)
    app: App | None = None
    try:
        app = App(settings, storage=storage)
        built.append(app)
        if create_table:
            from .cli_dynamodb import ensure_table

            await ensure_table(app.storage)
        port = await app.start()
    except BaseException as exc:
        cancel_on_stop = False
        await _close_unstarted(app, storage)
        if isinstance(exc, asyncio.CancelledError) and stop.is_set():
            say("fencepost stopped before serving")
            return Exit.INTERRUPTED
        raise
    cancel_on_stop = False  # from here a stop drains
    # Everything built so far lives as long as the process: keep it out of the
    # collector's scans so per-call garbage collection stays cheap.
    gc.freeze()
    host = settings.listen.rsplit(":", 1)[0]
    describe = getattr(app.auth, "describe", lambda: "authentication configured")()
    backend = settings.backend_url()
    if app.backend_problem:
        backend += f" (NOT SERVING until it answers: {app.backend_problem})"
    extra = f" — {tracing_line}" if tracing_line else ""
    say(f"fencepost serving on {host}:{port} — backend {backend} — {describe}{extra}")
    if app.metrics_port is not None:
        say(f"fencepost metrics on http://{settings.metrics_listen.rsplit(':', 1)[0]}:{app.metrics_port}/metrics")
    await stop.wait()
    say("fencepost draining…")
    await app.stop()
    say("fencepost stopped")
    return Exit.OK


async def _close_unstarted(app: App | None, storage: Storage) -> None:
    """A start-up that failed or was stopped: stop what `App.start` got
    running (the port, when bound) and close the backend, either way."""
    if app is not None and app.server is not None:
        await app.stop(0)
    else:
        await storage.close()


def say(line: str) -> None:
    """One line on stdout for whoever watches the server. A reader that has
    gone (a log pipe that died) never stops it: the rest goes nowhere."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        workers.stdout_gone()


def _preflight(args: argparse.Namespace) -> Settings:
    """Every check that needs no running server: flags together, files,
    then the ports (fails before anything is opened or bound)."""
    settings = _settings(args)
    if args.state_root is not None and args.backend is not None:
        raise ConfigError(f"argument --state-root: only places the default SQLite backend's fencepost.db; "
                          f"--backend {args.backend} says where the data is (give one of the two)")
    check_config(settings, insecure=args.insecure)
    for flag, given in (("--retention-seconds", args.retention_seconds), ("--retention-batch", args.retention_batch)):
        if given is not None and not settings.retention_config().enabled:
            raise ConfigError(f"argument {flag}: paces retention passes, and none runs without "
                              "--retain-idle-sessions, --retain-journal-archives or --retain-commit-markers "
                              "(everything is kept)")
    if args.create_table and settings.backend_scheme() != "dynamodb":
        raise ConfigError("argument --create-table: needs a dynamodb:// --backend")
    refused = workers.refusal(settings, args.workers)
    if refused:
        raise ConfigError(refused)
    if settings.metrics_listen and _overlap(settings.listen, settings.metrics_listen, args.workers):
        raise ConfigError(f"arguments --listen {settings.listen} and --metrics-listen {settings.metrics_listen}: "
                          "gRPC and /metrics need ports of their own (metrics: port + worker index)")
    check_listen(settings.listen, "--listen")
    if settings.metrics_listen:
        for listen in _metrics_ports(settings.metrics_listen, args.workers):
            check_listen(listen, "--metrics-listen")
    return settings


def _metrics_ports(metrics: str, workers: int) -> list[str]:
    """The /metrics address of each worker (port + worker index; port 0: any free one)."""
    host, _, port = metrics.rpartition(":")
    if int(port) == 0:
        return [metrics]
    last = int(port) + workers - 1
    if last > 65535:
        raise ConfigError(f"arguments --metrics-listen {metrics} and --workers {workers}: worker i serves "
                          f"/metrics on port + i, and {last} is past 65535")
    return [f"{host}:{int(port) + i}" for i in range(workers)]


def _overlap(listen: str, metrics: str, workers: int) -> bool:
    """Whether /metrics (port .. port + workers - 1) would take the gRPC port
    on the same address (a wildcard address overlaps every other)."""
    host, _, port = listen.rpartition(":")
    m_host, _, m_port = metrics.rpartition(":")
    wildcard = ("0.0.0.0", "[::]")
    same_host = host == m_host or host in wildcard or m_host in wildcard
    return same_host and int(port) != 0 and int(m_port) != 0 and 0 <= int(port) - int(m_port) < workers


def _tracing_from_env() -> str | None:
    try:
        return tracing.configure_from_env()
    except tracing.TracingConfigError as exc:
        raise ConfigError(str(exc)) from exc


def _cmd_serve(args: argparse.Namespace) -> int:
    # SIGHUP's default action kills: from here on it never does. Until the
    # server (or the supervisor) installs its reload handler a SIGHUP has
    # nothing to reload: the identity files are read after that handler exists.
    signal.signal(signal.SIGHUP, lambda _signum, _frame: None)
    settings = _preflight(args)
    tracing_line = _tracing_from_env()
    try:
        return workers.serve(settings, create_table=args.create_table, workers=args.workers,
                             tracing_line=tracing_line)
    finally:
        tracing.shutdown()


def _hash_token_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hash-token", help="hash a bearer token for the tokens file",
                       description="print the tokens-file line for a token read from stdin (or --generate one)")
    p.add_argument("--tenant", required=True, help="the tenant the token's calls act in")
    p.add_argument("--role", choices=("service", "operator"), default="service",
                   help="what the token may call (README: Security; default %(default)s)")
    p.add_argument("--name", default="token",
                   help="a label for logs and errors, never the secret (default %(default)s)")
    p.add_argument("--generate", action="store_true", help="generate a new random token (printed once)")
    p.set_defaults(func=_cmd_hash_token)


def _cmd_hash_token(args: argparse.Namespace) -> int:
    import json
    import secrets

    from .security import hash_token

    try:  # bytes of argv that are not UTF-8 arrive as lone surrogates, which no key can hold
        args.tenant.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("hash-token: --tenant is not UTF-8 text") from None
    if args.generate:
        token = secrets.token_urlsafe(32)
        print(f"token (give it to the caller; it is not stored): {token}", file=sys.stderr)
    else:
        token = _token_from_stdin()
    entry = {"name": args.name, "sha256": hash_token(token), "tenant": args.tenant, "role": args.role}
    print(json.dumps(entry))
    return 0


def _token_from_stdin() -> str:
    """The first line of stdin, stripped; none (empty, blank, or no stdin at
    all: fd 0 closed) is a usage error (exit 2) saying what to do instead."""
    line = sys.stdin.buffer.readline() if sys.stdin is not None else b""
    try:
        token = line.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError("hash-token: the token on stdin is not UTF-8 text") from None
    if not token:
        raise ConfigError("hash-token: no token on stdin (pipe the token in, or pass --generate for a new one)")
    return token


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fencepost", description="durable state for agent runtimes")
    add_version_flag(parser, server=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _hash_token_parser(sub)
    cli_dynamodb.register(sub)
    cli_lifecycle.register(sub)  # backup / restore / migrate
    register_client_commands(sub)  # kv / ledger / journal / memory over gRPC
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "text") == "json":
        from .observability import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=getattr(args, "log_level", "WARNING"), handlers=[handler])
    quiet_libraries()


#: libraries that log routine things at INFO ("Found credentials in
#: environment variables." on every DynamoDB start)
_CHATTY_LIBRARIES = ("botocore", "aiobotocore", "boto3", "aioboto3")


def quiet_libraries() -> None:
    """Keep the chatty libraries at WARNING while the operator's log level
    (the root logger's, set just before) lets INFO through; at DEBUG, or at
    ERROR and above, they follow it. (A level set on their logger decides
    alone: WARNING there would show their warnings under --log-level ERROR.)"""
    root = logging.getLogger().getEffectiveLevel()
    level = logging.WARNING if logging.DEBUG < root < logging.WARNING else logging.NOTSET
    for name in _CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args)
    try:
        return int(args.func(args) or Exit.OK)
    except ConfigError as exc:
        return _failed(exc, Exit.USAGE)
    except StartFailure as exc:
        return _failed(exc, Exit.START_FAILED)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except Exception as exc:  # the last resort: one line, the traceback only at DEBUG
        return _failed(exc, Exit.ERROR, f"unexpected {type(exc).__name__}: ")


def _failed(exc: BaseException, code: int, prefix: str = "") -> int:
    """One line on stderr (`fencepost: error: ...`); the traceback is logged
    only when --log-level DEBUG asked for it."""
    log.debug("failed", exc_info=exc)
    print(f"fencepost: error: {prefix}{exc}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
