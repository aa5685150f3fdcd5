"""DeleteSession: fence with one conditional write, then sweep in batches.

The tombstone is ONE transaction, the point of no return:

    put    gen   := erased(G + 1)   if gen == the value read (a grant meanwhile retries)
    delete meta, head, lease        (every read and fenced write misses from here on)
    delete id/{key}                 if it still names this session (a new open makes a new id)
    delete the listing keys         (ListSessions stops showing it)
    put    #/ledger/erase/...       the sweep's to-do entry (tenant, parent, key)
    + the pending proof             (no event parked since the inbox was seen empty)
    + the fork proof                (no fork made since the forks were seen dead)

A Deliver checks `head` exists in its own transaction and a fork checks the
parent's `head`, so nothing parks and nothing forks after the tombstone; a
commit, renew, release or grant conditions on `gen`, so a paused holder's
next write fails. The sweep then deletes every remaining key of the session
(`s/{sid}/...`, blobs, pending entry, the parent's fork entry, listing keys)
in batches and removes the to-do entry last: it is idempotent, so a crash
mid-way only leaves work the janitor (any replica) finishes, and several
sweepers at once merely delete the same keys twice.

Forks read their parent's records. A parent is tombstoned only once every
fork is (checked between reading the parent's `forks` marker and the
tombstone, which conditions on that marker's version), so a live session's
ancestors are always live; ReadLog re-checks the session after every page,
so no page read after the tombstone is returned.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from fencepost import reasons

from ...storage import Check, Delete, Expect, Put, Write
from ..errors import FailedPrecondition, NotFound
from ..prefix import delete_prefix
from .core import contended
from .layout import (
    Meta,
    SessionKeys,
    dumps,
    erased_value,
    identity_key,
    is_erased,
    parse_gen,
    session_not_found,
)
from .sessions import SessionMethods

_ATTEMPTS = 8
_LIST = 1000


@dataclass(frozen=True, slots=True)
class EraseResult:
    session_ids: tuple[str, ...]  # every session deleted (descendants before their parent)
    items: int  # stored items the sweep removed


class EraseMethods(SessionMethods):
    async def delete_session(
        self, tenant: str, sid: str, *, force: bool = False, descendants: bool = False,
        unchanged: dict[str, str] | None = None,
    ) -> EraseResult:
        """Tombstone the session (and its forks first when `descendants`),
        then sweep each. A session already tombstoned but not yet swept is
        swept again (a retried delete succeeds); one fully gone is
        SESSION_NOT_FOUND. `unchanged` (key -> version, of the session's `gen`
        and `head`, and of its `lease`, "" when there was none): delete only if
        none moved since the caller read them (retention decided on them), else
        TXN_CONTENDED and nothing is done."""
        doomed = await self.tombstone(tenant, sid, force=force, descendants=descendants, unchanged=unchanged)
        removed = 0
        for each in doomed:
            removed += await self.sweep_session(tenant, each)
        return EraseResult(tuple(doomed), removed)

    async def tombstone(
        self, tenant: str, sid: str, *, force: bool = False, descendants: bool = False,
        unchanged: dict[str, str] | None = None,
    ) -> list[str]:
        """DeleteSession's point of no return alone (the sweep follows): every
        session tombstoned, descendants first. An already tombstoned session
        is listed again (its sweep may not have run)."""
        out: list[str] = []
        if not force and descendants:
            # every tombstone is final: refuse for an event pending anywhere in
            # the tree before the first one, not after the forks already went
            await self._refuse_pending_in_tree(self.keys(tenant, sid))
        await self._tombstone_tree(self.keys(tenant, sid), force, descendants, out, unchanged)
        return out

    async def _refuse_pending_in_tree(self, sk: SessionKeys) -> None:
        """INBOX_NOT_EMPTY if the session or a live descendant has events
        pending. Each tombstone still carries its own proof: an event parked
        after this check refuses at that session's tombstone."""
        if await self.storage.get(sk.pending) is not None:
            pending = await self.count_inbox(sk)
            if pending:
                raise FailedPrecondition(
                    reasons.INBOX_NOT_EMPTY,
                    f"{pending} event(s) are pending in session {sk.sid!r}: drain them, or delete with force",
                    {"pending": pending, "session_id": sk.sid},
                )
        for child in await self.live_forks(sk):
            await self._refuse_pending_in_tree(self.keys(sk.tenant, child))

    async def _tombstone_tree(
        self, sk: SessionKeys, force: bool, descendants: bool, out: list[str],
        unchanged: dict[str, str] | None = None,
    ) -> None:
        for _ in range(_ATTEMPTS):
            meta_i, gen_i, pending_i, forks_i = await asyncio.gather(
                self.storage.get(sk.meta), self.storage.get(sk.gen),
                self.storage.get(sk.pending), self.storage.get(sk.forks),
            )
            if meta_i is None or gen_i is None or is_erased(gen_i.value):
                if await self.storage.get(sk.erase) is not None:
                    await self._unswept_forks(sk, out)
                    out.append(sk.sid)  # tombstoned already: sweep it again
                    return
                raise session_not_found(sk.sid)
            if unchanged is not None and unchanged.get(sk.gen) != gen_i.version:
                raise contended("DeleteSession")  # a grant or a release since the caller's decision
            # listed AFTER the forks marker was read: a fork made since moves the marker
            live = await self.live_forks(sk)
            if live:
                if not descendants:
                    raise FailedPrecondition(
                        reasons.SESSION_HAS_FORKS,
                        f"session {sk.sid!r} has {len(live)} live fork(s): delete them first, "
                        "or ask for the descendants to be deleted too",
                        {"session_id": sk.sid, "forks": len(live), "fork_session_ids": ",".join(live[:10])},
                    )
                for child in live:
                    try:
                        await self._tombstone_tree(self.keys(sk.tenant, child), force, True, out)
                    except NotFound:
                        pass  # erased whole by another delete since it was listed live: gone, as asked
                continue  # read the marker again: every fork is tombstoned now
            meta = Meta.decode(meta_i.value)
            checks: list[Check] = [
                Check(sk.forks, Expect(exists=False) if forks_i is None else Expect(version=forks_i.version))
            ]
            # with `unchanged`, a commit since the caller's decision (head moved) fails the
            # tombstone, and so does a renewal (the lease moved, the generation did not)
            head_expect = None if unchanged is None else Expect(version=unchanged.get(sk.head))
            lease_expect = None
            if unchanged is not None and sk.lease in unchanged:
                seen = unchanged[sk.lease]
                lease_expect = Expect(version=seen) if seen else Expect(exists=False)
            writes: list[Write] = [
                Put(sk.gen, erased_value(parse_gen(gen_i.value)[0] + 1), Expect(value=gen_i.value)),
                Delete(sk.meta), Delete(sk.head, head_expect), Delete(sk.lease, lease_expect),
                Delete(identity_key(sk.tenant, sk.agent, meta.key), Expect(value=sk.sid.encode())),
                Put(sk.erase, dumps({"tenant": sk.tenant, "parent": meta.parent, "t": self.clock()})),
            ]
            writes += await self.listing_deletes(sk)
            if force:
                writes.append(Delete(sk.pending))
            else:
                await self.prove_inbox_empty(sk, pending_i, checks, writes, "drain them, or delete with force")
            res = await self.storage.transact(checks, writes)
            if res.applied:
                await self._unswept_forks(sk, out)
                self._identities.drop(identity_key(sk.tenant, sk.agent, meta.key))
                self.remember_lease(sk.lease, None)
                self.notify(sk.sid)  # watchers see the tombstone now
                self.events("ledger.sessions_deleted")
                out.append(sk.sid)
                return
            if unchanged is not None:
                raise contended("DeleteSession")  # the caller decides again, on what it reads then
            # a grant, a delivery or a fork raced the tombstone: decide again
        raise contended("DeleteSession")

    async def _unswept_forks(self, sk: SessionKeys, out: list[str]) -> None:
        """Add to `out` (descendants first) the forks tombstoned but not yet
        swept (a DeleteSession cut short between its tombstones and the end
        of its sweeps): a retried delete of the tree sweeps them too, rather
        than leaving them to the janitor. A fork's sweep removes its entry in
        the parent last but one, so an entry whose fork has no head names one."""
        for child in await self._fork_entries(sk):
            if child in out:
                continue
            ck = self.keys(sk.tenant, child)
            if await self.storage.get(ck.head) is None and await self.storage.get(ck.erase) is not None:
                await self._unswept_forks(ck, out)
                out.append(child)

    async def _fork_entries(self, sk: SessionKeys) -> list[str]:
        out, start = [], None
        while True:
            keys = await self.storage.list_keys(sk.fork_entries, start, _LIST)
            out += [k[len(sk.fork_entries):] for k in keys]
            if len(keys) < _LIST:
                return out
            start = keys[-1]

    async def live_forks(self, sk: SessionKeys) -> list[str]:
        """Forks of the session that are not tombstoned (their head exists)."""
        live, start = [], None
        while True:
            keys = await self.storage.list_keys(sk.fork_entries, start, _LIST)
            children = [k[len(sk.fork_entries):] for k in keys]
            heads = await asyncio.gather(*(self.storage.get(self.keys(sk.tenant, c).head) for c in children))
            live += [c for c, head in zip(children, heads, strict=True) if head is not None]
            if len(keys) < _LIST:
                return live
            start = keys[-1]

    async def sweep_session(self, tenant: str, sid: str) -> int:
        """Remove every remaining item of a tombstoned session; the to-do entry
        goes last. Idempotent; returns the items deleted."""
        sk = self.keys(tenant, sid)
        entry = await self.storage.get(sk.erase)
        parent = json.loads(entry.value).get("parent", "") if entry is not None else ""
        removed = await self.delete_prefix(sk.base)
        removed += await self.delete_prefix(sk.blobs)
        extra = [sk.pending, *await self.listing_keys(sk)]
        if parent:
            extra.append(self.keys(tenant, parent).fork_entry(sid))
        await self.storage.transact((), [Delete(k) for k in extra])
        if parent:  # a marker written before it held no name may still name this fork
            await self.storage.transact((), [Put(self.keys(tenant, parent).forks, b"", Expect(value=sid.encode()))])
        await self.storage.delete(sk.erase)
        self.events("ledger.erased_items", removed)
        return removed

    async def delete_prefix(self, prefix: str, max_keys: int | None = None) -> int:
        return await delete_prefix(self.storage, prefix, max_keys)
