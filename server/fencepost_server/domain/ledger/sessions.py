"""Session identity (open / resolve / get), forks, and the restore listing."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from fencepost import reasons

from ...storage import Check, Expect, Item, Put, Write
from ..errors import Code, DomainError, NotFound
from ..paging import page_size
from .core import LedgerBase, SessionView, bad
from .layout import (
    NO_LEASE,
    LeaseState,
    Meta,
    SessionKeys,
    agent_root,
    dumps,
    identity_key,
    new_session_id,
    parse_seq,
    seq_value,
    session_not_found,
)

DEFAULT_MAX_SESSIONS = 1000
DEFAULT_MAX_AGE = 30 * 86400.0
DEFAULT_MAX_BYTES = 1 << 30


class AlreadyExists(DomainError):
    code = Code.ALREADY_EXISTS


@dataclass(frozen=True, slots=True)
class SessionSummary:
    session_id: str
    session_key: str
    seq: int
    last_activity: float
    total_bytes: int


def check_name(value: str, field_name: str) -> None:
    if not value:
        raise bad(field_name, f"{field_name} must not be empty")
    if "\x00" in value:
        raise bad(field_name, f"{field_name} must not contain NUL")


class SessionMethods(LedgerBase):
    def _create_writes(self, sk: SessionKeys, meta: Meta, idkey: str, seq: int) -> list[Write]:
        now = meta.created
        return [
            Put(idkey, sk.sid.encode(), Expect(exists=False)),
            Put(sk.meta, meta.encode(), Expect(exists=False)),
            Put(sk.gen, NO_LEASE.fence()),
            Put(sk.lease, NO_LEASE.encode()),
            Put(sk.head, seq_value(seq)),
            Put(sk.act, dumps({"t": now, "s": seq})),
        ]

    async def listing_keys(self, sk: SessionKeys) -> list[str]:
        """Every key the restore listing (ListSessions) keeps for one session.
        Erasure deletes exactly these (in the tombstone and again in the sweep),
        so a change of the listing's layout only has to change this."""
        return [sk.act]

    async def idle_sessions(self, tenant: str, agent: str, before: float, limit: int = 1000) -> list[str]:
        """Up to `limit` sessions of the agent whose last activity is older than
        `before` (retention). Reads the restore listing's activity items: a
        change of the listing's layout only has to change this and `listing_keys`."""
        prefix = agent_root(tenant, agent) + "act/"
        out: list[str] = []
        start = None
        while len(out) < limit:
            items = await self.storage.list(prefix, start, 1000)
            out += [it.key[len(prefix):] for it in items if json.loads(it.value)["t"] < before]
            if len(items) < 1000:
                break
            start = items[-1].key
        return out[:limit]

    def forget_identity(self, tenant: str, agent: str, session_key: str) -> None:
        """Drop a cached identity that named a session since deleted (another
        replica deleted it; identities are otherwise immutable)."""
        self._identities.drop(identity_key(tenant, agent, session_key))

    async def _sid_for(self, tenant: str, agent: str, session_key: str) -> str | None:
        idkey = identity_key(tenant, agent, session_key)
        sid = self._identities.get(idkey)
        if sid is None:
            item = await self.storage.get(idkey)  # an outage raises: never a miss
            if item is None:
                return None
            sid = item.value.decode()
            self._identities.put(idkey, sid)
        return sid  # type: ignore[return-value]

    async def open(
        self, tenant: str, agent: str, session_key: str, metadata: dict[str, str] | None = None
    ) -> tuple[SessionView, bool]:
        """Create-or-get. Concurrent opens agree: the identity is put-if-absent."""
        sid, created = await self.open_id(tenant, agent, session_key, metadata)
        if created is not None:
            return created, True
        try:
            return await self.get(tenant, sid), False
        except NotFound:  # the session was deleted: the key opens a new one
            self.forget_identity(tenant, agent, session_key)
            sid, created = await self.open_id(tenant, agent, session_key, metadata)
            if created is not None:
                return created, True
            return await self.get(tenant, sid), False

    async def open_id(
        self, tenant: str, agent: str, session_key: str, metadata: dict[str, str] | None = None
    ) -> tuple[str, SessionView | None]:
        """The session id; with the new session's view when this call created it."""
        check_name(agent, "agent")
        check_name(session_key, "session_key")
        sid = await self._sid_for(tenant, agent, session_key)
        if sid is not None:
            return sid, None
        idkey = identity_key(tenant, agent, session_key)
        sid = new_session_id(agent)
        sk = SessionKeys(tenant, sid, agent)
        meta = Meta(sid, agent, session_key, self.clock(), "", 0, dict(metadata or {}))
        res = await self.storage.transact((), self._create_writes(sk, meta, idkey, 0))
        if not res.applied:
            other = await self._sid_for(tenant, agent, session_key)
            if other is None:  # the identity vanished again: impossible without deletes
                raise session_not_found(session_key)
            return other, None
        self._identities.put(idkey, sid)
        self.remember_lease(sk.lease, Item(sk.lease, NO_LEASE.encode(), res.versions[3] or ""))
        return sid, self._view(meta, 0, NO_LEASE, 0, meta.created)

    def _view(self, meta: Meta, seq: int, lease: LeaseState, pending: int, activity: float) -> SessionView:
        return SessionView(
            meta.sid, meta.agent, meta.key, seq, lease, pending, meta.parent, meta.seed_length,
            meta.created, activity, meta.metadata,
        )

    async def resolve(self, tenant: str, agent: str, session_key: str) -> SessionView:
        check_name(agent, "agent")
        check_name(session_key, "session_key")
        for attempt in range(2):
            sid = await self._sid_for(tenant, agent, session_key)
            if sid is not None:
                try:
                    return await self.get(tenant, sid)
                except NotFound:
                    if attempt:
                        raise
                    self.forget_identity(tenant, agent, session_key)  # cached, since deleted
        raise NotFound(
            reasons.SESSION_NOT_FOUND, f"no session for key {session_key!r}",
            {"agent": agent, "session_key": session_key},
        )

    async def get(self, tenant: str, sid: str) -> SessionView:
        sk = self.keys(tenant, sid)
        meta_i, head_i, lease_i, act_i, pending = await asyncio.gather(
            self.storage.get(sk.meta), self.storage.get(sk.head), self.storage.get(sk.lease),
            self.storage.get(sk.act), self.count_inbox(sk),
        )
        if meta_i is None or head_i is None or lease_i is None:
            raise session_not_found(sid)
        self.remember_lease(sk.lease, lease_i)
        meta = Meta.decode(meta_i.value)
        activity = json.loads(act_i.value)["t"] if act_i is not None else meta.created
        return self._view(meta, parse_seq(head_i.value), LeaseState.decode(lease_i.value), pending, activity)

    # -- restore listing ------------------------------------------------------------
    async def session_bytes(self, tenant: str, sid: str, head: int) -> int:
        """Bytes of the session's log (fork prefix included). Records are
        immutable, so a cached (seq, bytes) pair stays true forever; only the
        records committed since are read."""
        sk = self.keys(tenant, sid)
        item = await self.storage.get(sk.size)
        upto, total = 0, 0
        if item is not None:
            cached = json.loads(item.value)
            upto, total = int(cached["s"]), int(cached["b"])
        if upto >= head:
            return total
        async for page in self.log_pages(tenant, sid, upto + 1, head):  # type: ignore[attr-defined]
            total += sum(len(data) for _, data in page)
        # conditional: a session deleted meanwhile must not get an item back
        await self.storage.transact([Check(sk.head, Expect(exists=True))], [Put(sk.size, dumps({"s": head, "b": total}))])
        return total

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
        binds (across pages). Scans the agent's activity items (one prefix)."""
        check_name(agent, "agent")
        limit = page_size(self.limits, size)
        max_sessions = max_sessions if max_sessions > 0 else DEFAULT_MAX_SESSIONS
        max_age = max_age if max_age > 0 else DEFAULT_MAX_AGE
        max_total_bytes = max_total_bytes if max_total_bytes > 0 else DEFAULT_MAX_BYTES
        listing = ("ledger.list_sessions", agent, max_sessions, max_age, max_total_bytes)
        resume = await self.pages.resume(tenant, listing, token)
        count, used, after = 0, 0, None
        if resume is not None:
            count, used, t, s = json.loads(resume)
            after = (float(t), str(s))
        cutoff = self.clock() - max_age
        prefix = agent_root(tenant, agent) + "act/"
        acts: list[tuple[float, str, int]] = []
        start = None
        while True:
            items = await self.storage.list(prefix, start, 1000)
            for it in items:
                d = json.loads(it.value)
                if d["t"] >= cutoff:
                    acts.append((float(d["t"]), it.key[len(prefix):], int(d["s"])))
            if len(items) < 1000:
                break
            start = items[-1].key
        acts.sort(key=lambda a: (a[0], a[1]), reverse=True)
        if after is not None:
            acts = [a for a in acts if (a[0], a[1]) < after]
        out: list[SessionSummary] = []
        for t, sid, seq in acts:
            if count >= max_sessions or len(out) >= limit:
                break
            try:
                nbytes = await self.session_bytes(tenant, sid, seq)
                if used + nbytes > max_total_bytes:
                    return out, ""  # the byte budget binds: the listing ends here
                meta = await self.read_meta(self.keys(tenant, sid))
            except NotFound:
                continue  # deleted since its activity item was listed
            out.append(SessionSummary(sid, meta.key, seq, t, nbytes))
            count, used = count + 1, used + nbytes
        more = count < max_sessions and len(acts) > len(out)
        if not more or not out:
            return out, ""
        last = json.dumps([count, used, out[-1].last_activity, out[-1].session_id])
        return out, await self.pages.issue(tenant, listing, last)

