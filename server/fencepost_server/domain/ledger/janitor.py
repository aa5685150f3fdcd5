"""The janitor: a loop in every replica that finds orphaned sessions and
sweeps leftovers. Safe on many replicas at once: everything it changes is a
conditional write, and an orphan is granted by the same CAS as AcquireLease.

Each pass, per pending-index shard (`#/ledger/pending/{shard}/`):
- for each entry (read with its version), list the session's inbox;
  - empty: the entry is stale; delete it *at the version read before the
    listing*, so a Deliver that parks meanwhile (it rewrites the entry) wins;
  - not empty, lease released or expired more than `grace` ago: an orphan,
    offered to ClaimOrphan callers of that tenant with the lease item seen.
Then blobs (`#/ledger/blob/{shard}/`) older than `grace` whose inbox entry is
gone are deleted, each in one write conditioned on that entry's absence
(Deliver checks its blob still exists when it parks, so exactly one of the
two applies), and
every session tombstoned more than `grace` ago but not yet swept
(`#/ledger/erase/{shard}/`: its DeleteSession was cut short, by a crash or a
deadline) is swept to the end (the sweep is idempotent, so two replicas
finishing one session at once only delete the same keys twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from collections import OrderedDict
from dataclasses import dataclass

from ...storage import Check, Delete, Expect, Item, StorageError
from ..errors import DomainError
from ..throttled_log import ThrottledWarning
from .core import LedgerBase, SessionView, bad, require_holder
from .layout import (
    BLOB_PREFIX,
    ERASE_PREFIX,
    PENDING_PREFIX,
    PENDING_SHARDS,
    LeaseState,
    SessionKeys,
    inbox_key_under,
    inbox_time,
)

log = logging.getLogger("fencepost.ledger.janitor")

_BATCH = 500


@dataclass
class JanitorStats:
    passes: int = 0
    orphans_found: int = 0  # sessions seen orphaned (per pass)
    orphans_recovered: int = 0  # granted to a ClaimOrphan caller
    stale_pending_swept: int = 0
    blobs_swept: int = 0
    erasures_finished: int = 0  # tombstoned sessions whose sweep the janitor completed
    oldest_pending_age: float = 0.0  # seconds, at the last pass


@dataclass(frozen=True, slots=True)
class _Orphan:
    tenant: str
    sid: str
    agent: str
    lease: Item


class Janitor:
    def __init__(self, ledger: LedgerBase) -> None:
        self.ledger = ledger
        self.storage = ledger.storage
        self.stats = JanitorStats()
        self._orphans: dict[str, OrderedDict[str, _Orphan]] = {}  # tenant -> sid -> orphan
        self._changed = asyncio.Condition()
        #: bumped with every wake-up of the claims: a claim busy granting when
        #: one came knows to look again instead of waiting for the next
        self._wakes = 0

    @property
    def interval(self) -> float:
        return self.ledger.config.janitor_interval

    @property
    def grace(self) -> float:
        return self.ledger.config.orphan_grace

    async def drain(self) -> None:
        """Shutdown: waiting ClaimOrphan long-polls answer "nothing" now."""
        self.ledger.drain()
        async with self._changed:
            self._wakes += 1
            self._changed.notify_all()

    async def wake_claims(self) -> None:
        """After the identity files were reloaded: waiting claims check their
        caller again now (a revoked one ends) rather than at the next orphan."""
        async with self._changed:
            self._wakes += 1
            self._changed.notify_all()

    async def run(self) -> None:
        """The background loop (registered in AppContext.background)."""
        warning = ThrottledWarning(log, "janitor pass")
        while True:
            try:
                await self.scan()
                warning.ok()
            except Exception as exc:  # an outage: try again next pass
                warning.failed(exc)
            await asyncio.sleep(self.interval)

    async def scan(self) -> None:
        now = self.ledger.clock()
        found: dict[str, OrderedDict[str, _Orphan]] = {}
        oldest = 0.0
        for shard in range(PENDING_SHARDS):
            prefix = f"{PENDING_PREFIX}{shard:02x}/"
            start = None
            while True:
                entries = await self.storage.list(prefix, start, _BATCH)
                for entry in entries:
                    orphan, age = await self._inspect(entry, now)
                    oldest = max(oldest, age)
                    if orphan is not None:
                        found.setdefault(orphan.tenant, OrderedDict())[orphan.sid] = orphan
                if len(entries) < _BATCH:
                    break
                start = entries[-1].key
        self.stats.orphans_found += sum(len(v) for v in found.values())
        self.stats.oldest_pending_age = oldest
        self.ledger.events("janitor.orphans_found", sum(len(v) for v in found.values()))
        self.ledger.events("janitor.oldest_pending_seconds", oldest)
        # Offered before the sweeps: a slow or failing sweep of leftovers must
        # not hold back the sessions waiting for a worker.
        async with self._changed:
            self._orphans = found
            self._wakes += 1
            self._changed.notify_all()
        blobs_before = self.stats.blobs_swept
        await self._sweep_blobs(now)
        await self._finish_erasures(now)
        self.stats.passes += 1
        self.ledger.events("janitor.blobs_swept", self.stats.blobs_swept - blobs_before)

    async def _inspect(self, entry: Item, now: float) -> tuple[_Orphan | None, float]:
        sid = entry.key.rsplit("/", 1)[1]
        tenant = json.loads(entry.value)["tenant"]
        sk = SessionKeys(tenant, sid)
        inbox = await self.storage.list_keys(sk.inbox, None, 1)  # listed AFTER the entry was read
        if not inbox:
            await self.storage.delete_if_version(entry.key, entry.version)
            self.stats.stale_pending_swept += 1
            self.ledger.events("janitor.stale_pending_swept")
            return None, 0.0
        age = max(0.0, now - inbox_time(inbox[0][len(sk.inbox):]))
        lease = await self.storage.get(sk.lease)
        if lease is None:
            return None, age
        st = LeaseState.decode(lease.value)
        if st.released or now > st.expires + self.grace:
            return _Orphan(tenant, sid, sk.agent, lease), age
        return None, age

    async def _sweep_blobs(self, now: float) -> None:
        for shard in range(PENDING_SHARDS):
            prefix = f"{BLOB_PREFIX}{shard:02x}/"
            start = None
            while True:
                keys = await self.storage.list_keys(prefix, start, _BATCH)
                for key in keys:
                    rest = key[len(prefix):]  # {tenant}/{sid}/{inbox id}
                    tenant_segment, sid, inbox_id = rest.split("/", 2)
                    if now - inbox_time(inbox_id) <= self.grace:
                        continue
                    inbox_key = inbox_key_under(tenant_segment, sid, inbox_id)
                    if await self.storage.get(inbox_key) is not None:
                        continue  # pending: a read, not a failed write, each pass
                    # The delete is conditioned on the entry's absence, never
                    # look-then-delete: a delivery stalled past the grace that
                    # parks between the look and the delete would be acked with
                    # its payload gone.
                    res = await self.storage.transact([Check(inbox_key, Expect(exists=False))], [Delete(key)])
                    if res.applied:
                        self.stats.blobs_swept += 1
                if len(keys) < _BATCH:
                    break
                start = keys[-1]

    async def _finish_erasures(self, now: float) -> None:
        for shard in range(PENDING_SHARDS):
            prefix = f"{ERASE_PREFIX}{shard:02x}/"
            start = None
            while True:
                entries = await self.storage.list(prefix, start, _BATCH)
                for entry in entries:
                    if now - float(json.loads(entry.value)["t"]) <= self.grace:
                        continue  # its DeleteSession is probably still sweeping it
                    tenant, sid = json.loads(entry.value)["tenant"], entry.key.rsplit("/", 1)[1]
                    await self.ledger.sweep_session(tenant, sid)  # type: ignore[attr-defined]
                    self.stats.erasures_finished += 1
                    self.ledger.events("janitor.erasures_finished")
                if len(entries) < _BATCH:
                    break
                start = entries[-1].key

    # -- ClaimOrphan ------------------------------------------------------------------
    async def claim(
        self, tenant: str, holder: str, ttl: float | None, wait: float, agent: str = "",
        still_allowed: Callable[[], None] = lambda: None,
    ) -> SessionView | None:
        """An orphan of `tenant` with a freshly granted lease, waiting up to
        `wait` seconds. The grant is a CAS on the lease item the janitor saw:
        if anything touched the lease since (a renew, another claim, an
        acquire), it fails and the orphan is dropped, so one orphan is never
        granted twice, across any number of replicas. `still_allowed` raises
        when the caller lost its right to claim while waiting (checked on
        every wake-up and before each grant, so nothing is granted to it and
        the orphan stays)."""
        require_holder(holder)
        ttl = self.ledger.ttl(ttl)
        if wait < 0:
            raise bad("wait", f"wait must not be negative (got {wait}s); 0 returns at once")
        deadline = time.monotonic() + wait
        while True:
            still_allowed()
            wakes = self._wakes
            for orphan in list(self._orphans.get(tenant, {}).values()):
                if agent and orphan.agent != agent:
                    continue
                still_allowed()
                self._orphans.get(tenant, OrderedDict()).pop(orphan.sid, None)
                sk = SessionKeys(tenant, orphan.sid)
                granted = await self.ledger.grant(sk, orphan.lease, holder, ttl)  # type: ignore[attr-defined]
                if granted is not None:
                    try:
                        claimed = await self.ledger.get(tenant, orphan.sid)  # type: ignore[attr-defined]
                    except StorageError:
                        # The caller is answered an error and never learns the session:
                        # give the lease back (its events stay pending) so the next scan
                        # offers it again, rather than a whole ttl held by nobody at work.
                        with contextlib.suppress(DomainError, StorageError):
                            await self.ledger.release(  # type: ignore[attr-defined]
                                tenant, orphan.sid, granted.generation, force=True)
                        raise
                    self.stats.orphans_recovered += 1
                    self.ledger.events("janitor.orphans_recovered")
                    return claimed  # type: ignore[no-any-return]
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.ledger.draining:
                return None
            async with self._changed:  # the wakers count under this lock: no wake-up slips between
                if self._wakes != wakes:
                    continue  # woken while granting: look again now
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except asyncio.TimeoutError:
                    pass

