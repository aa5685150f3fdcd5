"""Session identity (open / resolve / get) and the log's byte size."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from fencepost import reasons

from ...storage import Check, Delete, Expect, Item, Put, Write
from ..errors import Code, DomainError, NotFound, limit_error
from .activity import Activity, ActivityMethods, creation_writes, indexed_key
from .core import SessionView, bad, contended
from .erasing import creation_checks, refusal
from .layout import (
    MAX_AGENT_BYTES,
    NO_LEASE,
    LeaseState,
    Meta,
    SessionKeys,
    dumps,
    identity_key,
    new_session_id,
    parse_seq,
    seq_value,
    session_not_found,
)

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


def check_agent(agent: str) -> None:
    check_name(agent, "agent")
    size = len(agent.encode("utf-8", "surrogatepass"))
    if size > MAX_AGENT_BYTES:
        raise limit_error(reasons.FIELD_INVALID, "agent", MAX_AGENT_BYTES, size, field="agent")


class SessionMethods(ActivityMethods):
    def _create_writes(
        self, sk: SessionKeys, meta: Meta, idkey: str, seq: int, size: int | None
    ) -> tuple[list[Write], bytes]:
        """The creating transaction's writes (the lease item is the fourth),
        and the new act/ value."""
        act = Activity(int(meta.created * 1e6), seq, size, indexed_key(meta.key))
        return [
            Put(idkey, sk.sid.encode(), Expect(exists=False)),
            Put(sk.meta, meta.encode(), Expect(exists=False)),
            Put(sk.gen, NO_LEASE.fence()),
            Put(sk.lease, NO_LEASE.encode()),
            Put(sk.head, seq_value(seq)),
            *creation_writes(sk, act),
        ], act.act_value()

    def _check_key_size(self, key: str, field: str) -> None:
        """A session key is at most a key long (it is kept in the session's items)."""
        key_size = len(key.encode())
        if key_size > self.limits.max_key_bytes:
            raise limit_error(reasons.FIELD_INVALID, field, self.limits.max_key_bytes, key_size, field=field)

    def _check_meta_size(self, meta: Meta) -> None:
        """The session's record (its key, agent and metadata) must fit a value."""
        self._check_key_size(meta.key, "session_key")
        size = len(meta.encode())
        if size > self.limits.max_value_bytes:
            raise limit_error(reasons.FIELD_INVALID, "the session's metadata", self.limits.max_value_bytes, size,
                              field="metadata")

    async def listing_keys(self, sk: SessionKeys) -> list[str]:
        """Every key the restore listing (ListSessions) keeps for one session:
        act/{sid} and its activity-index entries, derived from act/ (activity.py).
        Erasure deletes exactly these, so a change of the listing's layout only
        has to change this and `listing_deletes`."""
        item = await self.storage.get(sk.act)
        return [sk.act] if item is None else [sk.act, *sk.listing_keys(item.value)]

    async def listing_deletes(self, sk: SessionKeys) -> list[Write]:
        """The tombstone's deletes of the listing keys. act/ is deleted only if it
        still holds the value the entries were derived from: a commit landing
        in between fails the tombstone (which decides again) instead of
        leaving an index entry behind."""
        for _attempt in range(8):  # a commit moving act/ under the trim: read it again
            item = await self.storage.get(sk.act)
            if item is None:
                return [Delete(sk.act)]
            value = await self.trim_kept(sk, item.value)
            if value is not None:
                return [Delete(sk.act, Expect(value=value)), *(Delete(k) for k in sk.listing_keys(value))]
        raise contended("DeleteSession")

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
        check_agent(agent)
        check_name(session_key, "session_key")
        sid = await self._sid_for(tenant, agent, session_key)
        if sid is not None:
            return sid, None
        idkey = identity_key(tenant, agent, session_key)
        sid = new_session_id(agent)
        sk = SessionKeys(tenant, sid, agent)
        meta = Meta(sid, agent, session_key, self.clock(), "", 0, dict(metadata or {}))
        self._check_meta_size(meta)
        writes, act = self._create_writes(sk, meta, idkey, 0, 0)
        # no session is created while an erasure of its agent or tenant runs (erasing.py)
        res = await self.storage.transact(creation_checks(tenant, agent, session_key), writes)
        if not res.applied:
            refused = refusal(res, 0)
            if refused is not None:
                raise refused
            other = await self._sid_for(tenant, agent, session_key)
            if other is None:  # the identity vanished again: impossible without deletes
                raise session_not_found(session_key)
            return other, None
        self._identities.put(idkey, sid)
        self.remember_activity(sk, act)
        self.remember_lease(sk.lease, Item(sk.lease, NO_LEASE.encode(), res.versions[3] or ""))
        return sid, self._view(meta, 0, NO_LEASE, 0)

    def _view(
        self, meta: Meta, seq: int, lease: LeaseState, pending: int, activity: float | None = None
    ) -> SessionView:
        # created at the µs precision activity times are kept at (act/ "u"), so a
        # session's last activity (None: its creation) is never before it
        created = int(meta.created * 1e6) / 1e6
        return SessionView(
            meta.sid, meta.agent, meta.key, seq, lease, pending, meta.parent, meta.seed_length,
            created, created if activity is None else activity, meta.metadata,
        )

    async def resolve(self, tenant: str, agent: str, session_key: str) -> SessionView:
        check_agent(agent)
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
        activity: float | None = None
        if act_i is not None:
            self.remember_activity(sk, act_i.value)
            act = Activity.decode(act_i.value)
            activity = json.loads(act_i.value)["t"]
            if act.owed is not None:  # a commit's index entries still owed (activity.py)
                activity = act.last_micros / 1e6
                await self.settle_quietly(sk, act_i.value)
        return self._view(meta, parse_seq(head_i.value), LeaseState.decode(lease_i.value), pending, activity)

    # -- sizes ----------------------------------------------------------------------
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
