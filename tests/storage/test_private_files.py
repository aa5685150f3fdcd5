"""Files holding stored data (every tenant's items and the deployment's
page-token secret) are readable by their owner only when fencepost creates
them: the state root, the SQLite file and its WAL, a snapshot, a backup
archive, a migration's work directory. An existing file keeps its mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fencepost_server.config import Settings
from fencepost_server.lifecycle import backup, migrate
from fencepost_server.startup import open_storage
from fencepost_server.storage.sqlite import SqliteStorage


def _private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


@pytest.fixture(autouse=True)
def _usual_umask():  # type: ignore[no-untyped-def]
    old = os.umask(0o022)  # what most servers run with: files 0644 unless made otherwise
    yield
    os.umask(old)


async def _put(storage: object, key: str) -> None:
    await storage.put(key, b"secret value")  # type: ignore[attr-defined]


async def test_the_default_state_root_and_its_database_are_private(tmp_path: Path) -> None:
    root = tmp_path / "state"
    storage = open_storage(Settings(state_root=root))
    try:
        await _put(storage, "k")
        assert _private(root)
        for name in ("fencepost.db", "fencepost.db-wal", "fencepost.db-shm"):
            assert _private(root / name), name
    finally:
        await storage.close()


async def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    db.touch()
    db.chmod(0o640)  # e.g. readable by a backup agent's group: the operator's choice
    storage = SqliteStorage(db)
    await storage.close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o640


async def test_a_snapshot_a_backup_and_a_migration_are_private(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    storage = SqliteStorage(db)
    try:
        await _put(storage, "k")
        await storage.snapshot(tmp_path / "snap.db")
    finally:
        await storage.close()
    assert _private(tmp_path / "snap.db")
    for out in (tmp_path / "b.arch", tmp_path / "b.arch.gz"):
        await backup(f"sqlite://{db}", out)
        assert _private(out), out.name
    work = tmp_path / "work"
    await migrate(f"sqlite://{db}", f"sqlite://{tmp_path / 'dst.db'}", work_dir=work)
    assert _private(work) and _private(tmp_path / "dst.db")


@pytest.mark.parametrize("name", ["b.arch", "b.arch.gz"])
async def test_an_existing_archive_keeps_its_mode_when_backed_up_over(tmp_path: Path, name: str) -> None:
    """The archive is written beside `--out` and renamed over it: the file
    the operator left there (e.g. group-readable for a backup agent) keeps
    its mode, as every existing file does."""
    db = tmp_path / "src.db"
    storage = SqliteStorage(db)
    try:
        await _put(storage, "k")
    finally:
        await storage.close()
    out = tmp_path / name
    out.touch()
    out.chmod(0o640)
    await backup(f"sqlite://{db}", out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert out.stat().st_size > 0
