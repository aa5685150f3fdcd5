"""Forks, and reading a log whose prefix may belong to ancestors.

A child stores only its own records (seq > seed_length); the records
1..seed_length are read from the parent (recursively, for forks of forks).
Records are immutable once committed, so the parent may keep committing
without affecting any child.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fencepost import reasons

from ...storage import Check, Expect, Put
from ..errors import NotFound
from ..paging import ENTRY_OVERHEAD, split_by_bytes
from .activity import Activity
from .core import SessionView, bad
from .erasing import creation_checks, refusal
from .layout import NO_LEASE, Meta, SessionKeys, identity_key, new_session_id, parse_seq, session_not_found
from .listing import ListingMethods
from .sessions import AlreadyExists, check_name

Page = list[tuple[int, bytes]]


def _record_bytes(record: tuple[int, bytes]) -> int:
    return len(record[1]) + ENTRY_OVERHEAD


class ForkMethods(ListingMethods):
    async def fork(self, tenant: str, parent_sid: str, at_seq: int, child_key: str) -> SessionView:
        """A child whose log is the parent's 1..at_seq (shared) then its own."""
        check_name(child_key, "child_session_key")
        self._check_key_size(child_key, "child_session_key")
        parent = self.keys(tenant, parent_sid)
        meta_i, head_i, act_i = await asyncio.gather(
            self.storage.get(parent.meta), self.storage.get(parent.head), self.storage.get(parent.act),
        )
        if meta_i is None or head_i is None:
            raise session_not_found(parent_sid)
        head = parse_seq(head_i.value)
        if not 0 <= at_seq <= head:
            raise bad("at_seq", f"at_seq {at_seq} is outside the parent's log 0..{head}")
        agent = parent.agent
        idkey = identity_key(tenant, agent, child_key)
        existing = await self._sid_for(tenant, agent, child_key)
        if existing is None:
            sid = new_session_id(agent)
            sk = SessionKeys(tenant, sid, agent)
            meta = Meta(sid, agent, child_key, self.clock(), parent_sid, at_seq, {})
            # The child's log bytes are the parent's at at_seq: known when the fork is at the head.
            parent_act = Activity.decode(act_i.value) if act_i is not None else None
            size = parent_act.head_size if parent_act is not None and parent_act.head_seq == at_seq else None
            created, act = self._create_writes(sk, meta, idkey, at_seq, size)
            # the parent must still exist (a DeleteSession tombstone removes its head),
            # and its forks marker moves, so a delete deciding meanwhile sees this fork;
            # no erasure of the agent or tenant may be running (erasing.py). Only the
            # marker's version matters: its value names no one, or it would outlive
            # a deleted fork in its parent
            writes = [*created, Put(parent.forks, b""), Put(parent.fork_entry(sid), b"")]
            checks = [Check(parent.head, Expect(exists=True)), *creation_checks(tenant, agent, child_key)]
            res = await self.storage.transact(checks, writes)
            if res.applied:
                self._identities.put(idkey, sid)
                self.remember_activity(sk, act)
                return self._view(meta, at_seq, NO_LEASE, 0)
            if 0 in res.failed:
                raise session_not_found(parent_sid)
            refused = refusal(res, 1)
            if refused is not None:
                raise refused
            existing = await self._sid_for(tenant, agent, child_key)
        try:
            view = await self.get(tenant, existing or "")
        except NotFound:  # a cached identity of a session deleted since (the store has none)
            self.forget_identity(tenant, agent, child_key)
            return await self.fork(tenant, parent_sid, at_seq, child_key)
        if view.parent == parent_sid and view.seed_length == at_seq:
            return view  # a retried fork
        raise AlreadyExists(
            reasons.FIELD_INVALID, f"child_session_key {child_key!r} already names another session",
            {"session_id": view.session_id}, field="child_session_key",
        )

    async def log_pages(
        self, tenant: str, sid: str, from_seq: int = 1, upto: int | None = None
    ) -> AsyncIterator[Page]:
        """(seq, data) pages in seq order, one backend list call per page, from
        `from_seq` to `upto` (inclusive; None = the head), fork prefix included."""
        from_seq = max(from_seq, 1)
        sk = self.keys(tenant, sid)
        meta = await self.read_meta(sk)
        if meta.parent and from_seq <= meta.seed_length:
            stop = meta.seed_length if upto is None else min(upto, meta.seed_length)
            try:
                async for page in self.log_pages(tenant, meta.parent, from_seq, stop):
                    yield page
            except NotFound:  # an ancestor goes only after its forks (erase.py): so has this one
                raise session_not_found(sid) from None
            from_seq = meta.seed_length + 1
        if upto is not None and from_seq > upto:
            return
        start = sk.log_key(from_seq - 1)
        n = self.config.read_page
        while True:
            items = await self.storage.list(sk.log, start, n)
            page = [(int(it.key[len(sk.log):]), it.value) for it in items]
            if upto is not None:
                page = [p for p in page if p[0] <= upto]
            if page:
                yield page
            if len(items) < n or (upto is not None and page and page[-1][0] >= upto) or not page:
                return
            start = items[-1].key

    async def read_log(
        self, tenant: str, sid: str, from_seq: int = 1, limit: int = 0
    ) -> AsyncIterator[Page]:
        if from_seq < 0:
            raise bad("from_seq", "from_seq must not be negative")
        if limit < 0:
            raise bad("limit", "limit must not be negative")
        left = limit or None
        head = self.keys(tenant, sid).head
        async for page in self.log_pages(tenant, sid, from_seq):
            # listed before this check: a page is returned only if the session was
            # not deleted when it was read (and a live fork's ancestors are live)
            if await self.storage.get(head) is None:
                raise session_not_found(sid)
            if left is not None:
                page = page[:left]
                left -= len(page)
            # one response message each: a page of large records (1000 of up to
            # 256 KiB) would outgrow the server's message limit
            for part in split_by_bytes(page, _record_bytes, self.limits.max_page_bytes):
                yield list(part)
            if left is not None and left <= 0:
                return
        if await self.storage.get(head) is None:
            raise session_not_found(sid)  # the end seen may be the sweep's doing, not the log's
