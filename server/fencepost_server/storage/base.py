"""The storage contract every backend implements.

Keys are `str` compared in UTF-8 byte order (for valid Unicode this is code
point order, so Python's own `str` ordering agrees). Values are `bytes`.
Version tokens are opaque strings that change on every successful write and
are never handed out twice by one backend, so a key deleted and re-created
never gets an old token back (no ABA). Every backend mints them with
`new_version` (128 random bits): unique without coordination (replicas,
restarts, a backup restored elsewhere), and unlike a shared counter they tell
one tenant nothing about how much the others write.

A miss is a miss (`None`); an outage raises `BackendUnavailable`. A write
whose outcome is unknown raises `PersistenceUncertain`.
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Union

MAX_TXN_OPS = 100
MAX_TXN_BYTES = 4 * 1024 * 1024
#: The most a backend's own count of a transaction adds per operation to the
#: contract's (keys plus values): DynamoDB counts every attribute of an item,
#: so a put also carries its `k:` key prefix, the names `pk`, `sk`, `val`,
#: `ver` (12 bytes), its version token (32 characters, 33 for a request id's
#: `r`-prefixed ones) and a NUL sort key when the key ends at its partition
#: head; a check or delete, its prefix and key names (7). A limit a domain
#: promises to fit one backend transaction counts this per operation.
TXN_OP_OVERHEAD = 48
#: items per page of `Storage.export_items`
EXPORT_PAGE = 1000


_POOL_BYTES = 4096


class _RandomPool(threading.local):
    """Random bytes cut from a pooled os.urandom read: one system call per
    4 KiB rather than one per token. os.urandom drops the GIL, and a serving
    process has other threads waiting for it (gRPC's poller, the SQLite
    writer): every drop hands it over and getting it back costs far more
    than the call. One pool per thread, so no byte is handed out twice; a
    forked child starts with an empty pool (`os.register_at_fork`)."""

    def __init__(self) -> None:
        self.pool, self.at = b"", 0

    def hex(self, nbytes: int) -> str:
        if self.at + nbytes > len(self.pool):
            self.pool, self.at = os.urandom(_POOL_BYTES), 0
        self.at += nbytes
        return self.pool[self.at - nbytes:self.at].hex()

    def forget(self) -> None:
        self.pool, self.at = b"", 0


_random = _RandomPool()
os.register_at_fork(after_in_child=_random.forget)


def random_hex(nbytes: int = 16) -> str:
    """`nbytes` random bytes as hex (`os.urandom` quality, pooled)."""
    return _random.hex(nbytes)


def new_version() -> str:
    """A fresh version token: 128 random bits, so a token is never handed out
    twice (no ABA after delete and re-create) and carries no counter."""
    return _random.hex(16)


class StorageError(Exception):
    """Base class of every error a backend raises."""


class BackendUnavailable(StorageError):
    """The backend could not be reached or refused the call; nothing was applied
    as far as the backend can tell. Retryable."""


def item_bytes(item: Item) -> int:
    """An item's measure against a listing's `max_bytes`: its key (UTF-8) and value."""
    return len(item.key.encode()) + len(item.value)


def within_budget(items: Iterable[Item], limit: int, max_bytes: int | None) -> list[Item]:
    """The first `limit` of `items`, ending with the one that takes them past
    `max_bytes` (Storage.list); consumes no more of `items` than it returns."""
    out: list[Item] = []
    if limit <= 0:
        return out
    spent = 0
    for item in items:
        out.append(item)
        if len(out) >= limit:
            break
        if max_bytes is not None:
            spent += item_bytes(item)
            if spent > max_bytes:
                break
    return out


def over_budget(items: Sequence[Item], max_bytes: int) -> bool:
    """Whether a list asked for with `max_bytes` may have ended for its size."""
    return sum(map(item_bytes, items)) > max_bytes


class PersistenceUncertain(BackendUnavailable):
    """A write was sent but its outcome is unknown (timeout after sending)."""


class RequestRejected(StorageError):
    """The backend refused a request as malformed (DynamoDB's
    ValidationException, a key its table cannot hold). Every input a caller
    can send is validated before it gets here, so this is a server bug: not
    retryable, and the message names the operation, the key(s) and what the
    backend said."""


class InvalidTransaction(StorageError, ValueError):
    """A transaction is malformed (too many operations, one key twice).
    Over a limit, `limit` and `size` say which and by how much (the caller
    is told both, as for every limit)."""

    def __init__(self, message: str, *, limit: int | None = None, size: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.size = size


@dataclass(frozen=True, slots=True)
class Item:
    key: str
    value: bytes
    version: str


@dataclass(frozen=True, slots=True)
class CasResult:
    """Outcome of a conditional write. A failed condition is a result.

    applied: the write happened.
    version: the new version when applied; otherwise the current version
        (`None` when the key is absent).
    current: when not applied, the current item (`None` when absent), so a
        caller can decide again without a second read.
    """

    applied: bool
    version: str | None
    current: Item | None = None


@dataclass(frozen=True, slots=True)
class Expect:
    """A condition on one key. Every given field must hold.

    exists=True: present; exists=False: absent. version / value: present with
    exactly that version / value.
    """

    exists: bool | None = None
    version: str | None = None
    value: bytes | None = None

    def holds(self, item: Item | None) -> bool:
        if self.exists is not None and (item is not None) != self.exists:
            return False
        if self.version is not None and (item is None or item.version != self.version):
            return False
        if self.value is not None and (item is None or item.value != self.value):
            return False
        return True


@dataclass(frozen=True, slots=True)
class Check:
    """A condition that writes nothing."""

    key: str
    expect: Expect


@dataclass(frozen=True, slots=True)
class Put:
    """A write. `version`, when given (transact only), is the version token the
    write gets instead of one the backend mints: the caller must make it
    globally unique (128 random bits). The request-id log uses it to record a
    write's version in the same transaction as the write."""

    key: str
    value: bytes
    expect: Expect | None = None
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    expect: Expect | None = None


