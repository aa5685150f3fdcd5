"""Checked command-line values, shared by the client subcommands and `serve`.

Each checker is an argparse `type=`: it returns the parsed value or raises
`argparse.ArgumentTypeError` with what is expected, and `Parser` turns that
into one line on stderr, `fencepost: error: argument --grace: expected ...`,
exit 2. A new flag gets its check by naming one here:

    p.add_argument("--workers", type=positive_int, default=1, help="...")
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

USAGE_EXIT = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr,
    `fencepost: error: argument --flag: what is expected`, exit 2 (a
    multi-line usage block buries the line that matters; `--help` has it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog.split()[0]}: error: {message}\n")


def _number(kind: Callable[[str], Any], what: str, ok: Callable[[Any], bool]) -> Callable[[str], Any]:
    def check(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value != value or not ok(value):  # NaN is never in range
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    check.__name__ = what  # argparse names the checker in a few messages
    return check


positive_seconds = _number(float, "a number of seconds > 0", lambda v: 0 < v < float("inf"))
non_negative_seconds = _number(float, "a number of seconds >= 0", lambda v: 0 <= v < float("inf"))
positive_int = _number(int, "an integer >= 1", lambda v: v >= 1)
non_negative_int = _number(int, "an integer >= 0", lambda v: v >= 0)


def int_at_least(low: int, why: str) -> Callable[[str], int]:
    """An integer >= `low`; `why` says what the floor protects."""
    return _number(int, f"an integer >= {low} ({why})", lambda v: v >= low)


def int_between(low: int, high: int, why: str) -> Callable[[str], int]:
    """An integer in low..high; `why` says what the bounds protect."""
    return _number(int, f"an integer >= {low} and <= {high} ({why})", lambda v: low <= v <= high)


def host_port(text: str) -> str:
    """`HOST:PORT` (`[::1]:PORT` for IPv6) with PORT 1..65535, or 0 for any
    free port (the start-up line then names the one picked)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:50051), got {text!r}")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with PORT 1..65535 (or 0 for any free port), got {text!r}")
    bracketed = host.startswith("[") or host.endswith("]")
    if (":" in host or bracketed) and not (host.startswith("[") and host.endswith("]") and ":" in host):
        # brackets hold an IPv6 address only: gRPC cannot parse `[]` or `[127.0.0.1]`
        raise argparse.ArgumentTypeError(f"expected an IPv6 host in brackets ([::1]:PORT), got {text!r}")
    return text


def log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS or not isinstance(logging.getLevelName(level), int):
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def readable_file(text: str) -> Path:
    """A path to an existing, readable regular file."""
    path = Path(text)
    try:
        with path.open("rb"):
            pass
    except IsADirectoryError:
        raise argparse.ArgumentTypeError(f"expected a file, {text!r} is a directory") from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {exc.strerror or exc}") from None
    return path


def add_version_flag(parser: argparse.ArgumentParser, server: str | None = None) -> None:
    """`--version`: the package, SDK and proto versions (computed only when asked)."""

    class _Version(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
            from .._version import version_line

            print(version_line(parser.prog, server))
            parser.exit(0)

    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the server, SDK and proto versions and exit")
