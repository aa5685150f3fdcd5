"""`fencepost backup` / `restore`: the archive round-trips every item (version
tokens included) between backends; restore refuses a non-empty target and a
damaged archive before writing anything."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
from pathlib import Path

import pytest

from fencepost_server.cli import main
from fencepost_server.lifecycle import ArchiveError, ArchiveReader, Exit, backup, restore
from fencepost_server.lifecycle.progress import Progress
from fencepost_server.lifecycle.stores import count_snapshot, source
from fencepost_server.storage import Item, Storage, open_backend
from fencepost_server.storage.base import version_family
from tests.conftest import running
from tests.dynamo_support import backend_url, new_dynamo_storage

KEYS = ["a", "t/kv/é", "t/kv/x", "t/sys/ledger/s/0001", "#/req/1/t/r", "日本/kv/k"]


async def _main(*argv: str) -> int:
    """The CLI (which runs its own event loop) from an async test."""
    return await asyncio.to_thread(main, list(argv))


async def _items(storage: Storage) -> list[Item]:
    return [i async for page in storage.export_items() for i in page]


async def _fill(url: str, n: int = 250) -> list[Item]:
    storage = open_backend(url)
    try:
        for i in range(n):
            await storage.put(f"{KEYS[i % len(KEYS)]}/{i:04d}", bytes([i % 256]) * (i % 50))
        await storage.put("gone", b"x")
        await storage.delete("gone")
        return await _items(storage)
    finally:
        await storage.close()


@pytest.mark.parametrize("suffix", ["arch", "arch.gz"])
async def test_sqlite_backup_restores_into_a_fresh_file(tmp_path: Path, suffix: str) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    items = await _fill(source)
    out = tmp_path / f"backup.{suffix}"
    report = await backup(source, out, page=64)
    assert (report.items, report.consistency, report.quiesced) == (len(items), "snapshot", True)
    assert report.chunks == -(-len(items) // 64)
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.snapshot.db*"))
    reader = ArchiveReader(out)
    # versions are random: the source minted no counter, so none needs reserving
    assert reader.verify().items == len(items) and reader.header.watermarks == []

    target = f"sqlite://{tmp_path / 'b.db'}"
    restored = await restore(target, out)
    assert restored.verification.same and restored.items == len(items)
    storage = open_backend(target)
    try:
        assert await _items(storage) == items
        # a fresh random version: no restored one (nor the deleted key's) comes back
        fresh = await storage.put("new", b"")
        assert fresh not in {item.version for item in items} and version_family(fresh) is None
    finally:
        await storage.close()


@pytest.mark.backend("dynamodb")
async def test_dynamodb_backup_is_logical_and_says_it_was_quiesced(tmp_path: Path) -> None:
    table = await new_dynamo_storage()
    await table.close()
    source = backend_url(table.table)
    items = await _fill(source, 60)
    out = tmp_path / "dynamo.arch"
    report = await backup(source, out)
    assert (report.items, report.consistency, report.quiesced) == (len(items), "logical", True)
    target = f"sqlite://{tmp_path / 'from-dynamo.db'}"
    assert (await restore(target, out)).verification.same
    storage = open_backend(target)
    try:
        assert await _items(storage) == items
    finally:
        await storage.close()


async def test_restore_refuses_a_non_empty_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    await _fill(source, 20)
    out = tmp_path / "backup.arch"
    assert await _main("backup", "--backend", source, "--out", str(out)) == 0
    target = f"sqlite://{tmp_path / 'b.db'}"
    storage = open_backend(target)
    await storage.put("already/here", b"x")
    await storage.close()
    assert await _main("restore", "--backend", target, "--in", str(out)) == Exit.REFUSED
    assert "not empty" in capsys.readouterr().err
    storage = open_backend(target)
    try:
        assert [i.key for i in await _items(storage)] == ["already/here"]
    finally:
        await storage.close()


def _damage(path: Path, how: str) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    if how == "flip a byte":
        chunk = bytearray(lines[1])
        at = chunk.index(b'"items":') + 12
        chunk[at] ^= 0x01
        lines[1] = bytes(chunk)
    elif how == "drop a chunk":
        del lines[2]
    elif how == "swap chunks":
        lines[1], lines[2] = lines[2], lines[1]
    elif how == "truncate":
        lines = lines[:-1]
    elif how == "edit the header":
        header = json.loads(lines[0])
        header["watermarks"] = []
        lines[0] = (json.dumps(header) + "\n").encode()
    elif how == "flip quiesced":  # the trailer's flag: a logical backup claiming a quiesced source
        trailer = json.loads(lines[-1])
        trailer["quiesced"] = not trailer["quiesced"]
        lines[-1] = (json.dumps(trailer, separators=(",", ":")) + "\n").encode()
    elif how == "edit a chunk and its hash":  # re-hashed chunk: only the trailer catches it
        import hashlib

        raw = json.loads(lines[1])
        raw["items"] = raw["items"][1:]
        body = json.dumps(raw["items"], ensure_ascii=False, separators=(",", ":"))
        raw["sha256"] = hashlib.sha256(body.encode()).hexdigest()
        lines[1] = (json.dumps(raw) + "\n").encode()
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize("how", ["flip a byte", "drop a chunk", "swap chunks", "truncate", "edit the header",
                                 "edit a chunk and its hash", "flip quiesced"])
async def test_restore_refuses_a_damaged_archive_before_writing(tmp_path: Path, how: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    await _fill(source, 40)
    out = tmp_path / "backup.arch"
    assert await _main("backup", "--backend", source, "--out", str(out), "--page", "10") == 0
    _damage(out, how)
    with pytest.raises(ArchiveError):
        ArchiveReader(out).verify()
    target = tmp_path / "b.db"
    assert await _main("restore", "--backend", f"sqlite://{target}", "--in", str(out)) == Exit.CORRUPT
    assert "fencepost:" in capsys.readouterr().err
    assert not target.exists()  # refused before the target was even opened


def test_restore_into_a_directory_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "backup.arch"
    assert main(["backup", "--backend", f"sqlite://{tmp_path / 'a.db'}", "--out", str(archive)]) == Exit.USAGE
    asyncio.run(_fill(f"sqlite://{tmp_path / 'a.db'}", 3))
    assert main(["backup", "--backend", f"sqlite://{tmp_path / 'a.db'}", "--out", str(archive)]) == 0
    (tmp_path / "dir.db").mkdir()
    code = main(["restore", "--backend", f"sqlite://{tmp_path / 'dir.db'}", "--in", str(archive)])
    assert code == Exit.USAGE  # refused before anything is opened
    err = capsys.readouterr().err
    assert "is a directory" in err and "unexpected" not in err


@pytest.mark.parametrize("argv", [
    ["backup", "--backend", "memory://", "--out", "{tmp}/x.arch"],
    ["restore", "--backend", "memory://", "--in", "{tmp}/x.arch"],
    ["migrate", "--from", "sqlite://{tmp}/a.db", "--to", "memory://", "--work-dir", "{tmp}/work"],
    ["migrate", "--from", "memory://", "--to", "sqlite://{tmp}/b.db", "--work-dir", "{tmp}/work"],
])
def test_memory_stores_are_refused(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """memory:// lives only as long as this command: backing it up archives
    nothing, and restoring or migrating into it keeps nothing (yet said "verified")."""
    asyncio.run(_fill(f"sqlite://{tmp_path / 'a.db'}", 3))
    assert main(["backup", "--backend", f"sqlite://{tmp_path / 'a.db'}", "--out", str(tmp_path / "x.arch")]) == 0
    assert main([a.format(tmp=tmp_path) for a in argv]) == Exit.USAGE
    assert "memory://" in capsys.readouterr().err
    assert not (tmp_path / "b.db").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("what", ["missing", "a directory"])
def test_restore_from_no_archive_file_is_a_usage_error(tmp_path: Path, what: str) -> None:
    """A mistyped --in is not a damaged archive (exit 4 tells the operator the backup is bad)."""
    archive = tmp_path / "backup.arch"
    if what == "a directory":
        archive.mkdir()
    target = tmp_path / "b.db"
    assert main(["restore", "--backend", f"sqlite://{target}", "--in", str(archive)]) == Exit.USAGE
    assert not target.exists()


def test_a_damaged_gzip_archive_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "x.arch.gz"
    out.write_bytes(gzip.compress(b'{"format": "fencepost-archive", "v": 1}\n')[:-6])
    with pytest.raises(ArchiveError):
        ArchiveReader(out).verify()


def test_backup_of_a_missing_sqlite_file_is_a_usage_error(tmp_path: Path) -> None:
    code = main(["backup", "--backend", f"sqlite://{tmp_path / 'nope.db'}", "--out", str(tmp_path / "x")])
    assert code == Exit.USAGE and not (tmp_path / "nope.db").exists()


@pytest.mark.parametrize("suffix", ["", "-wal"])
async def test_backup_refuses_to_write_over_its_own_store(tmp_path: Path, suffix: str) -> None:
    """`--out` naming the SQLite file being backed up (a slip of the keyboard)
    must not replace the store with its archive."""
    db = tmp_path / "live.db"
    items = await _fill(f"sqlite://{db}", 20)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code = await _main("backup", "--backend", f"sqlite://{db}", "--out", str(tmp_path / ("." + "/live.db" + suffix)))
    assert code == Exit.USAGE
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    storage = open_backend(f"sqlite://{db}")
    try:
        assert await _items(storage) == items
    finally:
        await storage.close()


@pytest.mark.parametrize("store", ["live.snapshot.db", "live.partial", "live.snapshot.db.partial"])
async def test_backup_refuses_an_out_whose_scratch_files_are_the_store(tmp_path: Path, store: str) -> None:
    """The backup writes `FILE.partial` and `FILE.snapshot.db` beside the
    archive and removes them when done: a store whose file has one of those
    names was truncated or deleted (with its -wal and -shm) by a backup that
    reported success."""
    db = tmp_path / store
    items = await _fill(f"sqlite://{db}", 20)
    code = await _main("backup", "--backend", f"sqlite://{db}", "--out", str(tmp_path / "live"))
    assert code == Exit.USAGE
    assert db.exists() and not (tmp_path / "live").exists()
    storage = open_backend(f"sqlite://{db}")
    try:
        assert await _items(storage) == items
    finally:
        await storage.close()


def test_progress_draws_a_bar_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    progress = Progress("migrate", 200, stream=stream)
    progress.advance(100)
    progress.finish()
    assert "\r[" + "#" * 15 + "." * 15 + "]" in stream.getvalue() and "200/200" not in stream.getvalue()
    plain = io.StringIO()
    Progress("backup", None, stream=plain).finish()
    assert "\r" not in plain.getvalue() and "backup: 0 items" in plain.getvalue()


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("backup", "restore", "migrate"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0
        assert "exit codes" in capsys.readouterr().out


async def test_a_renamed_archive_still_restores(tmp_path: Path) -> None:
    """Compression is read from the file's first bytes, not its name: an
    archive renamed with or without `.gz` is not "damaged"."""
    source = f"sqlite://{tmp_path / 'a.db'}"
    items = await _fill(source, 30)
    for written, renamed in (("x.arch.gz", "x.arch"), ("y.arch", "y.arch.gz")):
        assert await _main("backup", "--backend", source, "--out", str(tmp_path / written)) == 0
        (tmp_path / written).rename(tmp_path / renamed)
        target = f"sqlite://{tmp_path / (renamed + '.db')}"
        assert await _main("restore", "--backend", target, "--in", str(tmp_path / renamed)) == 0
        storage = open_backend(target)
        try:
            assert await _items(storage) == items
        finally:
            await storage.close()


async def test_the_progress_total_counts_the_markers_kept_in_rows(tmp_path: Path) -> None:
    """A request-id marker kept in its item's row (SQLite) is exported as an
    item of its own: the progress bar's total counts it too."""
    url = f"sqlite://{tmp_path / 'a.db'}"
    storage = open_backend(url)
    async with running(storage) as srv, srv.client(timeout=10) as client:
        await client.put("k", b"v", request_id="r1")
    await storage.close()
    async with source(url, tmp_path / "snapshot.db") as src:
        exported = [i async for page in src.read.export_items() for i in page]
        assert len(exported) == 2 and count_snapshot(src) == 2


