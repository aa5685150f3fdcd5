"""ListSessions: the restore listing, newest activity first, read from the
agent's activity index (activity.py) in work proportional to the page.

A listing is a snapshot at T0, the server's clock when its first page is
read (or the time of the oldest index entry this process is still writing,
when earlier: activity.py, `dating`): each session appears once, at the entry that was current just before
T0 (`u < T0 <= n`), with that entry's seq, size and time. A session that
commits between two pages keeps its T0 entry (superseded entries live for
the listing horizon), so it is neither skipped nor listed twice; one created
after T0 is not listed. The caps apply to that snapshot: `max_age` against
T0, `max_sessions` and `max_total_bytes` carried in the page token with the
position, so they bind exactly across pages. A session whose last commit
filled its transaction (64 records + 32 consumed ids + commit_id, or nearly:
activity.py) may briefly show at its previous entry: that commit's index
entries follow it in a second write; the rules above hold all the same.

Each page lists the index from the token's position: at most
`_SCAN_CALLS` list calls (a page may come back short, with a token, when it
met many superseded entries), plus one transaction deleting superseded
entries older than the horizon. Entries written before the index existed
carry no size or key; those cost a size computation / meta read once per
process (then the session's next commit writes them).

Stores written before the index: the first listing of an agent writes an
index entry for every act/ item that has none (one scan of `act/`, once per
agent), then marks the agent `ix-ready`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from fencepost import reasons

from ...storage import MAX_TXN_OPS, BackendUnavailable, Delete, Expect, PersistenceUncertain, Put, StorageError
from ..errors import InvalidArgument, NotFound
from ..paging import page_size
from .activity import Activity
from .layout import agent_root, index_key, index_prefix, index_ready_key, index_start, parse_index_key
from .core import bad
from .sessions import SessionMethods, SessionSummary, check_agent

DEFAULT_MAX_SESSIONS = 1000
DEFAULT_MAX_AGE = 30 * 86400.0
DEFAULT_MAX_BYTES = 1 << 30

_SCAN_CALLS = 4  # index list calls per page at most
_MIGRATE_BATCH = 1000
_SWEEP_MAX = 90  # superseded entries deleted per page (one transaction)


#: An entry's `n` without parsing it: in canonical JSON (sorted keys, ASCII,
#: every quote inside a string escaped) `"n":` can only be that key.
_SUPERSEDED = re.compile(rb'"n":(\d+)')


def _superseded_at(value: bytes) -> int | None:
    found = _SUPERSEDED.search(value)
    return int(found.group(1)) if found else None


@dataclass
class _Position:
    t0: int  # µs: the snapshot time
    after: str  # the last index key examined ("" = from T0)
    count: int = 0
    used: int = 0


T = TypeVar("T")


async def _as_read(call: Awaitable[T]) -> T:
    """A listing's own bookkeeping write (the index, a size cache) of unknown
    outcome fails the listing as a read fails, to be listed again; never as
    PERSISTENCE_UNCERTAIN: the caller wrote nothing."""
    try:
        return await call
    except PersistenceUncertain as exc:
        raise BackendUnavailable(f"listing sessions: {exc}; list again") from exc


class ListingMethods(SessionMethods):
    async def list_sessions(
        self,
        tenant: str,
        agent: str,
        max_sessions: int = 0,
        max_age: float = 0.0,
        max_total_bytes: int = 0,
        size: int = 0,
        token: str = "",
    ) -> tuple[list[SessionSummary], str]:
        """Newest activity first, until max_sessions, max_age or max_total_bytes
        binds (exactly, across pages)."""
        check_agent(agent)
        limit = page_size(self.limits, size)
        for name, cap in (("max_sessions", max_sessions), ("max_age", max_age), ("max_total_bytes", max_total_bytes)):
            if cap < 0:
                raise bad(name, f"{name} must not be negative (got {cap}); 0 means the default")
        max_sessions = max_sessions if max_sessions > 0 else DEFAULT_MAX_SESSIONS
        max_age = max_age if max_age > 0 else DEFAULT_MAX_AGE
        max_total_bytes = max_total_bytes if max_total_bytes > 0 else DEFAULT_MAX_BYTES
        listing = ("ledger.list_sessions", agent, max_sessions, max_age, max_total_bytes)
        resume = await self.pages.resume(tenant, listing, token)
        now = int(self.clock() * 1e6)
        horizon = now - int(self.config.listing_horizon * 1e6)
        if resume is None:
            pos = _Position(self.snapshot_time(now), "")
        else:
            count, used, t0, after = json.loads(resume)
            pos = _Position(int(t0), str(after), int(count), int(used))
            if pos.t0 <= horizon:
                # The snapshot's superseded entries may be swept by now: resuming
                # would silently skip the sessions that moved since its first page.
                raise InvalidArgument(
                    reasons.PAGE_TOKEN_INVALID,
                    f"page_token is of a listing started over {self.config.listing_horizon:g} s ago, "
                    "longer than its snapshot is kept; restart the listing without a token",
                    {"listing_horizon_seconds": f"{self.config.listing_horizon:g}"}, field="page_token",
                )
        root = agent_root(tenant, agent)
        await _as_read(self._ensure_index(root))
        prefix = index_prefix(root)
        cutoff = pos.t0 - int(max_age * 1e6)
        start = prefix + pos.after if pos.after else index_start(prefix, pos.t0 - 1)
        batch = min(1000, 3 * limit + 16)  # room for superseded entries between live ones
        out: list[SessionSummary] = []
        sweep: list[tuple[str, str]] = []
        try:
            for _ in range(_SCAN_CALLS):
                items = await self.storage.list(prefix, start, batch)
                for it in items:
                    start = it.key  # examined: the next page resumes after it
                    micros, sid = parse_index_key(prefix, it.key)
                    if micros < cutoff:
                        return out, ""  # everything further is older than max_age
                    superseded = _superseded_at(it.value)
                    if superseded is not None and superseded < pos.t0:
                        if superseded <= horizon and len(sweep) < _SWEEP_MAX:
                            sweep.append((it.key, it.version))
                        continue  # not this snapshot's entry of the session
                    entry = json.loads(it.value)
                    if pos.count >= max_sessions:
                        return out, ""
                    try:
                        summary = await _as_read(self._summary(tenant, sid, micros, entry))
                    except NotFound:
                        continue  # deleted since (an entry written before the index)
                    if pos.used + summary.total_bytes > max_total_bytes:
                        return out, ""  # the byte budget binds: the listing ends here
                    out.append(summary)
                    pos.count, pos.used = pos.count + 1, pos.used + summary.total_bytes
                    if len(out) >= limit:
                        break
                exhausted = len(items) < batch and (not items or start == items[-1].key)
                if exhausted or pos.count >= max_sessions:
                    return out, ""
                if len(out) >= limit:
                    break
        finally:
            await self._sweep(sweep)
        pos.after = start[len(prefix):]
        return out, await self.pages.issue(tenant, listing, json.dumps([pos.count, pos.used, pos.t0, pos.after]))

    async def idle_sessions(self, tenant: str, agent: str, before: float, limit: int = 1000) -> list[str]:
        """Up to `limit` sessions of the agent whose last activity is older than
        `before` (retention): the current entries of the index below `before`,
        so a pass reads the idle sessions (and superseded entries among them),
        not every session. Read-only: an agent whose index is not known to be
        complete (no listing since the upgrade) is read from its act/ items."""
        return await self.idle_sessions_under(agent_root(tenant, agent), before, limit)

    async def idle_sessions_under(self, root: str, before: float, limit: int = 1000) -> list[str]:
        """idle_sessions by the agent's stored ledger prefix (`.../durable-session/`):
        retention walks keys, and a hashed segment has no name to pass (a session
        id names its agent, so the caller needs none)."""
        return (await self.idle_sessions_page(root, before, None, limit))[0]

    async def idle_sessions_page(
        self, root: str, before: float, after: str | None = None, limit: int = 1000
    ) -> tuple[list[str], str | None]:
        """idle_sessions_under from `after` (a key this returned), and where the
        next page starts (None: no more). Retention goes on from there on its
        next visit, so idle sessions that must wait never hide the ones behind them."""
        indexed = bool(self._indexed.get(root)) or await self.storage.get(index_ready_key(root)) is not None
        prefix = index_prefix(root) if indexed else root + "act/"
        start = index_start(prefix, int(before * 1e6) - 1) if indexed else None
        if after is not None and after.startswith(prefix) and (start is None or after > start):
            start = after
        found: list[tuple[str, str]] = []  # (key, session id)
        while len(found) < limit:
            items = await self.storage.list(prefix, start, 1000)
            if indexed:
                found += [(it.key, parse_index_key(prefix, it.key)[1])
                          for it in items if _superseded_at(it.value) is None]
            else:
                found += [(it.key, it.key[len(prefix):]) for it in items if json.loads(it.value)["t"] < before]
            if len(items) < 1000:
                return [sid for _, sid in found[:limit]], found[limit - 1][0] if len(found) > limit else None
            start = items[-1].key
        return [sid for _, sid in found[:limit]], found[limit - 1][0]

    async def _summary(self, tenant: str, sid: str, micros: int, entry: dict[str, object]) -> SessionSummary:
        seq = int(entry["s"])  # type: ignore[call-overload]
        size = entry.get("b")
        key = entry.get("k")
        if size is None:  # written before the index (or a fresh fork): computed once
            size = await self.session_bytes(tenant, sid, seq)
        if key is None:
            key = (await self.read_meta(self.keys(tenant, sid))).key
        return SessionSummary(sid, str(key), seq, micros / 1e6, int(size))  # type: ignore[call-overload]

    async def _sweep(self, entries: list[tuple[str, str]]) -> None:
        """Delete superseded entries past the horizon, each only if unchanged.
        Best effort: whatever stays is skipped by every later listing."""
        if not entries:
            return
        deletes = [Delete(key, Expect(version=version)) for key, version in entries]
        try:
            await self.storage.transact((), deletes)
        except StorageError:  # an outage: the next listing sweeps them
            pass

    # -- stores written before the index ---------------------------------------------
    async def _ensure_index(self, root: str) -> None:
        """Give every act/ item written before the index its entry (once per agent)."""
        if self._indexed.get(root):
            return
        marker = index_ready_key(root)
        if await self.storage.get(marker) is None:
            await self._backfill(root)
            await self.storage.put(marker, b"1")
        self._indexed.put(root, True)

    async def _backfill(self, root: str) -> None:
        prefix, index = root + "act/", index_prefix(root)
        start = None
        while True:
            items = await self.storage.list(prefix, start, _MIGRATE_BATCH)
            puts = []
            for it in items:
                if "u" in json.loads(it.value):
                    continue  # written with its index entry
                act = Activity.decode(it.value)
                key = index_key(index, act.micros, it.key[len(prefix):])
                # If absent only: a commit may already have written it as superseded.
                puts.append(Put(key, act.entry_value(), Expect(exists=False)))
            for at in range(0, len(puts), MAX_TXN_OPS):
                chunk = puts[at:at + MAX_TXN_OPS]
                if not (await self.storage.transact((), chunk)).applied:
                    for put in chunk:  # some exist already: one at a time
                        await self.storage.transact((), [put])
            if len(items) < _MIGRATE_BATCH:
                return
            start = items[-1].key
