"""Likely slips in the arguments of `fencepost backup | restore`: a URL with
two slashes, the state directory for the file, a file that is no archive."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from fencepost_server.cli import main
from fencepost_server.lifecycle import Exit
from tests.lifecycle.cli_support import fill


def test_a_sqlite_url_with_two_slashes_hints_at_three(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "a.db"
    fill(f"sqlite://{db}")
    relative = str(db).lstrip("/")  # sqlite://tmp/... : the path is relative
    code = main(["backup", "--backend", f"sqlite://{relative}", "--out", str(tmp_path / "x.arch")])
    assert code == Exit.USAGE
    assert f"sqlite:///{relative}" in capsys.readouterr().err


def test_a_directory_as_the_sqlite_store_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The state root instead of the file in it: a likely slip."""
    state = tmp_path / "state"
    fill(f"sqlite://{state / 'fencepost.db'}")
    code = main(["backup", "--backend", f"sqlite://{state}", "--out", str(tmp_path / "x.arch")])
    assert code == Exit.USAGE
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"hello\n", b"SQLite format 3\x00\xa0\xff"])
def test_a_file_that_is_no_archive_is_named_as_such(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "backup.arch"
    archive.write_bytes(content)
    assert main(["restore", "--backend", f"sqlite://{tmp_path / 'b.db'}", "--in", str(archive)]) == Exit.CORRUPT
    assert "not a fencepost archive" in capsys.readouterr().err


def test_a_truncated_gzip_archive_says_truncated_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    fill(source, 300)
    archive = tmp_path / "backup.arch.gz"
    assert main(["backup", "--backend", source, "--out", str(archive)]) == 0
    data = archive.read_bytes()
    cut = tmp_path / "cut.arch.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(EOFError):
        gzip.decompress(cut.read_bytes())
    capsys.readouterr()
    assert main(["restore", "--backend", f"sqlite://{tmp_path / 'b.db'}", "--in", str(cut)]) == Exit.CORRUPT
    err = capsys.readouterr().err
    assert "truncated" in err and err.count(str(cut)) == 1


def test_restore_says_what_archive_it_restored_and_warns_when_its_source_was_not_quiesced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fencepost_server.lifecycle import ArchiveWriter, Header
    from fencepost_server.storage import Item

    archive = tmp_path / "logical.arch"
    writer = ArchiveWriter(archive, Header("dynamodb", "logical", created="2026-01-02T03:04:05+00:00"))
    writer.write([Item("t/kv/a", b"1", "v1"), Item("t/kv/b", b"2", "v2")])
    writer.finish(quiesced=False)
    assert main(["restore", "--backend", f"sqlite://{tmp_path / 'b.db'}", "--in", str(archive)]) == 0
    out, err = capsys.readouterr()
    assert "dynamodb" in out and "2026-01-02T03:04:05+00:00" in out
    assert "not quiesced" in err or "changed while" in err


def test_a_v1_snapshot_archive_restores_without_a_mixed_points_in_time_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A v1 archive's `quiesced` flag is covered by no hash, so it reads as
    False; but its header (hashed in v1 too) says it was a point-in-time
    snapshot, which cannot hold two points in time: the restore warned that
    it might."""
    import hashlib
    import json

    from fencepost_server.lifecycle import ArchiveWriter, Header
    from fencepost_server.storage import Item

    archive = tmp_path / "v1.arch"
    writer = ArchiveWriter(archive, Header("sqlite", "snapshot", v=1))
    writer.write([Item("t/kv/a", b"1", "v1"), Item("t/kv/b", b"2", "v2")])
    writer.finish(quiesced=True)
    lines = archive.read_bytes().splitlines(keepends=True)
    digest = hashlib.sha256(lines[0])  # v1: the header line and the chunk hashes only
    for line in lines[1:-1]:
        digest.update(json.loads(line)["sha256"].encode())
    trailer = json.loads(lines[-1])
    trailer["sha256"] = digest.hexdigest()
    lines[-1] = (json.dumps(trailer, separators=(",", ":")) + "\n").encode()
    archive.write_bytes(b"".join(lines))

    assert main(["restore", "--backend", f"sqlite://{tmp_path / 'b.db'}", "--in", str(archive)]) == 0
    out, err = capsys.readouterr()
    assert "a snapshot archive of a sqlite store" in out
    assert "quiesced" not in err and "two points in time" not in err, err


@pytest.mark.parametrize("command", ["backup", "restore", "migrate --from", "migrate --to"])
def test_a_sqlite_file_of_another_application_is_named_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A path slip naming another program's SQLite database: backing it up
    reported "0 items" (exit 0), and restoring or migrating into it wrote
    fencepost's tables into that database, which is not empty, beside its own."""
    import sqlite3

    other = tmp_path / "other-app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('alice')")
    conn.close()
    before = other.read_bytes()
    ours = tmp_path / "fencepost.db"
    fill(f"sqlite://{ours}")
    archive = tmp_path / "x.arch"
    assert main(["backup", "--backend", f"sqlite://{ours}", "--out", str(archive)]) == 0
    capsys.readouterr()
    argv = {
        "backup": ["backup", "--backend", f"sqlite://{other}", "--out", str(tmp_path / "y.arch")],
        "restore": ["restore", "--backend", f"sqlite://{other}", "--in", str(archive)],
        "migrate --from": ["migrate", "--from", f"sqlite://{other}", "--to", f"sqlite://{tmp_path / 'new.db'}",
                           "--work-dir", str(tmp_path / "w")],
        "migrate --to": ["migrate", "--from", f"sqlite://{ours}", "--to", f"sqlite://{other}",
                         "--work-dir", str(tmp_path / "w")],
    }[command]
    assert main(argv) == Exit.USAGE
    err = capsys.readouterr().err
    assert str(other) in err and "not a fencepost store" in err and "users" in err, err
    assert other.read_bytes() == before
    assert not (tmp_path / "y.arch").exists() and not (tmp_path / "new.db").exists()
