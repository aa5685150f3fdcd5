"""Opening the stores the operator commands read and write.

A source that can take an online point-in-time snapshot (the SQLite
backend: `SqliteStorage.snapshot`, sqlite3's backup API) is read from a
snapshot, so a server may keep serving it while a backup runs and a copy
never sees half of a transaction. Any other source (DynamoDB) is read live,
a *logical* read; the commands then check afterwards whether it changed
while they read it.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..storage import Storage, StorageError, open_backend


class Exit(enum.IntEnum):
    """Exit codes of backup / restore / migrate (docs/lifecycle.md)."""

    OK = 0
    FAILED = 1  # a backend failed or refused a call
    USAGE = 2
    REFUSED = 3  # a non-empty target, a checkpoint of another migration
    CORRUPT = 4  # the archive fails its checksums or is incomplete
    DIFFERENT = 5  # the verification pass found differences
    INTERRUPTED = 130  # Ctrl-C, as every fencepost command


class LifecycleError(Exception):
    def __init__(self, message: str, code: Exit = Exit.FAILED) -> None:
        super().__init__(message)
        self.code = code


#: how to empty a restore target that an interrupted restore left partial
EMPTY_TARGET = ("delete it (a SQLite file: with its -wal and -shm files; a DynamoDB table: delete it and create it "
                "again, e.g. with --create-table)")


def scheme_of(url: str) -> str:
    return urlsplit(url).scheme


def sqlite_path(url: str) -> Path | None:
    """The file a sqlite:// URL names (None for another backend or :memory:)."""
    parts = urlsplit(url)
    path = unquote(parts.netloc + parts.path)
    return Path(path) if parts.scheme == "sqlite" and path and path != ":memory:" else None


def refuse_own_files(url: str, out: Path, flag: str) -> None:
    """USAGE if `out` is the SQLite file at `url` or one of its companions:
    writing there would replace the store itself."""
    path = sqlite_path(url)
    if path is None:
        return
    own = {path.resolve().with_name(path.name + suffix) for suffix in ("", "-wal", "-shm", "-journal")}
    if out.resolve() in own:
        raise LifecycleError(f"{flag} {out} is the store {url} itself (or one of its files)", Exit.USAGE)


def refuse_memory(*urls: str) -> None:
    """USAGE for memory://: it lives only as long as this command, so there is
    nothing to back up or copy from it, and nothing stays that is written to it."""
    for url in urls:
        if scheme_of(url) == "memory":
            raise LifecycleError(f"{url}: a memory:// store lives only inside one process (use sqlite:// "
                                 "or dynamodb://)", Exit.USAGE)


def refuse_unusable_sqlite(url: str, *, may_create: bool = False) -> None:
    """USAGE for a sqlite:// URL naming a directory (the state root instead of
    the file in it), or, unless `may_create`, no file at all (opening it
    would create an empty store and back *that* up)."""
    path = sqlite_path(url)
    if path is None:
        return
    if path.is_dir():
        raise LifecycleError(f"{path} is a directory, not a SQLite file (a server's file is fencepost.db in its "
                             f"--state-root: sqlite://{path / 'fencepost.db'})", Exit.USAGE)
    foreign = _foreign_tables(path)
    if foreign:  # opening it would add fencepost's tables to another program's database
        raise LifecycleError(f"{path} is a SQLite database but not a fencepost store (its tables: "
                             f"{', '.join(foreign)}): check the path", Exit.USAGE)
    if not may_create and not path.exists():
        # sqlite://tmp/x.db names the relative path tmp/x.db: the usual slip for sqlite:///tmp/x.db
        hint = "" if path.is_absolute() else (f" (a relative path, from {Path.cwd()}; an absolute path takes three "
                                              f"slashes: sqlite:///{path})")
        raise LifecycleError(f"no SQLite file at {path}{hint}", Exit.USAGE)


def _foreign_tables(path: Path) -> list[str]:
    """The tables of an existing SQLite file that holds some but no `kv`
    table (empty for a fencepost store, a new file, or one SQLite cannot read:
    opening it says why)."""
    import sqlite3

    if not path.is_file() or path.stat().st_size == 0:
        return []
    try:
        # immutable: reads the main file only, creating no -wal / -shm and taking no lock
        # (a table still only in a WAL is missed: then nothing is refused, as before)
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            names = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    return [] if "kv" in names else names


