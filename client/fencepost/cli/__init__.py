"""The operator CLI over the client SDK: `fencepost kv|ledger|journal|memory|admin ...`.

It talks gRPC only (never server internals), so a client-only install has it
as `fencepostctl` / `python -m fencepost`; the server's `fencepost` command
registers the same subcommands beside `serve`. Exit codes: see `Exit` and
docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import IO

from . import admin, journal, kv, ledger, memory
from .args import Parser, add_version_flag
from ._common import DEFAULT_ENDPOINT, ENV_ENDPOINT, ENV_TOKEN, Exit, LeafParser, common_parser, exit_code_for, run

__all__ = ["Exit", "register", "build_parser", "main", "amain", "exit_code_for",
           "DEFAULT_ENDPOINT", "ENV_ENDPOINT", "ENV_TOKEN"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the client subcommands (kv, ledger, journal, memory, admin) to a parser's subcommands."""
    parents = [common_parser()]
    for module in (kv, ledger, journal, memory, admin):
        module.register(sub, parents, LeafParser)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description="fencepost operator CLI (client side)")
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(sub)
    return parser


async def amain(argv: Sequence[str], *, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                env: Mapping[str, str] | None = None) -> int:
    """Parse and run one command on the running event loop (what tests call).
    A usage error returns 2 instead of exiting."""
    try:
        args = build_parser("fencepost").parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return await run(args, stdout=stdout, stderr=stderr, env=env)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(None if argv is None else list(argv))
    return int(args.func(args) or Exit.OK)


if __name__ == "__main__":
    sys.exit(main())
