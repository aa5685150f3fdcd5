"""What `fencepost migrate` tells an operator when it refuses or finds
differences: what happened, and the next step (docs/lifecycle.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fencepost_server.cli import main
from fencepost_server.lifecycle import Exit
from tests.lifecycle.cli_support import fill


def test_a_failed_verification_says_what_to_do_and_names_the_work_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    target = f"sqlite://{tmp_path / 'b.db'}"
    work = tmp_path / "work"
    argv = ["migrate", "--from", source, "--to", target, "--work-dir", str(work)]
    assert main(argv) == 0
    fill(source, 40)  # a server still writing to the source after the copy
    capsys.readouterr()
    assert main(argv) == Exit.DIFFERENT
    err = capsys.readouterr().err
    assert "VERIFICATION FAILED" in err
    assert "stop" in err and "empty the target" in err and f"delete {work}" in err


def test_a_checkpoint_of_another_migration_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    work = tmp_path / "work"
    assert main(["migrate", "--from", source, "--to", f"sqlite://{tmp_path / 'b.db'}", "--work-dir", str(work)]) == 0
    capsys.readouterr()
    code = main(["migrate", "--from", source, "--to", f"sqlite://{tmp_path / 'c.db'}", "--work-dir", str(work)])
    assert code == Exit.REFUSED
    assert "--work-dir" in capsys.readouterr().err


def test_a_non_empty_migration_target_mentions_where_a_checkpoint_is_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resumed from another directory, the default work directory (relative)
    is not found, and the refusal is the operator's only clue."""
    source = f"sqlite://{tmp_path / 'a.db'}"
    target = f"sqlite://{tmp_path / 'b.db'}"
    fill(source)
    fill(target, 1)
    monkeypatch.chdir(tmp_path)
    assert main(["migrate", "--from", source, "--to", target]) == Exit.REFUSED
    err = capsys.readouterr().err
    assert "not empty" in err and ".fencepost-migrate" in err and "--work-dir" in err


def test_a_refused_run_leaves_no_empty_work_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each refused attempt (a non-empty target here) used to leave an empty
    .fencepost-migrate/<hash> behind, beside the one that matters."""
    source = f"sqlite://{tmp_path / 'a.db'}"
    target = f"sqlite://{tmp_path / 'b.db'}"
    fill(source)
    fill(target, 1)
    monkeypatch.chdir(tmp_path)
    assert main(["migrate", "--from", source, "--to", target]) == Exit.REFUSED
    assert not list((tmp_path / ".fencepost-migrate").iterdir())


def test_a_verified_migration_or_restore_names_the_next_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    target = f"sqlite://{tmp_path / 'b.db'}"
    assert main(["migrate", "--from", source, "--to", target, "--work-dir", str(tmp_path / "work")]) == 0
    assert f"fencepost serve --backend '{target}'" in capsys.readouterr().out
    archive = tmp_path / "backup.arch"
    assert main(["backup", "--backend", source, "--out", str(archive)]) == 0
    restored = f"sqlite://{tmp_path / 'c.db'}"
    capsys.readouterr()
    assert main(["restore", "--backend", restored, "--in", str(archive)]) == 0
    assert f"fencepost serve --backend '{restored}'" in capsys.readouterr().out


def test_a_rerun_after_a_failed_verification_says_the_copy_was_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "copied 0 items (resumed after N items) in 0.0s (0 items/s)"."""
    import sqlite3

    from fencepost_server.lifecycle.progress import Progress

    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source)
    argv = ["migrate", "--from", source, "--to", f"sqlite://{tmp_path / 'b.db'}", "--work-dir", str(tmp_path / "w")]
    advance = Progress.advance

    def a_server_writes_to_the_source(self: Progress, n: int) -> None:
        advance(self, n)
        if self.what == "migrate":
            with sqlite3.connect(str(tmp_path / "a.db")) as conn:
                conn.execute("INSERT OR IGNORE INTO kv (key, value, version) VALUES (?, ?, ?)",
                             (b"t/kv/written-by-a-server", b"x", "v1"))

    with monkeypatch.context() as patch:
        patch.setattr(Progress, "advance", a_server_writes_to_the_source)
        assert main(argv) == Exit.DIFFERENT
    capsys.readouterr()
    assert main(argv) == Exit.DIFFERENT
    out = capsys.readouterr().out
    assert "already copied (30 items)" in out and "0 items/s" not in out