Write = Union[Put, Delete]


@dataclass(frozen=True, slots=True)
class Marker:
    """A request-id marker (domain/requests.py) written by `transact_marked`
    together with a request's writes.

    key: where the marker lives as an item of its own; previous: the same
        request's key in the previous dedupe window (either existing means
        "this request was applied already").
    value: what a retry gets back (`TxnResult.marker`).
    item: the key every attempt of this request writes, when there is one. A
        backend that can (`keeps_markers_with_items`) keeps the marker with
        that item instead of writing a second item, and moves it out to `key`
        when the item is next overwritten or deleted, so the marker outlives
        the item's later writes exactly as an item of its own would.
    """

    key: str
    previous: str
    value: bytes
    item: str | None = None


@dataclass(frozen=True, slots=True)
class CountKeys:
    """Asks `transact` to count the keys under `prefix` (at most `limit`) as
    its writes left them, in the same backend call."""

    prefix: str
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of `transact`.

    applied: every condition held and every write was applied.
    versions: for each write in order, its new version (`None` for deletes).
    failed: indexes (checks first, then writes) whose condition did not hold.
    count: when a `CountKeys` was given and the writes applied, the keys under
        its prefix (capped at its limit); otherwise `None`.
    """

    applied: bool
    versions: tuple[str | None, ...] = ()
    failed: tuple[int, ...] = ()
    count: int | None = None
    #: set by the request-id log: this result is the first outcome of a retried request
    replayed: bool = False
    #: set by the request-id log on a replay: the note the first attempt recorded
    note: str = ""
    #: for each failed index whose condition named a key, the item that failed
    #: it (None: absent), read in the same atomic step as the decision
    found: dict[int, Item | None] | None = None
    #: `transact_marked` only: the stored marker's value when the request was applied before
    marker: bytes | None = None


def key_bytes(keys: Iterable[str]) -> int:
    """The encoded size of `keys`, as the transaction limit counts it (on
    every write path: no Python frame per key)."""
    return sum(map(len, map(str.encode, keys)))


def validate_transaction(checks: Sequence[Check], writes: Sequence[Write]) -> None:
    """Refuse transactions no backend could apply atomically. The byte limit
    counts keys, values and TXN_OP_OVERHEAD per operation: one count on every
    backend, within every backend's own."""
    if not checks and len(writes) == 1:  # the common single write: only its size can be wrong
        w = writes[0]
        size = len(w.key.encode()) + (len(w.value) if type(w) is Put else 0) + TXN_OP_OVERHEAD
        if size > MAX_TXN_BYTES:
            raise InvalidTransaction(f"transaction is {size} bytes (limit {MAX_TXN_BYTES})",
                                     limit=MAX_TXN_BYTES, size=size)
        return
    ops = len(checks) + len(writes)
    if ops > MAX_TXN_OPS:
        raise InvalidTransaction(f"transaction has {ops} operations (limit {MAX_TXN_OPS})",
                                 limit=MAX_TXN_OPS, size=ops)
    keys = [c.key for c in checks]
    keys += [w.key for w in writes]
    size = key_bytes(keys) + TXN_OP_OVERHEAD * ops
    size += sum([len(w.value) for w in writes if type(w) is Put])
    if size > MAX_TXN_BYTES:
        raise InvalidTransaction(f"transaction is {size} bytes (limit {MAX_TXN_BYTES})",
                                 limit=MAX_TXN_BYTES, size=size)
    if len(set(keys)) != len(keys):
        raise InvalidTransaction("a transaction names one key more than once")


