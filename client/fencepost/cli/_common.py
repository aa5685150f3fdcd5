"""What every client subcommand shares: connection flags, output, exit codes,
the progress indicator, and the runner that turns an error into its code."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from google.protobuf import json_format
from google.protobuf.message import Message

from .. import errors
from .._env import (
    DEFAULT_ENDPOINT,
    ENV_ENDPOINT,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TLS_SERVER_NAME,
    ENV_TOKEN,
    ConnectionConfigError,
    resolve_target,
    resolve_tls,
    resolve_token,
)
from ..client import AsyncClient
from .args import Parser, positive_seconds


class Exit:
    """Exit codes of the client subcommands (documented in docs/cli.md)."""

    OK = 0
    ERROR = 1  # anything not listed below (INTERNAL, UNKNOWN, a local I/O error)
    USAGE = 2  # bad flags or arguments (argparse's own code; also checked before any call)
    NOT_FOUND = 3  # a miss: absent key, no such session / entry / journal, nothing to claim
    NOT_APPLIED = 4  # a conditional write that did not apply: CAS compare failed, pin refused
    PRECONDITION = 5  # FAILED_PRECONDITION / ABORTED: lease held or fenced, seq mismatch, inbox not empty
    INVALID = 6  # INVALID_ARGUMENT / RESOURCE_EXHAUSTED: the server refused the request's content
    DENIED = 7  # UNAUTHENTICATED / PERMISSION_DENIED
    UNAVAILABLE = 8  # UNAVAILABLE / DEADLINE_EXCEEDED: bad endpoint, server down, TLS handshake failed
    INTERRUPTED = 130  # Ctrl-C


_BY_CODE = {
    "NOT_FOUND": Exit.NOT_FOUND,
    "FAILED_PRECONDITION": Exit.PRECONDITION,
    "ABORTED": Exit.PRECONDITION,
    "INVALID_ARGUMENT": Exit.INVALID,
    "RESOURCE_EXHAUSTED": Exit.INVALID,
    "OUT_OF_RANGE": Exit.INVALID,
    "UNAUTHENTICATED": Exit.DENIED,
    "PERMISSION_DENIED": Exit.DENIED,
    "UNAVAILABLE": Exit.UNAVAILABLE,
    "DEADLINE_EXCEEDED": Exit.UNAVAILABLE,
}


def exit_code_for(err: errors.FencepostError) -> int:
    """The exit code of a failed call, by its status code (each reason of one
    code shares it; the reason itself is printed and in `--json` output)."""
    return _BY_CODE.get(err.code, Exit.ERROR)


class UsageError(Exception):
    """A bad argument found after parsing (exit 2)."""


class Miss(Exception):
    """A read that found nothing (exit 3); the message names what is missing."""


@dataclass
class Out:
    """Where a command writes: `emit` one JSON document, `line` one JSON line,
    `table` rows; `--json` picks the form."""

    json: bool
    stdout: IO[str]
    stderr: IO[str]
    progress_enabled: bool = True

    def emit(self, doc: Any, text: str | None = None) -> None:
        """One result: a JSON document, or `text` when given (else the doc as key: value lines)."""
        if self.json:
            self.stdout.write(json.dumps(doc, ensure_ascii=False, sort_keys=False) + "\n")
        elif text is not None:
            self.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        else:
            width = max((len(k) for k in doc), default=0)
            for key, value in doc.items():
                self.stdout.write(f"{key:<{width}}  {_cell(value)}\n")

    def line(self, doc: Any) -> None:
        """One item of a stream in `--json` mode (JSON lines)."""
        self.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        rows = [[_cell(c) for c in row] for row in rows]
        widths = [len(h) for h in headers]
        for row in rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        self.stdout.write(fmt.format(*headers).rstrip() + "\n")
        for row in rows:
            self.stdout.write(fmt.format(*row).rstrip() + "\n")

    def raw(self, data: bytes) -> None:
        """Bytes exactly as they are, to stdout's byte stream. Only on a
        terminal is a newline added after a value that lacks one (so the
        prompt does not run on); pipes and files get the bytes alone."""
        self.stdout.flush()
        buffer = getattr(self.stdout, "buffer", None)
        if buffer is None:  # a text-only stream (in-process callers): lossless for any bytes
            self.stdout.write(data.decode("utf-8", "surrogateescape"))
        else:
            buffer.write(data)
            buffer.flush()
        if data and not data.endswith(b"\n") and _isatty(self.stdout):
            self.stdout.write("\n")

    def note(self, message: str) -> None:
        self.stderr.write(message + "\n")

    def progress(self, label: str, total: int | None = None, unit: str = "") -> Progress:
        tty = self.progress_enabled and _isatty(self.stderr)
        return Progress(self.stderr if tty else None, label, total, unit)


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """A one-line counter on stderr, redrawn at most ten times a second; a
    no-op when stderr is not a terminal (so pipes and logs stay clean)."""

    def __init__(self, stream: IO[str] | None, label: str, total: int | None, unit: str) -> None:
        self.stream, self.label, self.total, self.unit = stream, label, total, unit
        self.done = 0
        self._last = 0.0
        self._drawn = False

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.stream is None:
            return
        now = time.monotonic()
        if now - self._last >= 0.1 or not self._drawn:
            self._last = now
            self._draw()

    def _draw(self) -> None:
        assert self.stream is not None
        if self.total:
            pct = min(100, self.done * 100 // self.total)
            text = f"{self.label}: {self.done}/{self.total}{self.unit} ({pct}%)"
        else:
            text = f"{self.label}: {self.done}{self.unit}"
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()
        self._drawn = True

    def finish(self) -> None:
        if self.stream is not None and self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def clip(text: str, width: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def blob(data: bytes, name: str = "value") -> dict[str, Any]:
    """Bytes in JSON: `<name>` is the UTF-8 text (null when not UTF-8) and
    `<name>_b64` is always the exact bytes, base64."""
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {name: text, f"{name}_b64": base64.b64encode(data).decode("ascii")}


def show_bytes(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


def stamp(seconds: float) -> str | None:
    if not seconds:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def message_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def read_input(value: str | None, file: Path | None, stdin: IO[bytes] | None = None) -> bytes:
    """A payload argument: the literal VALUE, `-` for stdin, or `--file PATH`
    (`--file -` reads stdin too; `--file ./-` names a file called `-`)."""
    if file is not None:
        if value is not None:
            raise UsageError("give VALUE or --file, not both")
        if str(file) == "-":
            return (stdin or sys.stdin.buffer).read()
        return file.read_bytes()
    if value is None:
        raise UsageError("a VALUE (or '-' for stdin, or --file PATH) is required")
    if value == "-":
        return (stdin or sys.stdin.buffer).read()
    return value.encode("utf-8")


class LeafParser(Parser):
    """A subcommand's parser that takes options and positionals in any order
    (`deliver AGENT --key K PAYLOAD`), which plain argparse does not when a
    positional is optional."""

    _inner = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._inner:
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


# -- the flags every client subcommand takes -----------------------------------
def common_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--endpoint", default=None,
                   help=f"host:port of the server (env {ENV_ENDPOINT}; default {DEFAULT_ENDPOINT})")
    g.add_argument("--token", default=None, help=f"bearer token (env {ENV_TOKEN})")
    g.add_argument("--tls-ca", type=Path,
                   help=f"CA bundle (PEM) that signed the server certificate: turns on TLS (env {ENV_TLS_CA})")
    g.add_argument("--tls-cert", type=Path, help=f"client certificate (PEM), for mTLS (env {ENV_TLS_CERT})")
    g.add_argument("--tls-key", type=Path, help=f"client private key (PEM), for mTLS (env {ENV_TLS_KEY})")
    g.add_argument("--tls-server-name",
                   help=f"name to check the server certificate against (SNI override; env {ENV_TLS_SERVER_NAME})")
    g.add_argument("--timeout", type=positive_seconds, default=10.0,
                   help="per-call deadline in seconds, > 0 (default %(default)s)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true",
                   help="machine-readable output: one JSON document (JSON lines for streams); "
                        "bytes as UTF-8 text (null if not UTF-8) plus base64 in *_b64")
    o.add_argument("--no-progress", action="store_true", help="never draw the progress line on stderr")
    return p


def connect(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> AsyncClient:
    """The client for the connection flags, each falling back to its
    environment variable (the SDK's own rules, `fencepost._env`)."""
    env = os.environ if env is None else env
    tls = resolve_tls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.tls_server_name,
                      env=env)
    credentials = None
    options: list[tuple[str, Any]] = []
    try:
        if tls.enabled:
            credentials, options = tls.credentials()
        token = resolve_token(args.token, env) or ""
    except ConnectionConfigError as exc:
        raise UsageError(str(exc)) from exc
    return AsyncClient(resolve_target(args.endpoint, env), token=token,
                       credentials=credentials, timeout=args.timeout, options=options or None, env=env)


