"""A finished archive is durable before the backup reports success: its bytes
are synced before the rename, and its directory after it (else a power loss
could undo the rename and leave no archive where one was reported)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fencepost_server.lifecycle import archive
from fencepost_server.storage import Item


def test_finish_syncs_the_file_then_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[str, bool]] = []  # (what the fd is, whether the archive had its name yet)
    real_fsync = os.fsync
    out = tmp_path / "store.fpbak"

    def recording_fsync(fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        synced.append((kind, out.exists()))
        real_fsync(fd)

    monkeypatch.setattr(archive.os, "fsync", recording_fsync)
    writer = archive.ArchiveWriter(out, archive.Header("sqlite", "snapshot"))
    writer.write([Item("k", b"v", "r1")])
    writer.finish(quiesced=True)
    assert synced == [("file", False), ("dir", True)]