def open_existing(url: str, *, may_create: bool = False) -> Storage:
    """The backend at `url`; a SQLite URL is checked by `refuse_unusable_sqlite` first."""
    refuse_unusable_sqlite(url, may_create=may_create)
    try:
        return open_backend(url)
    except ValueError as exc:
        raise LifecycleError(str(exc), Exit.USAGE) from exc
    except StorageError as exc:  # e.g. a path that is a directory, or not writable
        raise LifecycleError(f"cannot open {url}: {exc}") from exc


def _missing_table(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    from ..storage.dynamodb.errors import error_code

    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ClientError) and error_code(cause) == "ResourceNotFoundException":
            return True
        cause = cause.__cause__
    return False


async def check_table(storage: Storage, url: str, *, target: bool) -> None:
    """Name a DynamoDB store whose table is missing or that does not answer
    before anything is read or written, with the next step that helps: the
    backend's own message suggests `serve --create-table`, and a migration's
    failures suggest resuming, neither of which does."""
    table = getattr(storage, "table", None)
    if table is None:  # not DynamoDB
        return
    try:
        await storage.ping()
    except StorageError as exc:
        if not _missing_table(exc):
            raise LifecycleError(f"cannot reach {url}: {exc}") from exc
        if target:
            raise LifecycleError(f"{url}: the table {table} does not exist: create it (fencepost dynamodb "
                                 f"create-table --table {table} ...) or pass --create-table") from exc
        raise LifecycleError(f"{url}: the table {table} does not exist (check the table name, region and "
                             "endpoint in the URL)") from exc


async def ensure_table(storage: Storage, url: str) -> None:
    """--create-table: create the DynamoDB table when missing (idempotent);
    one clear line when that fails."""
    create = getattr(storage, "create_table", None)
    if create is None:
        return
    try:
        await create()
    except Exception as exc:  # endpoint, credentials, region, permissions: the environment's
        from ..storage.dynamodb.errors import describe

        raise LifecycleError(f"--create-table: cannot create the table of {url}: {describe(exc)}") from exc


async def is_empty(storage: Storage) -> bool:
    async for page in storage.export_items(None, 1):
        if page:
            return False
    return True


@dataclass
class Source:
    live: Storage
    #: what to copy from: `live` itself, or a snapshot of it
    read: Storage
    consistency: str  # "snapshot" | "logical"
    snapshot_file: Path | None = None

    @property
    def snapshot(self) -> bool:
        return self.consistency == "snapshot"


def remove_sqlite_files(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def source(url: str, snapshot_file: Path, *, reuse: bool = False, keep: bool = False) -> AsyncIterator[Source]:
    """The source at `url`, with a snapshot at `snapshot_file` when it can take
    one (an existing snapshot file is reused with `reuse`, kept with `keep`)."""
    live = open_existing(url)
    try:
        await check_table(live, url, target=False)
        take = getattr(live, "snapshot", None)
        if take is None:
            yield Source(live, live, "logical")
            return
        from ..storage.sqlite import SqliteStorage

        if not (reuse and snapshot_file.exists()):
            partial = snapshot_file.with_name(snapshot_file.name + ".partial")
            remove_sqlite_files(partial)
            snapshot_file.parent.mkdir(parents=True, exist_ok=True)
            await take(partial)
            partial.replace(snapshot_file)
        copy = SqliteStorage(snapshot_file)
        try:
            yield Source(live, copy, "snapshot", snapshot_file)
        finally:
            await copy.close()
            if not keep:
                remove_sqlite_files(snapshot_file)
    finally:
        await live.close()


def count_snapshot(src: Source) -> int | None:
    """Items in a snapshot (a cheap COUNT on the file), for the progress bar:
    exactly what export_items yields, so the total matches what is copied:
    the rows, and each request-id marker kept in a row (exported as an item)
    once, and not at all when it also has a row of its own (that row is what
    is exported)."""
    if src.snapshot_file is None:
        return None
    import sqlite3

    conn = sqlite3.connect(str(src.snapshot_file))  # our own copy: nobody else writes it
    try:
        return int(conn.execute(_SNAPSHOT_ITEMS).fetchone()[0])
    finally:
        conn.close()


#: the rows, plus the distinct kept markers with no row of their own (the
#: partial index on marker_key finds them; each is one primary-key probe)
_SNAPSHOT_ITEMS = (
    "SELECT (SELECT COUNT(*) FROM kv) + (SELECT COUNT(DISTINCT m.marker_key) FROM kv AS m "
    "WHERE m.marker_key IS NOT NULL AND NOT EXISTS (SELECT 1 FROM kv AS r WHERE r.key = m.marker_key))"
)