@pytest.mark.parametrize("suffix", ["", ".gz"])
async def test_backup_into_an_existing_directory_is_refused_up_front(
    tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--out` naming a directory is a usage error before anything is read or
    written (it used to read the whole store, then fail at the final rename)."""
    db = tmp_path / "live.db"
    await _fill(f"sqlite://{db}", 20)
    out = tmp_path / ("backups" + suffix)
    out.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert await _main("backup", "--backend", f"sqlite://{db}", "--out", str(out)) == Exit.USAGE
    err = capsys.readouterr().err
    assert f"--out {out} is a directory" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and list(out.iterdir()) == []


def test_backup_into_a_missing_directory_is_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(_fill(f"sqlite://{tmp_path / 'a.db'}", 3))
    out = tmp_path / "no" / "such" / "x.arch"
    assert main(["backup", "--backend", f"sqlite://{tmp_path / 'a.db'}", "--out", str(out)]) == Exit.USAGE
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "no").exists()


async def test_a_v1_archive_still_restores_but_does_not_vouch_for_quiescence(tmp_path: Path) -> None:
    """Archives written before the trailer's hash covered `quiesced` (format
    v1) are still read; their flag, which nothing protects, reads as False."""
    import hashlib

    source = f"sqlite://{tmp_path / 'a.db'}"
    items = await _fill(source, 30)
    out = tmp_path / "backup.arch"
    assert await _main("backup", "--backend", source, "--out", str(out), "--page", "10") == 0
    lines = out.read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0])
    assert header["v"] == 2 and ArchiveReader(out).verify().quiesced
    header["v"] = 1
    lines[0] = (json.dumps(header, separators=(",", ":")) + "\n").encode()
    digest = hashlib.sha256(lines[0])  # v1: header line and chunk hashes only
    for line in lines[1:-1]:
        digest.update(json.loads(line)["sha256"].encode())
    trailer = json.loads(lines[-1])
    trailer["sha256"] = digest.hexdigest()
    lines[-1] = (json.dumps(trailer, separators=(",", ":")) + "\n").encode()
    out.write_bytes(b"".join(lines))
    assert ArchiveReader(out).verify().quiesced is False
    target = f"sqlite://{tmp_path / 'b.db'}"
    assert await _main("restore", "--backend", target, "--in", str(out)) == 0
    storage = open_backend(target)
    try:
        assert await _items(storage) == items
    finally:
        await storage.close()


async def test_the_migration_total_counts_a_marker_once_when_it_has_a_row_too(tmp_path: Path) -> None:
    """A marker kept in its item's row and also present as a row of its own is
    exported once (the row wins): the progress total must count it once, and
    match what is copied (it said 3/4)."""
    import sqlite3

    from fencepost_server.lifecycle import migrate

    db = tmp_path / "a.db"
    storage = open_backend(f"sqlite://{db}")
    async with running(storage) as srv, srv.client(timeout=10) as client:
        await client.put("k", b"v", request_id="r1")
        await client.put("j", b"w")
    await storage.close()
    conn = sqlite3.connect(str(db))
    with conn:
        (marker, value, version), = conn.execute(
            "SELECT marker_key, marker_value, version FROM kv WHERE marker_key IS NOT NULL").fetchall()
        conn.execute("INSERT INTO kv (key, value, version) VALUES (?, ?, ?)", (marker, value, "m" + version))
    conn.close()
    out = io.StringIO()
    report = await migrate(f"sqlite://{db}", f"sqlite://{tmp_path / 'b.db'}", work_dir=tmp_path / "work", stream=out)
    assert report.verification.same and report.copied == 3
    copy_lines = [line for line in out.getvalue().splitlines() if line.startswith("migrate:")]
    assert copy_lines[-1].startswith("migrate: 3/3 items")
    async with source(f"sqlite://{db}", tmp_path / "snapshot.db") as src:
        assert count_snapshot(src) == 3


@pytest.mark.backend("dynamodb")
async def test_restore_into_dynamodb_refuses_an_item_over_its_limit_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"sqlite://{tmp_path / 'a.db'}"
    await _fill(source, 10)
    storage = open_backend(source)
    try:
        await storage.put("t/kv/huge", b"x" * (400 * 1024))
    finally:
        await storage.close()
    out = tmp_path / "backup.arch"
    assert await _main("backup", "--backend", source, "--out", str(out)) == 0
    table = await new_dynamo_storage()
    try:
        assert await _main("restore", "--backend", backend_url(table.table), "--in", str(out)) == Exit.REFUSED
        assert "'t/kv/huge'" in capsys.readouterr().err
        assert await _items(table) == []  # refused before anything was written
    finally:
        await table.close()
