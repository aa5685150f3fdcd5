"""A damaged archive - any byte flipped, plain or gzip-compressed - is
refused as damaged (exit 4) before anything is written: never restored,
and never reported as a backend failure (exit 1)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from fencepost_server.cli import main
from fencepost_server.lifecycle import ArchiveError, ArchiveReader, Exit
from tests.lifecycle.cli_support import fill

from .test_restore_services import cli


def _backup(tmp_path: Path, name: str, items: int = 20) -> bytes:
    source = f"sqlite://{tmp_path / 'a.db'}"
    if not (tmp_path / "a.db").exists():
        fill(source, items)
    assert main(["backup", "--backend", source, "--out", str(tmp_path / name), "--page", "7"]) == 0
    return (tmp_path / name).read_bytes()


def _same_content(damaged: bytes, original: bytes) -> bool:
    """A gzip header byte (mtime, OS) can change without changing the archive."""
    try:
        return gzip.decompress(damaged) == gzip.decompress(original)
    except (OSError, EOFError, zlib.error):
        return False


@pytest.mark.parametrize("name", ["x.arch", "x.arch.gz"])
def test_every_flipped_byte_is_refused_as_damage(tmp_path: Path, name: str) -> None:
    original = _backup(tmp_path, name)
    path = tmp_path / "damaged"
    for at in range(len(original)):
        damaged = bytearray(original)
        damaged[at] ^= 0x55
        path.write_bytes(bytes(damaged))
        if name.endswith(".gz") and _same_content(bytes(damaged), original):
            continue
        with pytest.raises(ArchiveError):
            ArchiveReader(path).verify()


def test_a_corrupt_compressed_stream_exits_4_and_writes_nothing(tmp_path: Path) -> None:
    original = _backup(tmp_path, "x.arch.gz", 300)
    damaged = bytearray(original)
    damaged[30] ^= 0x55  # inside the deflate stream: zlib refuses it
    (tmp_path / "damaged.arch.gz").write_bytes(bytes(damaged))
    target = tmp_path / "target.db"
    done = cli("restore", "--backend", f"sqlite://{target}", "--in", str(tmp_path / "damaged.arch.gz"))
    assert done.returncode == Exit.CORRUPT, done.stderr
    assert "unexpected" not in done.stderr and "damaged.arch.gz" in done.stderr
    assert not target.exists()


def test_an_archive_naming_a_key_no_store_can_hold_is_damage(tmp_path: Path) -> None:
    """JSON can spell a lone surrogate (`\\ud800`), which no stored key holds
    and UTF-8 cannot encode: such an archive is damaged (exit 4), not an
    unexpected error (exit 1)."""
    archive = tmp_path / "odd.arch"
    archive.write_text(
        '{"format":"fencepost-archive","v":2,"created":"x","source":"sqlite","consistency":"snapshot",'
        '"watermarks":[]}\n{"chunk":0,"items":[["\\ud800","",""]],"sha256":"00"}\n'
    )
    with pytest.raises(ArchiveError):
        ArchiveReader(archive).verify()
    target = tmp_path / "target.db"
    done = cli("restore", "--backend", f"sqlite://{target}", "--in", str(archive))
    assert done.returncode == Exit.CORRUPT, done.stderr
    assert "unexpected" not in done.stderr and not target.exists()
