"""The runbook's commands against DynamoDB, as processes: `--create-table`
makes the table a restore or migration writes into (and is harmless when it
exists), a backup of a table says it was a logical read and whether the
table was quiesced, and a restore says which archive it restored."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.dynamo_support import backend_url, unique_table
from tests.lifecycle.cli_support import exported, fill

from .test_restore_services import cli


@pytest.mark.backend("dynamodb")
def test_create_table_then_restore_migrate_and_back_up(tmp_path: Path) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source, 50)
    expected = asyncio.run(exported(source))
    archive = tmp_path / "a.arch"
    assert cli("backup", "--backend", source, "--out", str(archive)).returncode == 0

    restored = backend_url(unique_table())  # no such table yet
    done = cli("restore", "--backend", restored, "--in", str(archive), "--create-table")
    assert done.returncode == 0, done.stderr
    assert "a snapshot archive of a sqlite store, made " in done.stdout and "identical" in done.stdout
    assert asyncio.run(exported(restored)) == expected

    migrated = backend_url(unique_table())
    argv = ["migrate", "--from", source, "--to", migrated, "--work-dir", str(tmp_path / "work"), "--create-table"]
    done = cli(*argv)
    assert done.returncode == 0, done.stderr
    assert "copied 50 items" in done.stdout and "identical" in done.stdout
    done = cli(*argv)  # the table exists now: creating it again is a no-op, and the run only verifies
    assert done.returncode == 0 and "already copied (50 items)" in done.stdout, done.stderr
    assert asyncio.run(exported(migrated)) == expected

    out = tmp_path / "table.arch.gz"
    done = cli("backup", "--backend", migrated, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "50 items" in done.stdout and "logical; source quiesced" in done.stdout
    back = f"sqlite://{tmp_path / 'back.db'}"
    done = cli("restore", "--backend", back, "--in", str(out))
    assert done.returncode == 0, done.stderr
    assert "a logical archive of a dynamodb store" in done.stdout and "warning" not in done.stderr
    assert asyncio.run(exported(back)) == expected
