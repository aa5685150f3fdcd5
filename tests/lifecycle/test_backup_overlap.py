"""Two backups of one archive file at once (a schedule whose runs overlap,
an operator starting one by hand while the nightly one runs): both would
write the same `FILE.partial` and `FILE.snapshot.db`, and the one that
reported success left a mix of the two archives in place, found damaged
only when restored. The second one is refused; the first completes."""

from __future__ import annotations

import asyncio
import io
import threading
from pathlib import Path
from typing import Any

import pytest

from fencepost_server.lifecycle import ArchiveReader, BackupReport, ArchiveWriter, Exit, LifecycleError, backup
from fencepost_server.storage import Item, open_backend


async def _fill(url: str, n: int) -> None:
    storage = open_backend(url)
    try:
        for i in range(n):
            await storage.put(f"t/kv/item-{i:04d}", bytes([i % 256]) * 40)
    finally:
        await storage.close()


async def test_a_second_backup_of_the_same_file_is_refused_while_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = f"sqlite://{tmp_path / 'live.db'}"
    await _fill(source, 200)
    out = tmp_path / "latest.arch"

    paused, resume = threading.Event(), threading.Event()
    real_write = ArchiveWriter.write

    def write(self: ArchiveWriter, items: list[Item]) -> None:
        real_write(self, items)
        if threading.current_thread().name == "first" and self.chunks == 1:
            paused.set()  # the first backup is mid-write
            resume.wait(60)

    monkeypatch.setattr(ArchiveWriter, "write", write)
    first: dict[str, Any] = {}

    def run_first() -> None:
        try:
            first["report"] = asyncio.run(backup(source, out, page=10, stream=io.StringIO()))
        except BaseException as exc:  # noqa: BLE001 - reported below
            first["error"] = exc

    thread = threading.Thread(target=run_first, name="first")
    thread.start()
    try:
        assert await asyncio.to_thread(paused.wait, 60)
        storage = open_backend(source)  # the store moves on meanwhile (a server serving it)
        try:
            for i in range(0, 200, 2):
                await storage.delete(f"t/kv/item-{i:04d}")
        finally:
            await storage.close()
        try:
            second: Any = await backup(source, out, page=10, stream=io.StringIO())
        except LifecycleError as exc:
            second = exc
    finally:
        resume.set()
        await asyncio.to_thread(thread.join, 60)

    # every run that reported success left in place a whole archive of what it reported
    reported = [r.items for r in (first.get("report"), second) if isinstance(r, BackupReport)]
    held = ArchiveReader(out).verify().items
    assert reported and all(n == held for n in reported), (reported, held)
    assert isinstance(second, LifecycleError) and second.code == Exit.REFUSED, second
    assert "another backup" in str(second) and str(out) in str(second)
    assert "error" not in first, first.get("error")
    assert held == 200
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.snapshot.db*"))


async def test_a_partial_left_by_a_killed_backup_is_written_over(tmp_path: Path) -> None:
    source = f"sqlite://{tmp_path / 'live.db'}"
    await _fill(source, 30)
    out = tmp_path / "latest.arch"
    (tmp_path / "latest.arch.partial").write_bytes(b"what a backup killed with kill -9 had written")
    assert (await backup(source, out, page=10, stream=io.StringIO())).items == 30
    assert ArchiveReader(out).verify().items == 30
    assert not list(tmp_path.glob("*.partial"))


async def test_a_backup_that_fails_before_writing_leaves_no_partial(tmp_path: Path) -> None:
    source = f"sqlite://{tmp_path / 'live.db'}"
    await _fill(source, 3)
    (tmp_path / "live.db").write_bytes(b"no longer a database")
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"live.db{suffix}").unlink(missing_ok=True)
    with pytest.raises(LifecycleError):
        await backup(source, tmp_path / "latest.arch", stream=io.StringIO())
    assert not list(tmp_path.glob("latest.arch*"))


@pytest.mark.parametrize("suffix", ["arch", "arch.gz"])
async def test_a_restore_reads_the_archive_it_verified_while_a_new_one_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    """The nightly backup renames a new archive over the file a restore is
    reading. The restore checked the old one's checksums (and, into
    DynamoDB, its item sizes), then read the file again by name to write
    it: it wrote the new archive, reported the old one's item count, header
    and watermarks, and compared the store with the new one."""
    from fencepost_server.lifecycle import restore
    from fencepost_server.storage.sqlite import SqliteStorage

    old_url, new_url = f"sqlite://{tmp_path / 'old.db'}", f"sqlite://{tmp_path / 'new.db'}"
    await _fill(old_url, 30)
    await _fill(new_url, 50)
    out = tmp_path / f"latest.{suffix}"
    await backup(old_url, out, page=10, stream=io.StringIO())
    verified = ArchiveReader(out)
    old_items = [i for chunk in verified.chunks() for i in chunk]
    real_reserve = SqliteStorage.reserve_versions

    async def next_backup_lands(self: SqliteStorage, tokens: Any) -> None:
        monkeypatch.setattr(SqliteStorage, "reserve_versions", real_reserve)
        await backup(new_url, out, page=10, stream=io.StringIO())  # renamed over the file being restored
        await real_reserve(self, tokens)

    monkeypatch.setattr(SqliteStorage, "reserve_versions", next_backup_lands)
    target = f"sqlite://{tmp_path / 'restored.db'}"
    report = await restore(target, out, stream=io.StringIO())
    assert ArchiveReader(out).verify().items == 50  # the new archive is in place
    storage = open_backend(target)
    try:
        restored = [i async for page in storage.export_items() for i in page]
    finally:
        await storage.close()
    assert report.items == len(restored) == 30 and report.verification.same
    assert restored == old_items
