"""`fencepost backup` and `fencepost restore`.

Backup: on SQLite an online snapshot (the server may keep serving), written
out as a portable archive (archive.py); on any other backend a logical read,
followed by a second read compared range by range with what was archived:
when nothing changed in between, the trailer says `quiesced: true`.

Restore: checks the whole archive (every chunk's sha256, the order, the
trailer) before it touches the target, refuses a target that holds anything,
reserves the source's version watermarks, imports, and finally compares the
target with the archive range by range.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

try:
    import fcntl
except ImportError:  # not POSIX (Windows): a backup runs unguarded there, as before
    fcntl = None  # type: ignore[assignment]

from ..storage import EXPORT_PAGE, Item, StorageError, private
from .archive import ArchiveError, ArchiveReader, ArchiveWriter, Header
from .fit import item_sizer, refuse_unfit
from .progress import Progress, tracked
from .stores import (
    EMPTY_TARGET,
    Exit,
    LifecycleError,
    check_table,
    count_snapshot,
    ensure_table,
    is_empty,
    open_existing,
    refuse_memory,
    refuse_own_files,
    scheme_of,
    source,
)
from .verify import Comparison, RangeDigester, RangeSummary, compare, compare_ranges


@dataclass
class BackupReport:
    items: int
    chunks: int
    consistency: str
    quiesced: bool
    seconds: float


@dataclass
class RestoreReport:
    items: int
    verification: Comparison
    seconds: float
    header: Header
    #: the trailer's flag: a snapshot, or a logical read that found the source unchanged
    quiesced: bool = True


async def backup(url: str, out: Path, *, page: int = EXPORT_PAGE, stream: TextIO | None = None) -> BackupReport:
    loop = asyncio.get_running_loop()
    started = loop.time()
    snapshot_file = out.with_name(out.name + ".snapshot.db")
    refuse_memory(url)
    refuse_own_files(url, out, "--out")
    for scratch in (out.with_name(out.name + ".partial"), snapshot_file,
                    snapshot_file.with_name(snapshot_file.name + ".partial")):  # written, then removed
        refuse_own_files(url, scratch, f"--out {out}: the backup's scratch file")
    refuse_unwritable_out(out)
    with sole_backup(out):
        try:
            async with source(url, snapshot_file) as src:
                progress = Progress("backup", count_snapshot(src), stream=stream)
                header = Header(scheme_of(url), src.consistency, await src.read.version_watermarks())
                writer = ArchiveWriter(out, header)
                digester = RangeDigester(page)
                try:
                    async for items in src.read.export_items(None, page):
                        writer.write(items)
                        digester.add(items)
                        progress.advance(len(items))
                    progress.finish()
                    quiesced = src.snapshot
                    if not quiesced:  # read again: did anything change while we read?
                        again = await compare_ranges(_iterate(digester.finish()), tracked(
                            src.live.export_items(None, page), Progress("verify", writer.items, stream=stream)))
                        quiesced = again.same
                    trailer = writer.finish(quiesced=quiesced)
                except BaseException:
                    writer.abandon()
                    raise
        except StorageError as exc:
            raise LifecycleError(f"backup of {url} failed: {exc}") from exc
    return BackupReport(trailer.items, trailer.chunks, src.consistency, quiesced, loop.time() - started)


def refuse_unwritable_out(out: Path) -> None:
    """USAGE, before the store is read: the archive is renamed onto `out` only
    at the end, so a directory there (or no directory to hold it) would
    otherwise fail after the whole read, with an OS error."""
    if out.is_dir():
        raise LifecycleError(f"--out {out} is a directory: name the archive file to write in it "
                             f"(e.g. {out / 'fencepost.arch.gz'})", Exit.USAGE)
    if not out.parent.is_dir():
        raise LifecycleError(f"--out {out}: the directory {out.parent} does not exist", Exit.USAGE)


@contextlib.contextmanager
def sole_backup(out: Path) -> Iterator[None]:
    """Holds an exclusive lock on `out`'s `.partial` for the whole backup:
    two backups of one file at once (overlapping scheduled runs) would share
    it and the snapshot file, and the first to finish would rename a mix of
    both archives into place, reporting success. A second one is refused;
    a `.partial` left by a killed backup holds no lock and is written over."""
    partial = out.with_name(out.name + ".partial")
    while True:
        fd = os.open(partial, os.O_CREAT | os.O_WRONLY, private.FILE_MODE)
        if fcntl is None:
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LifecycleError(f"another backup is writing {out} right now (it holds {partial.name}): let it "
                                 "finish, or write this one to another file", Exit.REFUSED) from None
        except OSError:  # a filesystem that keeps no locks (ENOLCK): written unguarded, as before
            break
        if _same_file(partial, fd):
            break
        os.close(fd)  # the backup that held it finished (renamed or removed it) meanwhile: lock a new one
    try:
        yield
    except BaseException:
        if _same_file(partial, fd):  # failed before its archive writer existed: leave no empty `.partial`
            partial.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


async def _iterate(summaries: list[RangeSummary]) -> AsyncIterator[RangeSummary]:
    for summary in summaries:
        yield summary


async def _archive_pages(reader: ArchiveReader) -> AsyncIterator[list[Item]]:
    for items in reader.chunks():
        yield items


async def restore(
    url: str, archive: Path, *, create_table: bool = False, stream: TextIO | None = None
) -> RestoreReport:
    loop = asyncio.get_running_loop()
    started = loop.time()
    refuse_memory(url)
    if archive.is_dir():
        raise LifecycleError(f"--in {archive} is a directory: name the archive file in it", Exit.USAGE)
    if not archive.is_file():
        raise LifecycleError(f"no archive file at {archive}", Exit.USAGE)
    try:
        reader = ArchiveReader(archive)
        trailer = reader.verify()  # every checksum, before anything is written
    except ArchiveError as exc:
        raise LifecycleError(f"{archive}: {exc}", Exit.CORRUPT) from exc
    target = open_existing(url, may_create=True)
    writing = False  # from the first item on, a failure leaves a partial target: say so
    try:
        if create_table:
            await ensure_table(target, url)
        await check_table(target, url, target=True)
        if not await is_empty(target):
            raise LifecycleError(f"{url} is not empty: restore only writes into an empty store (a new file or "
                                 "table). If it holds only what an interrupted restore wrote, "
                                 f"{EMPTY_TARGET} and run the command again", Exit.REFUSED)
        sizer = item_sizer(target)
        if sizer is not None:  # an item the target cannot hold: refused before anything is written
            for items in reader.chunks():
                refuse_unfit(sizer, items, url)
        progress = Progress("restore", trailer.items, stream=stream)
        await target.reserve_versions(reader.header.watermarks)
        writing = True
        for items in reader.chunks():
            await target.import_items(items)
            progress.advance(len(items))
        progress.finish()
        verification = await compare(tracked(_archive_pages(reader), Progress("verify", trailer.items, stream=stream)),
                                     target.export_items())
    except ArchiveError as exc:  # the file changed under us since it was verified
        raise LifecycleError(f"{archive}: {exc}{_partial(url, writing)}", Exit.CORRUPT) from exc
    except StorageError as exc:
        raise LifecycleError(f"restore into {url} failed: {exc}{_partial(url, writing)}") from exc
    finally:
        await target.close()
    # a snapshot is one point in time whatever a v1 trailer's unprotected flag says (its header is hashed)
    quiesced = trailer.quiesced or reader.header.consistency == "snapshot"
    return RestoreReport(trailer.items, verification, loop.time() - started, reader.header, quiesced)


def _partial(url: str, writing: bool) -> str:
    """What a restore that failed after its first write left: a rerun is refused (not empty)."""
    return (f". {url} may now hold part of the archive: {EMPTY_TARGET}, then run the command again"
            if writing else "")
