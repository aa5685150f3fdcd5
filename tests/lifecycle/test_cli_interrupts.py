"""`fencepost backup | restore | migrate` interrupted (Ctrl-C), or a restore
whose target a server wrote meanwhile: what the operator is told about the
store and the next step (docs/lifecycle.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fencepost_server.cli import main
from fencepost_server.lifecycle import Exit
from tests.lifecycle.cli_support import fill
from fencepost_server.lifecycle.progress import Progress

INTERRUPTED = 130


def _ctrl_c_after_first_page(monkeypatch: pytest.MonkeyPatch) -> None:
    def advance(self: Progress, n: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "advance", advance)


def test_an_interrupted_restore_says_the_target_is_partial_and_how_to_redo_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    archive = tmp_path / "backup.arch"
    assert main(["backup", "--backend", source, "--out", str(archive), "--page", "10"]) == 0
    target = f"sqlite://{tmp_path / 'b.db'}"
    with monkeypatch.context() as patch:
        _ctrl_c_after_first_page(patch)
        assert main(["restore", "--backend", target, "--in", str(archive)]) == INTERRUPTED
    err = capsys.readouterr().err
    assert "interrupted" in err and target in err and "delete" in err

    # run again, as an operator would: the refusal says why a target may hold something
    assert main(["restore", "--backend", target, "--in", str(archive)]) == Exit.REFUSED
    err = capsys.readouterr().err
    assert "not empty" in err and "interrupted" in err


def test_an_interrupted_migration_says_to_run_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    target = f"sqlite://{tmp_path / 'b.db'}"
    work = tmp_path / "work"
    argv = ["migrate", "--from", source, "--to", target, "--work-dir", str(work), "--page", "10"]
    with monkeypatch.context() as patch:
        _ctrl_c_after_first_page(patch)
        assert main(argv) == INTERRUPTED
    err = capsys.readouterr().err
    assert "interrupted" in err and "run the same command again" in err and str(work) in err
    assert main(argv) == 0


def test_a_backup_interrupted_says_no_archive_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    out = tmp_path / "backup.arch"
    with monkeypatch.context() as patch:
        _ctrl_c_after_first_page(patch)
        assert main(["backup", "--backend", source, "--out", str(out), "--page", "10"]) == INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
    assert not list(tmp_path.glob("backup.arch*"))


def test_a_restore_whose_target_changed_meanwhile_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server left running on the target writes while the restore does: the
    comparison fails (exit 5), and the message says why that happens and what next."""
    import sqlite3

    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    archive = tmp_path / "backup.arch"
    assert main(["backup", "--backend", source, "--out", str(archive), "--page", "10"]) == 0
    target = tmp_path / "b.db"
    advance = Progress.advance

    def a_server_writes(self: Progress, n: int) -> None:
        advance(self, n)
        if self.what == "restore":
            with sqlite3.connect(str(target)) as conn:
                conn.execute("INSERT OR IGNORE INTO kv (key, value, version) VALUES (?, ?, ?)",
                             (b"t/kv/written-by-a-server", b"x", "v1"))

    monkeypatch.setattr(Progress, "advance", a_server_writes)
    assert main(["restore", "--backend", f"sqlite://{target}", "--in", str(archive)]) == Exit.DIFFERENT
    err = capsys.readouterr().err
    assert "VERIFICATION FAILED" in err and "server" in err and "delete" in err


@pytest.mark.parametrize("failure", ["backend", "archive"])
def test_a_restore_that_fails_mid_write_says_the_target_is_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], failure: str
) -> None:
    """The target fails part-way (a throttled or unreachable table), or the
    archive can no longer be read (its disk, a file replaced meanwhile):
    items were written, so the message says the target holds part of the
    archive and how to start over (a rerun is refused: not empty)."""
    from fencepost_server.storage import BackendUnavailable
    from fencepost_server.storage.sqlite import SqliteStorage

    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    archive = tmp_path / "backup.arch"
    assert main(["backup", "--backend", source, "--out", str(archive), "--page", "10"]) == 0
    real_import, calls = SqliteStorage.import_items, []

    async def fails_after_the_first_chunk(self: SqliteStorage, items: list) -> None:  # type: ignore[type-arg]
        calls.append(len(items))
        if len(calls) == 2:
            if failure == "backend":
                raise BackendUnavailable("throttled")
            archive.write_bytes(archive.read_bytes()[:200])  # the file changes under the restore
        await real_import(self, items)

    monkeypatch.setattr(SqliteStorage, "import_items", fails_after_the_first_chunk)
    target = f"sqlite://{tmp_path / 'b.db'}"
    code = main(["restore", "--backend", target, "--in", str(archive)])
    assert code == (Exit.FAILED if failure == "backend" else Exit.CORRUPT)
    err = capsys.readouterr().err
    assert "part of the archive" in err and "delete" in err and target in err, err

    monkeypatch.setattr(SqliteStorage, "import_items", real_import)
    if failure == "backend":  # the rerun the message warns about
        assert main(["restore", "--backend", target, "--in", str(archive)]) == Exit.REFUSED
