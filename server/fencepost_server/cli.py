"""The `fencepost` command: `serve` and operator subcommands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from .config import Settings


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the gRPC server")
    p.add_argument("--listen", default="127.0.0.1:50051", help="host:port (default %(default)s)")
    p.add_argument("--state-root", default=".fencepost", type=Path, help="where the SQLite file lives")
    p.add_argument("--backend", default=None, help="backend URL (memory://, sqlite:///path, dynamodb://TABLE?...)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds to drain in-flight RPCs on shutdown")
    p.add_argument("--max-receive-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--uvloop", action="store_true", help="run on uvloop when installed")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --listen without authentication (never in production)")
    p.add_argument("--log-level", default="INFO")
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


async def serve(settings: Settings) -> int:
    from .app import App

    app = App(settings)
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
    return asyncio.run(serve(settings))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fencepost", description="durable state for agent runtimes")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