def version_family(token: str) -> tuple[str, int] | None:
    """(family, counter) of a counter-shaped version token, else None.

    A counter token is `[epoch-]` followed by lowercase hex digits of a fixed
    width: what older SQLite (`%016x`) and memory (`{epoch}-%012x`) backends
    minted, and what an archive of theirs still carries. Tokens of one family
    (same epoch prefix, same width) order by their counter. Random tokens
    (`new_version`'s 128 bits: 32 digits, minted by every backend now) are
    not counters and belong to no family."""
    head, _, digits = token.rpartition("-")
    if not digits or len(digits) > 16 or digits.strip("0123456789abcdef"):
        return None
    return f"{head}-{len(digits)}" if head else f"{len(digits)}", int(digits, 16)


def highest_per_family(tokens: Iterable[str]) -> dict[str, tuple[int, str]]:
    """family -> (counter, token) of the highest counter-shaped token of each family."""
    out: dict[str, tuple[int, str]] = {}
    for token in tokens:
        shape = version_family(token)
        if shape is not None and (shape[0] not in out or shape[1] > out[shape[0]][0]):
            out[shape[0]] = (shape[1], token)
    return out


def prefix_end(prefix: str) -> str | None:
    """The smallest string greater than every string starting with `prefix`,
    or None when there is none (empty prefix or all max code points)."""
    stripped = prefix.rstrip("\U0010ffff")
    if not stripped:
        return None
    nxt = ord(stripped[-1]) + 1
    # U+D800..U+DFFF are surrogates, which no key holds and UTF-8 cannot
    # encode: the code point after U+D7FF, in byte order too, is U+E000.
    return stripped[:-1] + chr(0xE000 if nxt == 0xD800 else nxt)


