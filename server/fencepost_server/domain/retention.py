"""Retention: the opt-in sweeps that keep the store from growing forever.

Each setting is off (keep forever) unless given a positive age:
- idle sessions: a session whose last activity is older than the age, with no
  live lease, is erased through DeleteSession's path (tombstone, then sweep).
  A session with live forks, or with events pending, waits (retention never
  erases an undelivered event); it is tried again on later passes.
- journal archives rotated longer ago than the age are deleted.
- commit markers (`cm/`, the commit_id idempotency markers) older than the
  window are deleted; a commit retried after that gets SEQUENCE_MISMATCH
  instead of its first result, and never applies twice (the head moved).
KV / eval request-id markers have their own fixed window (domain/requests.py,
swept by the server every `request_sweep_seconds`).

A pass walks the keyspace agent by agent (one list per skipped subtree, so
logs and KV spaces are jumped over, not read), and stops after `batch` list
calls; the next pass goes on from where it stopped, so every pass is bounded
and every agent is visited in turn. Every action is idempotent or
conditional, so several replicas may sweep at once.

A tenant or agent segment over 256 encoded bytes is stored hashed, so the walk
cannot read its name back from the key. Archives and commit markers are swept
by key prefix (they need no name); an idle session takes its agent from its
session id, and its tenant from the tenants the server knows (`tenants`: the
identity files' and the default one). The tombstone records the tenant for the
janitor, so a hashed tenant the server no longer knows keeps its idle
sessions (counted as waiting).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from urllib.parse import unquote

from fencepost.keys import encode_segment

from ..storage import Storage
from ..storage.base import prefix_end
from .errors import DomainError
from .journal import Journal
from .ledger import Ledger
from .ledger.layout import LeaseState
from .throttled_log import ThrottledWarning

log = logging.getLogger("fencepost.retention")

_END = "\U0010ffff"
_AGENT_DEPTH = 5  # {tenant}/sys/agentkit/v1/{agent}/


@dataclass(frozen=True)
class RetentionConfig:
    idle_session_seconds: float = 0.0  # 0 = keep forever
    archive_seconds: float = 0.0
    commit_marker_seconds: float = 0.0
    batch: int = 1000  # list calls per pass
    interval: float = 60.0

    @property
    def enabled(self) -> bool:
        return self.idle_session_seconds > 0 or self.archive_seconds > 0 or self.commit_marker_seconds > 0


@dataclass
class RetentionCounts:
    sessions_erased: int = 0
    sessions_waiting: int = 0  # idle, but with live forks, pending events or a live lease
    archives_erased: int = 0
    commit_markers_erased: int = 0
    agents_visited: int = 0


class Retention:
    def __init__(
        self,
        storage: Storage,
        ledger: Ledger,
        journal: Journal,
        config: RetentionConfig,
        clock: Callable[[], float] = time.time,
        events: Callable[..., None] | None = None,
        tenants: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.storage = storage
        self.ledger = ledger
        self.journal = journal
        self.config = config
        self.clock = clock
        self.events: Callable[..., None] = events or (lambda name, value=1.0: None)
        self.cursor: str | None = None  # where the walk goes on (per process: passes are idempotent)
        self.tenants = tenants  # the tenant names the server serves (a hashed segment's name)
        self._hashed: dict[str, str] | None = None  # hashed segment -> tenant, built once per pass
        self._idle_after: dict[str, str] = {}  # agent prefix -> where its idle sessions go on next visit

    async def run(self) -> None:
        warning = ThrottledWarning(log, "retention pass")
        while True:
            try:
                summary = describe(await self.sweep_pass())
                if summary:
                    log.info("retention pass: %s", summary)
                warning.ok()
            except Exception as exc:  # an outage: try again next pass
                warning.failed(exc)
            await asyncio.sleep(self.config.interval)

    async def sweep_pass(self) -> RetentionCounts:
        """One bounded pass; returns what it swept."""
        counts = RetentionCounts()
        if not self.config.enabled:
            return counts
        budget = self.config.batch
        self._hashed = None  # the identity files may have been reloaded since the last pass
        while budget > 0:
            keys = await self.storage.list_keys("", self.cursor, 1)
            budget -= 1
            if not keys:
                self.cursor = None  # the walk wrapped: the next pass starts over
                break
            key = keys[0]
            segments = key.split("/")
            if len(segments) > _AGENT_DEPTH and segments[1:4] == ["sys", "agentkit", "v1"]:
                prefix = "/".join(segments[:_AGENT_DEPTH]) + "/"
                budget -= await self._agent(prefix, segments[0], counts)
                self.cursor = prefix + _END
            else:
                self.cursor = _skip(segments, key)
        for f in fields(counts):
            value = getattr(counts, f.name)
            if value and f.name != "agents_visited":
                self.events(f"retention.{f.name}", value)
        return counts

    async def _agent(self, prefix: str, tenant_segment: str, counts: RetentionCounts) -> int:
        """Sweep the agent whose keys start with `prefix` (`{tenant}/sys/agentkit/v1/{agent}/`,
        as stored); returns the list calls it spent (roughly)."""
        now, spent = self.clock(), 1
        counts.agents_visited += 1
        c = self.config
        root = prefix + "durable-session/"
        if c.idle_session_seconds > 0:
            before = now - c.idle_session_seconds
            tenant = self._tenant(tenant_segment)
            # a page at a time, going on where the last visit stopped: sessions
            # that wait (first in the index) never hide the idle ones behind them
            sids, resume = await self.ledger.idle_sessions_page(root, before, self._idle_after.pop(root, None))
            if resume is not None:
                self._idle_after[root] = resume
            for sid in sids:
                spent += 1
                if tenant is not None and await self._erase_idle(tenant, root, sid, now, before):
                    counts.sessions_erased += 1
                else:
                    counts.sessions_waiting += 1
        if c.archive_seconds > 0:
            counts.archives_erased += await self.journal.expire_archives_under(
                prefix, int((now - c.archive_seconds) * 1000)
            )
            spent += 1
        if c.commit_marker_seconds > 0:
            erased, calls = await self._expire_markers(root, now - c.commit_marker_seconds)
            counts.commit_markers_erased += erased
            spent += calls
        return spent

    def _tenant(self, segment: str) -> str | None:
        """The tenant stored under `segment`; None for a hashed one the server does not know."""
        if not segment.startswith("sha256:"):
            return unquote(segment)
        if self._hashed is None:
            self._hashed = {encode_segment(t): t for t in self.tenants()}
        return self._hashed.get(segment)

    async def _erase_idle(self, tenant: str, root: str, sid: str, now: float, before: float) -> bool:
        try:
            sk = self.ledger.keys(tenant, sid)  # the agent: from the session id
        except DomainError:
            return False  # not a session id: a stray key, left alone
        if sk.root != root:
            return False  # an id naming another agent: a stray key, left alone
        # read before the checks: the delete applies only if no grant, no renewal
        # and no commit moved them since (a holder taking the session up meanwhile
        # keeps it; a renewal of an expired lease moves the lease, not the generation)
        gen, head = await asyncio.gather(self.storage.get(sk.gen), self.storage.get(sk.head))
        if gen is None or head is None:
            return False  # gone meanwhile
        lease = await self.storage.get(sk.lease)
        if lease is not None and LeaseState.decode(lease.value).live(now):
            return False  # held: not idle whatever its last commit says
        act = await self.ledger.settled_activity(sk)
        if act is not None and act.last_micros >= before * 1e6:
            return False  # its index entry lagged a commit (now settled): not idle
        try:
            seen = {sk.gen: gen.version, sk.head: head.version, sk.lease: lease.version if lease else ""}
            await self.ledger.delete_session(tenant, sid, unchanged=seen)
            return True
        except DomainError:  # live forks, pending events, gone meanwhile, contended: next pass
            return False

    async def _expire_markers(self, root: str, before: float) -> tuple[int, int]:
        """Commit markers older than `before` of every session under `root` (by key: no names needed)."""
        sessions = root + "s/"
        erased, calls, start = 0, 0, None
        while True:
            found = await self.storage.list_keys(sessions, start, 1)
            calls += 1
            if not found:
                return erased, calls
            sid = found[0][len(sessions):].split("/", 1)[0]
            markers = f"{sessions}{sid}/cm/"
            after = None
            while True:
                items = await self.storage.list(markers, after, 1000)
                calls += 1
                for it in items:
                    t = json.loads(it.value).get("t")
                    if t is not None and t < before:  # markers from before "t" was kept stay
                        await self.storage.delete(it.key)
                        erased += 1
                if len(items) < 1000:
                    break
                after = items[-1].key
            start = f"{sessions}{sid}/{_END}"


def describe(counts: RetentionCounts) -> str:
    """What a pass did, for the server log ("" when it changed nothing)."""
    done = [f"{n} {what}" for n, what in (
        (counts.sessions_erased, "idle sessions erased"),
        (counts.archives_erased, "journal archives deleted"),
        (counts.commit_markers_erased, "commit markers deleted"),
    ) if n]
    if not done:
        return ""
    if counts.sessions_waiting:
        done.append(f"{counts.sessions_waiting} idle sessions wait (a live lease, live forks or pending events)")
    return ", ".join(done)


def _skip(segments: list[str], key: str) -> str:
    """start_after past the subtree of `key` that holds no agent."""
    if key.startswith("#/"):
        return "#/" + _END
    if len(segments) >= 3 and segments[1] == "sys":
        if segments[2] == "agentkit":
            return key  # an agentkit key too short to name an agent: step past it
        return "/".join(segments[:3]) + "/" + _END  # another subsystem: agentkit may follow
    if len(segments) >= 2:
        # a KV key is the caller's text and may itself start with _END: past the
        # whole subtree (only the one key equal to the bound, no agent's, is passed over)
        return prefix_end("/".join(segments[:2]) + "/") or key
    return key
