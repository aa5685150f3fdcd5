"""`fencepost hash-token`: the tokens-file line for a token read from stdin;
no token there is a usage error (exit 2) that says so in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fencepost_server.security import hash_token

HASH_TOKEN = [sys.executable, "-m", "fencepost_server", "hash-token", "--tenant", "billing"]


def test_a_token_on_stdin_gives_its_line() -> None:
    res = subprocess.run(HASH_TOKEN, input="s3cret\n", capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"name": "token", "sha256": hash_token("s3cret"), "tenant": "billing",
                                      "role": "service"}


@pytest.mark.parametrize("stdin", [b"", b"\n", b"   \n\n", None], ids=["empty", "blank-line", "spaces", "closed"])
def test_no_token_on_stdin_is_a_usage_error(stdin: bytes | None) -> None:
    """Empty stdin, a blank line, or no stdin at all (fd 0 closed: a CI
    step, a cron job) is one line naming the problem and the way out, exit 2
    (a closed stdin was "unexpected AttributeError", exit 1)."""
    if stdin is None:
        res = subprocess.run(["sh", "-c", '"$@" 0<&-', "sh", *HASH_TOKEN], capture_output=True, timeout=60)
    else:
        res = subprocess.run(HASH_TOKEN, input=stdin, capture_output=True, timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stdout == b""
    assert res.stderr.decode() == ("fencepost: error: hash-token: no token on stdin "
                                   "(pipe the token in, or pass --generate for a new one)\n")


def test_a_token_that_is_not_text_is_a_usage_error() -> None:
    res = subprocess.run(HASH_TOKEN, input=b"\xff\xfe\n", capture_output=True, timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.decode() == "fencepost: error: hash-token: the token on stdin is not UTF-8 text\n"


def test_a_tenant_that_is_not_text_is_a_usage_error() -> None:
    """A tenant argument of bytes that are not UTF-8 (Python carries them as
    lone surrogates) would write a line the server refuses to load."""
    res = subprocess.run([*HASH_TOKEN[:-1], b"bill\xffing"], input=b"s3cret\n", capture_output=True, timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stdout == b""
    assert res.stderr.decode() == "fencepost: error: hash-token: --tenant is not UTF-8 text\n"
