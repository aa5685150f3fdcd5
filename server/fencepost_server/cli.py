"""The `fencepost` command: `serve` and operator subcommands."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

from fencepost.cli import register as register_client_commands

from . import cli_dynamodb
from .config import Settings


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the gRPC server")
    p.add_argument("--listen", default="127.0.0.1:50051", help="host:port (default %(default)s)")
    p.add_argument("--state-root", default=".fencepost", type=Path, help="where the SQLite file lives")
    p.add_argument("--backend", default=None, help="backend URL (memory://, sqlite:///path, dynamodb://TABLE?...)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds to drain in-flight RPCs on shutdown")
    p.add_argument("--max-receive-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--uvloop", action="store_true", help="run on uvloop when installed")
    sec = p.add_argument_group("security (see README: running behind a mesh)")
    sec.add_argument("--tokens-file", type=Path, help="JSON file of SHA-256 token hashes -> tenant + role")
    sec.add_argument("--spiffe-map", type=Path, help="JSON file of SPIFFE ids -> tenant + role")
    sec.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    sec.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    sec.add_argument("--tls-client-ca", type=Path, help="CA for client certificates: turns on mTLS")
    sec.add_argument("--trust-xfcc", action="store_true",
                     help="trust the sidecar's x-forwarded-client-cert header (mesh-terminated mTLS)")
    sec.add_argument("--page-token-key-file", type=Path,
                     help="64 hex digits keying page tokens (default: a key kept in the backend)")
    p.add_argument("--metrics-listen", help="host:port for Prometheus /metrics (off by default)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --listen without authentication (never in production)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--create-table", action="store_true", help="create the DynamoDB table if missing")
    p.set_defaults(func=_cmd_serve)


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        listen=args.listen,
        state_root=args.state_root,
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
    )


async def serve(settings: Settings, *, create_table: bool = False) -> int:
    from .app import App

    app = App(settings)
    if create_table:
        from .cli_dynamodb import ensure_table

        await ensure_table(app.storage)
    port = await app.start()
    # Everything built so far lives as long as the process: keep it out of the
    # collector's scans so per-call garbage collection stays cheap.
    gc.freeze()
    host = settings.listen.rsplit(":", 1)[0]
    describe = getattr(app.auth, "describe", lambda: "authentication configured")()
    print(
        f"fencepost serving on {host}:{port} — backend {settings.backend_url()} — {describe}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, app.reload_identities)
    if app.metrics_port is not None:
        print(f"fencepost metrics on http://{settings.metrics_listen.rsplit(':', 1)[0]}:{app.metrics_port}/metrics",
              flush=True)
    await stop.wait()
    print("fencepost draining…", flush=True)
    await app.stop()
    print("fencepost stopped", flush=True)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not settings.listen_is_loopback() and not settings.auth_configured() and not args.insecure:
        print(
            f"fencepost: refusing to listen on {settings.listen} without authentication; "
            "configure authentication or pass --insecure",
            file=sys.stderr,
        )
        return 2
    if settings.uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            print("--uvloop given but uvloop is not installed; using asyncio", file=sys.stderr)
    return asyncio.run(serve(settings, create_table=args.create_table))


def _hash_token_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hash-token", help="hash a bearer token for the tokens file")
    p.add_argument("--tenant", required=True)
    p.add_argument("--role", choices=("service", "operator"), default="service")
    p.add_argument("--name", default="token")
    p.add_argument("--generate", action="store_true", help="generate a new random token (printed once)")
    p.set_defaults(func=_cmd_hash_token)


def _cmd_hash_token(args: argparse.Namespace) -> int:
    import json
    import secrets

    from .security import hash_token

    if args.generate:
        token = secrets.token_urlsafe(32)
        print(f"token (give it to the caller; it is not stored): {token}", file=sys.stderr)
    else:
        token = sys.stdin.readline().strip()
        if not token:
            print("fencepost hash-token: read no token on stdin", file=sys.stderr)
            return 2
    entry = {"name": args.name, "sha256": hash_token(token), "tenant": args.tenant, "role": args.role}
    print(json.dumps(entry))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fencepost", description="durable state for agent runtimes")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _hash_token_parser(sub)
    cli_dynamodb.register(sub)
    register_client_commands(sub)  # kv / ledger / journal / memory over gRPC
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "text") == "json":
        from .observability import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=getattr(args, "log_level", "WARNING").upper(), handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