Handler = Callable[[AsyncClient, argparse.Namespace, Out], Awaitable[int | None]]


def add_command(sub: argparse._SubParsersAction, name: str, handler: Handler, help: str,
                parents: Sequence[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help, parents=list(parents))
    p.set_defaults(func=run_sync, handler=handler)
    return p


async def run(args: argparse.Namespace, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
              env: Mapping[str, str] | None = None) -> int:
    """Run one parsed client subcommand; every error becomes its exit code."""
    out = Out(json=args.json, stdout=stdout or sys.stdout, stderr=stderr or sys.stderr,
              progress_enabled=not args.no_progress)
    try:
        client = connect(args, env)
    except UsageError as exc:
        out.note(f"fencepost: {exc}")
        return Exit.USAGE
    try:
        async with client:
            return int(await args.handler(client, args, out) or Exit.OK)
    except UsageError as exc:
        out.note(f"fencepost: {exc}")
        return Exit.USAGE
    except Miss as exc:
        _error(out, "NOT_FOUND", "", str(exc), {})
        return Exit.NOT_FOUND
    except errors.FencepostError as exc:
        _error(out, exc.code, exc.reason, exc.message, exc.metadata)
        return exit_code_for(exc)
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say to anyone
        _silence_stdout()
        return Exit.ERROR
    except OSError as exc:
        out.note(f"fencepost: {exc}")
        return Exit.ERROR


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush of the
    closed pipe does not print an error of its own at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _error(out: Out, code: str, reason: str, message: str, metadata: Mapping[str, str]) -> None:
    """Errors go to stderr; with `--json` as one JSON line (stdout stays the result channel)."""
    if out.json:
        out.note(json.dumps({"error": {"code": code, "reason": reason, "message": message,
                                       "metadata": dict(metadata)}}, ensure_ascii=False))
    else:
        tag = f"{code}/{reason}" if reason else code
        extra = "".join(f" {k}={v}" for k, v in sorted(metadata.items()))
        out.note(f"fencepost: {tag}: {message}{extra}")


def run_sync(args: argparse.Namespace) -> int:
    """`args.func` for the `fencepost` console script (a fresh event loop per command)."""
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except Exception as exc:  # the last resort (a bug): one line, as `fencepost serve` prints it
        print(f"fencepost: error: unexpected {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return Exit.ERROR
