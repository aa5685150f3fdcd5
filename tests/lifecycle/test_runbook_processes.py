"""The runbook (docs/lifecycle.md) end to end with nothing but processes: a
`fencepost serve` on SQLite written through the operator CLI, stopped
(SIGTERM), migrated into a DynamoDB table, served there; the CLI reads the
same bytes and versions, and a compare-and-swap on a version read before
the move applies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.polyglot.serving import serve

from .test_restore_services import cli, dynamo_url


def ctl(endpoint: str, *argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "fencepost", *argv, "--endpoint", endpoint], input=stdin,
                          capture_output=True, timeout=60, env={**os.environ, "FENCEPOST_TOKEN": ""})


def _reads(endpoint: str, sid: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in ("bin", "text"):
        got = ctl(endpoint, "kv", "get", key, "--json")
        assert got.returncode == 0, got.stderr
        out[key] = json.loads(got.stdout)
    log = ctl(endpoint, "ledger", "log", sid, "--json")
    assert log.returncode == 0, log.stderr
    out["log"] = [json.loads(line) for line in log.stdout.splitlines()]
    inbox = ctl(endpoint, "ledger", "inbox", sid, "--json")
    out["inbox"] = [json.loads(line) for line in inbox.stdout.splitlines()]
    journal = ctl(endpoint, "journal", "read", "agent", "--json")
    assert journal.returncode == 0, journal.stderr
    out["journal"] = [json.loads(line) for line in journal.stdout.splitlines()]
    return out


@pytest.mark.backend("dynamodb")
async def test_the_runbook_with_processes_only(tmp_path: Path) -> None:
    db = f"sqlite://{tmp_path / 'fencepost.db'}"
    blob = bytes(range(256)) * 64
    with serve(db) as endpoint:
        put = ctl(endpoint, "kv", "put", "bin", "-", stdin=blob)
        assert put.returncode == 0, put.stderr
        assert ctl(endpoint, "kv", "put", "text", "héllo").returncode == 0
        delivered = ctl(endpoint, "ledger", "deliver", "agent", "--key", "chan", "an event", "--dedupe-key", "d1")
        assert delivered.returncode == 0, delivered.stderr
        shown = ctl(endpoint, "ledger", "show", "--agent", "agent", "--key", "chan", "--json")
        sid = json.loads(shown.stdout)["session_id"]
        appended = ctl(endpoint, "journal", "append", "agent", "--session", "s", "--channel", "c", "--title", "t")
        assert appended.returncode == 0, appended.stderr
        before = _reads(endpoint, sid)
    # the server drained and stopped (SIGTERM): migrate
    table = await dynamo_url()
    done = cli("migrate", "--from", db, "--to", table, "--work-dir", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    with serve(table) as endpoint:
        assert _reads(endpoint, sid) == before
        got = ctl(endpoint, "kv", "get", "bin")
        assert got.stdout == blob
        version = before["bin"]["version"]  # type: ignore[index]
        cas = ctl(endpoint, "kv", "cas", "bin", "after", "--expect", version)
        assert cas.returncode == 0, cas.stderr
        again = ctl(endpoint, "kv", "cas", "bin", "twice", "--expect", version)
        assert again.returncode == 4  # not applied: the version moved on
        dup = ctl(endpoint, "ledger", "deliver", "agent", "--key", "chan", "an event", "--dedupe-key", "d1", "--json")
        assert dup.returncode == 0 and json.loads(dup.stdout).get("duplicate") is True, dup.stdout
