"""The `fencepost` command: `serve` and operator subcommands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

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
    )


async def serve(settings: Settings, *, create_table: bool = False) -> int:
    from .app import App

    app = App(settings)
    if create_table:
        from .cli_dynamodb import ensure_table

        await ensure_table(app.storage)
    port = await app.start()
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
    await stop.wait()
    print("fencepost draining…", flush=True)
    await app.stop()
    print("fencepost stopped", flush=True)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings.uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            print("--uvloop given but uvloop is not installed; using asyncio", file=sys.stderr)
    return asyncio.run(serve(settings, create_table=args.create_table))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fencepost", description="durable state for agent runtimes")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    cli_dynamodb.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
