"""`fencepost migrate --from URL --to URL`: copy every item, versions and all,
then verify both sides range by range.

- The target must be empty (or hold exactly what an interrupted run of the
  same migration copied: its checkpoint says so).
- The source is read from a consistent snapshot when it can take one
  (SQLite: the snapshot is kept in the work directory, so a resumed run
  copies from the same point in time); otherwise live (DynamoDB), which is
  only correct when nothing writes to it: scale its servers to zero first.
- Before any item, the source's version watermarks are reserved on the
  target; with every item's version kept byte for byte, no version the
  target mints later can equal one the source ever issued (no ABA).
- Items go over in key order, a page at a time (the next page is read while
  the previous one is written). After each page the checkpoint (work
  directory, written atomically) records the last key copied: after a crash
  or kill -9 the same command resumes after it; a page that was partly
  written is written again, which leaves the same items.
- Then the verification pass reads the *live* source and the target and
  compares counts and digests per key range. Any difference - a server that
  still wrote to the source after the snapshot included - exits non-zero.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from ..storage import EXPORT_PAGE, Item, Storage, StorageError, private
from .fit import item_sizer, refuse_unfit
from .progress import Progress, tracked
from .stores import (
    Exit,
    LifecycleError,
    Source,
    check_table,
    count_snapshot,
    ensure_table,
    is_empty,
    open_existing,
    refuse_memory,
    refuse_own_files,
    refuse_unusable_sqlite,
    remove_sqlite_files,
    source,
    sqlite_path,
)
from .verify import Comparison, compare

DEFAULT_WORK_ROOT = Path(".fencepost-migrate")
#: the work directory's files (each also written as NAME.partial first)
CHECKPOINT, SNAPSHOT = "checkpoint.json", "source-snapshot.db"


@dataclass
class Checkpoint:
    source: str
    target: str
    phase: str = "copy"  # copy -> verify -> done
    last_key: str | None = None
    copied: int = 0
    path: Path = field(default=Path(), repr=False)

    @classmethod
    def load(cls, path: Path, source_url: str, target_url: str) -> Checkpoint | None:
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text())
            if raw.get("source") != source_url or raw.get("target") != target_url:
                raise LifecycleError(f"{path} belongs to the migration {raw.get('source')} -> {raw.get('target')}: "
                                     "pass another --work-dir (or none: the default is one per pair of URLs)",
                                     Exit.REFUSED)
            return cls(raw["source"], raw["target"], raw["phase"], raw.get("last_key"), int(raw["copied"]), path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LifecycleError(f"{path} is not a checkpoint this command can read ({exc!r}): use another "
                                 "--work-dir, or empty the target and delete this one", Exit.REFUSED) from None

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        partial = self.path.with_name(self.path.name + ".partial")
        with partial.open("w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        partial.replace(self.path)


@dataclass
class MigrationReport:
    resumed_after: int
    copied: int
    copy_seconds: float
    verification: Comparison
    verify_seconds: float
    consistency: str
    #: an earlier run had finished copying (verified or not): this run only verified again
    already_done: bool = False

    @property
    def rate(self) -> float:
        return self.copied / self.copy_seconds if self.copy_seconds > 0 else 0.0


def work_dir_for(source_url: str, target_url: str, root: Path = DEFAULT_WORK_ROOT) -> Path:
    return root / hashlib.sha256(f"{source_url}\n{target_url}".encode()).hexdigest()[:16]


_START_OVER = (". Then empty the target and delete the work directory (a resumed run copies from the same "
               "snapshot, which still holds the item), and run the command again")

#: pages being written at once: the next page starts while the last requests
#: of the previous one finish, so the target never idles at a page boundary
PAGES_IN_FLIGHT = 2


async def _copy(
    src: Storage, target: Storage, checkpoint: Checkpoint, page: int, progress: Progress, target_url: str = ""
) -> None:
    sizer = item_sizer(target)
    pages: asyncio.Queue[list[Item] | None] = asyncio.Queue(maxsize=2)

    async def read() -> None:
        try:
            async for items in src.export_items(checkpoint.last_key, page):
                await pages.put(items)
        except Exception:
            await pages.put(None)  # no page follows; `await reader` raises the failure
            raise
        await pages.put(None)

    async def settle_oldest() -> None:
        # The checkpoint only moves past a page once it and every page before
        # it are written; a later page that landed first is written again on
        # resume, which leaves the same items.
        task, items = writing.popleft()
        await task
        checkpoint.last_key = items[-1].key
        checkpoint.copied += len(items)
        checkpoint.save()
        progress.advance(len(items))

    writing: collections.deque[tuple[asyncio.Task[None], list[Item]]] = collections.deque()
    reader = asyncio.create_task(read())
    try:
        while (items := await pages.get()) is not None:
            # before any item of the page is sent; a resumed run would copy from the
            # same snapshot, which still holds the item: the fix needs a fresh start
            refuse_unfit(sizer, items, target_url, then=_START_OVER)
            writing.append((asyncio.create_task(target.import_items(items)), items))
            if len(writing) >= PAGES_IN_FLIGHT:
                await settle_oldest()
        while writing:
            await settle_oldest()
        await reader
    finally:
        for task in [reader, *(t for t, _ in writing)]:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StorageError):
                await task


async def migrate(
    source_url: str,
    target_url: str,
    *,
    work_dir: Path | None = None,
    page: int = EXPORT_PAGE,
    create_table: bool = False,
    stream: TextIO | None = None,
) -> MigrationReport:
    refuse_memory(source_url, target_url)
    source_file, target_file = sqlite_path(source_url), sqlite_path(target_url)
    if source_url == target_url or (source_file and target_file and source_file.resolve() == target_file.resolve()):
        raise LifecycleError("--from and --to name the same store", Exit.USAGE)
    refuse_unusable_sqlite(source_url)  # before the target or a checkpoint is made
    refuse_unusable_sqlite(target_url, may_create=True)
    work = work_dir or work_dir_for(source_url, target_url)
    for url in (source_url, target_url):  # the snapshot is written over, then deleted
        for name in (CHECKPOINT, SNAPSHOT):
            for scratch in (work / name, work / f"{name}.partial"):
                refuse_own_files(url, scratch, f"--work-dir {work}: its")
    fresh = not work.exists()
    try:
        private.make_dirs(work)  # its snapshot holds every stored item
    except OSError as exc:
        why = "it is a file, or under one" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror
        raise LifecycleError(f"--work-dir {work}: cannot be the work directory ({why})", Exit.USAGE) from None
    try:
        return await _migrate(source_url, target_url, work, page, create_table, stream)
    except BaseException:
        if fresh:  # a run refused before its first checkpoint leaves no empty work directory behind
            with contextlib.suppress(OSError):
                work.rmdir()
        raise


async def _migrate(
    source_url: str, target_url: str, work: Path, page: int, create_table: bool, stream: TextIO | None
) -> MigrationReport:
    checkpoint_file = work / CHECKPOINT
    checkpoint = Checkpoint.load(checkpoint_file, source_url, target_url)
    loop = asyncio.get_running_loop()
    if sqlite_path(source_url) is None:  # (a SQLite source file was checked up front)
        await _check_source(source_url)  # before a target file or a checkpoint is made
    target = open_existing(target_url, may_create=True)
    try:
        if create_table:
            await ensure_table(target, target_url)
        await check_table(target, target_url, target=True)
        if checkpoint is None:
            if not await is_empty(target):
                raise LifecycleError(f"{target_url} is not empty: migrate only writes into an empty store, or "
                                     "resumes its own interrupted run, whose checkpoint it looked for in "
                                     f"{checkpoint_file} (none there: resume from the directory the first run "
                                     "started in, or pass its --work-dir)", Exit.REFUSED)
            checkpoint = Checkpoint(source_url, target_url, path=checkpoint_file)
            checkpoint.save()
            reuse = False
        elif checkpoint.copied and await is_empty(target):
            # resuming would skip what the checkpoint says is there, and the
            # verification would fail on every run without saying why
            raise LifecycleError(f"{target_url} is empty, but the checkpoint in {work} says {checkpoint.copied} "
                                 "items were copied to it: the target was replaced since. Delete that work "
                                 "directory to migrate from the start", Exit.REFUSED)
        else:
            # resume from the earlier run's snapshot, also when it died before its first
            # checkpoint: the pages it wrote (a non-empty target) are of that point in
            # time, and a fresh snapshot would leave the target a mix of two
            reuse = checkpoint.copied > 0 or checkpoint.phase != "copy" or not await is_empty(target)
        resumed_after = checkpoint.copied
        already_done = checkpoint.phase != "copy"  # also after a failed verification: only verify again
        async with source(source_url, work / SNAPSHOT, reuse=reuse, keep=True) as src:
            started = loop.time()
            if checkpoint.phase == "copy":
                await _copy_phase(src, target, checkpoint, page, stream, target_url)
            copy_seconds = loop.time() - started
            started = loop.time()
            checking = Progress("verify", checkpoint.copied, stream=stream)
            verification = await compare(tracked(src.live.export_items(None, page), checking),
                                         target.export_items(None, page))
            verify_seconds = loop.time() - started
            if verification.same:
                checkpoint.phase = "done"
                checkpoint.save()
        if verification.same and src.snapshot_file is not None:
            remove_sqlite_files(src.snapshot_file)  # kept until now for a resumed run
    except StorageError as exc:
        raise LifecycleError(f"migration {source_url} -> {target_url} failed: {exc} "
                             "(run the same command again to resume)") from exc
    finally:
        await target.close()
    copied = checkpoint.copied - resumed_after
    return MigrationReport(resumed_after, copied, copy_seconds, verification, verify_seconds, src.consistency,
                           already_done)


async def _check_source(url: str) -> None:
    """A source table that does not exist or an endpoint that does not answer,
    named before anything is written."""
    probe = open_existing(url)
    try:
        await check_table(probe, url, target=False)
    finally:
        await probe.close()


async def _copy_phase(
    src: Source, target: Storage, checkpoint: Checkpoint, page: int, stream: TextIO | None, target_url: str
) -> None:
    total = count_snapshot(src)
    progress = Progress("migrate", total, stream=stream)
    progress.resume(checkpoint.copied)
    await target.reserve_versions(await src.read.version_watermarks())
    await _copy(src.read, target, checkpoint, page, progress, target_url)
    progress.finish()
    checkpoint.phase = "verify"
    checkpoint.save()
