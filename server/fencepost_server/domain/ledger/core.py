"""What every part of the ledger shares: configuration, clock, caches, views, errors."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from fencepost import reasons

from ...storage import Check, Delete, Expect, Item, Storage, StorageError, Write
from ..errors import Aborted, FailedPrecondition, InvalidArgument
from ..limits import Limits
from ..paging import PageTokens
from .layout import LeaseState, Meta, SessionKeys, inbox_id_at, session_keys, session_not_found

log = logging.getLogger("fencepost.ledger")

MAX_RECORDS = 64
MAX_CONSUMED = 32
INBOX_COUNT_CAP = 10_000  # pending counts (GetSession, forced release) stop here
#: The conditions hot paths name most, built once (Expect is immutable).
ABSENT = Expect(exists=False)
PRESENT = Expect(exists=True)


@dataclass(frozen=True)
class LedgerConfig:
    default_ttl: float = 30.0
    max_ttl: float = 3600.0
    inline_event_bytes: int = 64 * 1024  # larger payloads go to a blob
    read_page: int = 256  # log records per backend list call
    janitor_interval: float = 5.0
    orphan_grace: float = 10.0
    watch_poll: float = 1.0  # WatchInbox re-list period (deliveries through other replicas)
    cache_size: int = 10_000  # lease items, identities and act/ items remembered per process
    #: ListSessions is exact for a listing whose pages are read within this
    #: many seconds of its first page; superseded index entries older than
    #: this are deleted (by the next commit of the session, or by a listing).
    listing_horizon: float = 300.0


@dataclass(frozen=True, slots=True)
class SessionView:
    session_id: str
    agent: str
    session_key: str
    seq: int
    lease: LeaseState
    pending: int
    parent: str
    seed_length: int
    created: float
    last_activity: float
    metadata: dict[str, str] = field(default_factory=dict)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


def lease_held(st: LeaseState) -> FailedPrecondition:
    return FailedPrecondition(
        reasons.LEASE_HELD,
        f"the lease is held by {st.holder!r} (generation {st.generation}) until {rfc3339(st.expires)}",
        {"holder": st.holder, "generation": st.generation, "expires_at": rfc3339(st.expires)},
    )


def lease_fenced(generation: int, current: int, released: bool = False) -> FailedPrecondition:
    why = "was released" if released and current == generation else f"is now {current}"
    return FailedPrecondition(
        reasons.LEASE_FENCED,
        f"generation {generation} is no longer current (the lease {why}); stop working on this session",
        {"generation": generation, "current_generation": current},
    )


def contended(what: str) -> Aborted:
    return Aborted(reasons.TXN_CONTENDED, f"{what} kept conflicting with concurrent writes; retry")


def bad(field_name: str, message: str) -> InvalidArgument:
    return InvalidArgument(reasons.FIELD_INVALID, message, field=field_name)


#: a holder id is kept in the lease item (a DynamoDB item holds 400 KB at most)
MAX_HOLDER_CHARS = 1024


def check_holder(holder: str, field_name: str = "holder_id") -> None:
    if len(holder) > MAX_HOLDER_CHARS:
        raise bad(field_name, f"{field_name} is longer than {MAX_HOLDER_CHARS} characters (got {len(holder)})")


def require_holder(holder: str) -> None:
    """The holder of a lease about to be granted (AcquireLease, ClaimOrphan):
    required, since a lease granted to "" names nobody."""
    if not holder:
        raise bad("holder_id", "holder_id is required")
    check_holder(holder)


class _Lru:
    def __init__(self, size: int) -> None:
        self.size = size
        self.data: OrderedDict[str, object] = OrderedDict()

    def get(self, key: str) -> object | None:
        value = self.data.get(key)
        if value is not None:
            self.data.move_to_end(key)
        return value

    def put(self, key: str, value: object) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        while len(self.data) > self.size:
            self.data.popitem(last=False)

    def drop(self, key: str) -> None:
        self.data.pop(key, None)


class LedgerBase:
    """State shared by the ledger's parts. The caches only save reads: every
    decision made from a cached item is a conditional write that fails (and
    is re-decided from a fresh read) when the item changed."""

    def __init__(
        self,
        storage: Storage,
        limits: Limits | None = None,
        config: LedgerConfig | None = None,
        clock: Callable[[], float] = time.time,
        events: Callable[..., None] | None = None,
        pages: PageTokens | None = None,
    ) -> None:
        self.storage = storage
        self.limits = limits or Limits()
        self.pages = pages or PageTokens.ephemeral()
        self.config = config or LedgerConfig()
        self.clock = clock
        #: metrics hook: events("janitor.orphans_found", 3); no-op by default
        self.events: Callable[..., None] = events or (lambda name, value=1.0: None)
        #: set on shutdown: long-polls and watches end cleanly instead of being cut
        self.draining = False
        self._leases = _Lru(self.config.cache_size)  # lease key -> Item last seen / written
        self._identities = _Lru(self.config.cache_size)  # identity key -> session id (immutable)
        self._acts = _Lru(self.config.cache_size)  # act/ key -> the act/ value last seen / written
        self._indexed = _Lru(self.config.cache_size)  # agent roots whose activity index is complete
        #: the times (µs) of index entries this process is writing: a listing's
        #: snapshot starts before them (activity.py, `dating`)
        self._dating: Counter[int] = Counter()
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._last_arrival_ns = 0  # the last inbox id's time (arrival_id)

    def drain(self) -> None:
        """Shutdown has begun: wake every watcher so streams end now."""
        self.draining = True
        self._wake_watchers()

    async def wake_watchers(self) -> None:
        """After the identity files were reloaded: open watches identify
        their caller again now (a revoked one ends) rather than when they
        next have something to send."""
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        for wakes in self._watchers.values():
            for wake in wakes:
                wake.set()

    # -- helpers --------------------------------------------------------------------
    def keys(self, tenant: str, sid: str) -> SessionKeys:
        return session_keys(tenant, sid)

    def ttl(self, ttl: float | None) -> float:
        """The lease time to live to grant: unset (0) is the default, negative is refused."""
        if ttl is not None and ttl < 0:
            raise bad("ttl", f"ttl must not be negative (got {ttl}s)")
        if ttl is None or ttl == 0:
            return self.config.default_ttl
        if ttl > self.config.max_ttl:
            raise bad("ttl", f"ttl {ttl}s is over the maximum of {self.config.max_ttl}s")
        return ttl

    def arrival_id(self, now: float) -> str:
        """A new inbox id, after every one this process made before: inbox ids
        are the arrival order, which must hold when the clock reads the same
        value twice or steps backwards (the random suffix alone would order
        such events by chance)."""
        ns = max(int(now * 1e9), self._last_arrival_ns + 1)
        self._last_arrival_ns = ns
        return inbox_id_at(ns)

    def remember_lease(self, key: str, item: Item | None) -> None:
        if item is None:
            self._leases.drop(key)
        else:
            self._leases.put(key, item)

    def cached_lease(self, key: str) -> Item | None:
        return self._leases.get(key)  # type: ignore[return-value]

    async def read_lease(self, sk: SessionKeys) -> Item:
        item = await self.storage.get(sk.lease)
        if item is None:
            raise session_not_found(sk.sid)
        self.remember_lease(sk.lease, item)
        return item

    async def read_meta(self, sk: SessionKeys) -> Meta:
        item = await self.storage.get(sk.meta)
        if item is None:
            raise session_not_found(sk.sid)
        return Meta.decode(item.value)

    async def count_inbox(self, sk: SessionKeys, cap: int = INBOX_COUNT_CAP) -> int:
        count, start = 0, None
        while count < cap:
            keys = await self.storage.list_keys(sk.inbox, start, 1000)
            count += len(keys)
            if len(keys) < 1000:
                break
            start = keys[-1]
        return count

    async def prove_inbox_empty(
        self, sk: SessionKeys, entry: Item | None, checks: list[Check], writes: list[Write], remedy: str
    ) -> None:
        """Make a write that needs an empty inbox (ReleaseLease, DeleteSession
        without force) carry its proof: the session's pending-index entry, read
        *before* the inbox is listed, is checked absent or deleted at that
        version, so a Deliver that parks after the read fails the write
        (docs/ledger.md, "Release vs Deliver"). INBOX_NOT_EMPTY when events wait."""
        if entry is None:
            checks.append(Check(sk.pending, Expect(exists=False)))
            return
        pending = await self.count_inbox(sk)
        if pending:
            raise FailedPrecondition(
                reasons.INBOX_NOT_EMPTY, f"{pending} event(s) are pending: {remedy}",
                {"pending": pending, "session_id": sk.sid},
            )
        writes.append(Delete(sk.pending, Expect(version=entry.version)))

    async def pending_after_write(self, sk: SessionKeys, cap: int) -> int:
        """The pending count after a write that applied but whose count did not
        come back. A failed read must not turn an applied write into an error:
        1 then, so the holder runs a follow-up turn (and finds out)."""
        try:
            return await self.count_inbox(sk, cap)
        except StorageError:
            log.warning("pending count unreadable after an applied write; reporting 1", exc_info=True)
            return 1

    def notify(self, sid: str) -> None:
        for event in self._watchers.get(sid, ()):
            event.set()
