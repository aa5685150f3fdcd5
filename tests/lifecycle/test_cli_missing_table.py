"""`fencepost backup | restore | migrate` against a DynamoDB table that does
not exist or an endpoint that does not answer: one line naming the store and
the next step that helps (not `serve --create-table`, not "resume")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fencepost_server.cli import main
from fencepost_server.lifecycle import Exit
from fencepost_server.storage import open_backend
from tests.dynamo_support import REGION, backend_url, unique_table

pytestmark = pytest.mark.backend("dynamodb")


def _sqlite_store(tmp_path: Path) -> str:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def fill() -> None:
        storage = open_backend(url)
        try:
            await storage.put("t/kv/k", b"v")
        finally:
            await storage.close()

    asyncio.run(fill())
    return url


def _archive(tmp_path: Path) -> Path:
    out = tmp_path / "backup.arch"
    assert main(["backup", "--backend", _sqlite_store(tmp_path), "--out", str(out)]) == 0
    return out


def _says_create_it(err: str) -> None:
    assert "does not exist" in err and "--create-table" in err and "fencepost dynamodb create-table" in err
    assert "serve --create-table" not in err and "resume" not in err


def test_restore_into_a_missing_table_says_how_to_create_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = _archive(tmp_path)
    capsys.readouterr()
    assert main(["restore", "--backend", backend_url(unique_table()), "--in", str(archive)]) == Exit.FAILED
    _says_create_it(capsys.readouterr().err)


def test_migrate_into_a_missing_table_says_how_to_create_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _sqlite_store(tmp_path)
    code = main(["migrate", "--from", source, "--to", backend_url(unique_table()), "--work-dir", str(tmp_path / "w")])
    assert code == Exit.FAILED
    _says_create_it(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["backup", "migrate"])
def test_a_missing_source_table_is_named_as_the_source(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = backend_url(unique_table())
    argv = (["backup", "--backend", url, "--out", str(tmp_path / "x.arch")] if command == "backup" else
            ["migrate", "--from", url, "--to", f"sqlite://{tmp_path / 'b.db'}", "--work-dir", str(tmp_path / "w")])
    assert main(argv) == Exit.FAILED
    err = capsys.readouterr().err
    assert "does not exist" in err and url in err
    assert "create-table" not in err and "resume" not in err  # creating an empty source helps nobody


@pytest.mark.parametrize("command", ["restore", "migrate"])
def test_create_table_at_an_endpoint_that_does_not_answer_is_one_clear_line(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"dynamodb://{unique_table()}?endpoint=http://127.0.0.1:1&region={REGION}&attempts=1"
    argv = (["restore", "--backend", target, "--in", str(_archive(tmp_path))] if command == "restore" else
            ["migrate", "--from", _sqlite_store(tmp_path), "--to", target, "--work-dir", str(tmp_path / "w")])
    capsys.readouterr()
    assert main([*argv, "--create-table"]) == Exit.FAILED
    err = capsys.readouterr().err
    assert "unexpected" not in err and "cannot create" in err and "endpoint unreachable" in err