class Storage(abc.ABC):
    """The async backend contract. One instance serves a whole process."""

    #: the URL scheme this backend registers under
    scheme: str = ""

    # -- KV core -----------------------------------------------------------
    @abc.abstractmethod
    async def get(self, key: str) -> Item | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> str:
        """Write unconditionally; returns the new version."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Remove; returns whether the key existed."""

    @abc.abstractmethod
    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        """Items whose key starts with `prefix` and sorts after `start_after`,
        in key order, at most `limit`. With `max_bytes`, the list also ends
        with the item that takes its keys (UTF-8) and values past `max_bytes`
        (`over_budget` tells): a page of large values is read to its
        response's size, not to `limit` (1000 values at the limit are 256 MiB)."""

    # -- CAS group ---------------------------------------------------------
    async def get_with_version(self, key: str) -> Item | None:
        return await self.get(key)

    @abc.abstractmethod
    async def put_if_absent(self, key: str, value: bytes) -> CasResult: ...

    @abc.abstractmethod
    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult: ...

    @abc.abstractmethod
    async def delete_if_version(self, key: str, expected: str) -> CasResult: ...

    @abc.abstractmethod
    async def list_keys(
        self, prefix: str, start_after: str | None = None, limit: int = 100
    ) -> list[str]: ...

    async def list_versions(
        self, prefix: str, start_after: str | None = None, limit: int = 100
    ) -> list[tuple[str, str]]:
        """(key, version) pairs, as `list_keys` lists keys: what a delete
        conditioned on the version listed needs (backends read no values)."""
        return [(item.key, item.version) for item in await self.list(prefix, start_after, limit)]

    # -- transactions ------------------------------------------------------
    @abc.abstractmethod
    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        """Apply every write when every condition holds, else nothing.
        At most MAX_TXN_OPS operations and MAX_TXN_BYTES; a key at most once.

        With `count`, an applied result also says how many keys the prefix
        holds after the writes: the transaction's own puts and deletes are
        always reflected; keys other callers write at the same moment may or
        may not be (embedded backends count inside the write, so exactly)."""

    #: whether `transact_marked` can keep a marker with the item its request writes
    keeps_markers_with_items: bool = False

    async def forget_markers(self, prefix: str) -> None:
        """Drop the request-id markers kept with items under `prefix`, the
        items staying (erasure, before it deletes them: a deleted item would
        hand its marker on as an item of its own). Nothing to do where
        markers are items of their own."""

    async def forget_markers_before(self, bound: str, limit: int) -> int:
        """Drop at most `limit` request-id markers kept with items whose
        marker key sorts below `bound` (their dedupe window has passed), the
        items staying; returns how many. Nothing to do where markers are
        items of their own (those are swept as items)."""
        return 0

    # -- erasure: names the backend keeps besides items -------------------
    # A backend may keep records of its own that name key ranges (DynamoDB:
    # one partition-directory row per partition, named after the keys' head:
    # tenant, agent). An erasure removes those under its scope once the items
    # are gone: it lists them, forgets them, waits `partition_settle_seconds`,
    # then settles them. Nothing to do on a backend that keeps none.

    #: seconds between `forget_partitions` and `settle_partitions` (writers
    #: trusting a forgotten record have stopped, and their writes have landed)
    partition_settle_seconds: float = 0.0

    async def partitions_under(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> list[str]:
        """Names of the backend's own records of key ranges starting with
        `prefix`, after `start_after`, in order, at most `limit`."""
        return []

    async def forget_partitions(self, names: Sequence[str]) -> None:
        """Remove those records (every key under them has been erased)."""

    async def settle_partitions(self, names: Sequence[str]) -> int:
        """After `partition_settle_seconds`: put back the records of those
        ranges that hold items again (a write raced the erasure), so lists
        still find them. Returns how many were put back."""
        return 0

    async def transact_marked(self, checks: Sequence[Check], writes: Sequence[Write], marker: Marker) -> TxnResult:
        """`transact` for a request with an id: applied only when `marker`
        exists under neither of its keys, and then the marker is stored with
        the writes, atomically. When it exists, nothing is applied and the
        result carries its value (`marker`); `failed` lists the caller's
        conditions that did not hold either way.

        This default stores the marker as an item of its own: one transaction,
        and on a replay a read of the marker."""
        n = len(checks)
        result = await self.transact(
            [*checks, Check(marker.previous, Expect(exists=False))],
            [*writes, Put(marker.key, marker.value, Expect(exists=False))],
        )
        if result.applied:
            return TxnResult(True, result.versions[:-1])
        marker_indexes = (n, n + 1 + len(writes))
        failed = tuple(i if i < n else i - 1 for i in result.failed if i not in marker_indexes)
        if all(i not in result.failed for i in marker_indexes):
            found = {i if i < n else i - 1: item for i, item in (result.found or {}).items() if i not in marker_indexes}
            return TxnResult(False, failed=failed, found=found)
        for key in (marker.key, marker.previous):
            found = await self.get(key)
            if found is not None:
                return TxnResult(False, failed=failed, marker=found.value)
        # The marker vanished between the two calls (swept): not seen.
        return await self.transact_marked(checks, writes, marker)

    # -- operator tools: backup, restore, migration (lifecycle/) -----------
    # Never used on a request path. An import target is quiesced (no server
    # writes to it while it runs). Every backend implements them; wrappers
    # that do not (test doubles) refuse.
    async def export_items(self, start_after: str | None = None, page: int = EXPORT_PAGE) -> AsyncIterator[list[Item]]:
        """Every item of the whole keyspace after `start_after`, in key order,
        `page` items at a time, each with its version token."""
        while True:
            items = await self.list("", start_after, page)
            if items:
                yield items
            if len(items) < page:
                return
            start_after = items[-1].key

    async def import_items(self, items: Sequence[Item]) -> None:
        """Write `items` unconditionally, keeping each version token byte for
        byte (keys at most once per call). Writing the same items again is
        harmless, so an interrupted import resumes by re-sending. The imported
        versions are reserved as `reserve_versions` does."""
        raise NotImplementedError(f"{type(self).__name__} cannot import")

    async def reserve_versions(self, tokens: Iterable[str]) -> None:
        """Never mint, from now on, a version equal to one of `tokens` nor to
        any token of the same counter family below it (see `version_family`):
        versions brought over from another store, or another store's
        watermarks, so that no version ever comes back (no ABA across a move)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reserve versions")

    async def version_watermarks(self) -> list[str]:
        """The highest token of every counter family this backend has minted
        or reserved (SQLite keeps only its own family, the one family a
        durable backend mints). An export carries them, and the import target
        reserves them: a version that was deleted before the export can then
        never be minted again either."""
        raise NotImplementedError(f"{type(self).__name__} keeps no version watermarks")

    # -- lifecycle ---------------------------------------------------------
    async def ping(self) -> None:
        """Cheap liveness probe; raises BackendUnavailable when unreachable."""
        await self.get("\x01ping")

    async def close(self) -> None:
        """Release connections and threads. Idempotent."""
