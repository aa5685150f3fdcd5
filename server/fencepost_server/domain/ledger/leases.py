"""Leases: acquire (a CAS on the lease item), renew and release (fenced on the
generation item), all in one conditional write each."""

from __future__ import annotations

from ...storage import Check, CountKeys, Expect, Item, Put, Write
from ..errors import FailedPrecondition
from .core import INBOX_COUNT_CAP, LedgerBase, check_holder, contended, lease_fenced, lease_held, require_holder
from .layout import LeaseState, SessionKeys, gen_value, is_erased, parse_gen, session_not_found

_ATTEMPTS = 8


class LeaseMethods(LedgerBase):
    async def acquire(
        self, tenant: str, sid: str, holder: str, ttl: float | None = None, generation: int = 0,
        reclaim: bool = True,
    ) -> LeaseState:
        """Grant (new generation) when free or expired; renew when the caller is
        the holder and passes its generation (live, or expired and not taken
        since: as RenewLease); else LEASE_HELD. The live
        holder's own id without its generation is granted a new generation
        (a restarted holder reclaiming its lease) unless `reclaim` is false:
        then its live lease is held like anyone's (Deliver's try_lease). A
        `generation` that is not the current one is LEASE_FENCED.

        Steady state is one transaction: the lease item last seen by this
        process is the CAS expectation. A stale cache costs one read and one
        more attempt; a "held" verdict is always confirmed by a fresh read."""
        require_holder(holder)
        ttl = self.ttl(ttl)
        sk = self.keys(tenant, sid)
        item = self.cached_lease(sk.lease)
        fresh = item is None
        if item is None:
            item = await self.read_lease(sk)
        for _ in range(_ATTEMPTS):
            st = LeaseState.decode(item.value)
            now = self.clock()
            if generation and generation == st.generation and holder == st.holder and not st.released:
                # a renew, as RenewLease: also just after expiry while nobody took it
                # (a new generation here would fence the holder's own writes in flight)
                try:
                    return await self.renew(tenant, sid, generation, ttl, holder)
                except FailedPrecondition:
                    if fresh:
                        raise
                    # decided on a remembered lease: decide again on the stored one
                    item, fresh = await self.read_lease(sk), True
                    continue
            if st.live(now) and (holder != st.holder or not reclaim):
                if not fresh:
                    item, fresh = await self.read_lease(sk), True
                    continue
                raise lease_held(st)
            if generation and generation != st.generation:
                # a renewal of a generation granted anew since: fenced (final);
                # a grant here would fence the newer incarnation mid-turn
                if not fresh:
                    item, fresh = await self.read_lease(sk), True
                    continue
                raise lease_fenced(generation, st.generation, released=st.released)
            granted = await self.grant(sk, item, holder, ttl, st)
            if granted is not None:
                return granted
            item, fresh = await self.read_lease(sk), True
        raise contended("AcquireLease")

    async def grant(
        self, sk: SessionKeys, seen: Item, holder: str, ttl: float, st: LeaseState | None = None
    ) -> LeaseState | None:
        """Grant a new generation iff the lease item is still `seen` (`st`: its
        decoding, when the caller has it): one transaction; None when it
        changed (nothing written)."""
        if st is None:
            st = LeaseState.decode(seen.value)
        new = LeaseState(holder, st.generation + 1, self.clock() + ttl, False)
        value = new.encode()
        res = await self.storage.transact((), [
            Put(sk.lease, value, Expect(version=seen.version)),
            Put(sk.gen, new.fence(), Expect(value=st.fence())),
        ])
        if not res.applied:
            self.remember_lease(sk.lease, None)
            return None
        self.remember_lease(sk.lease, Item(sk.lease, value, res.versions[0] or ""))
        return new

    async def renew(
        self, tenant: str, sid: str, generation: int, ttl: float | None = None, holder: str = ""
    ) -> LeaseState:
        """Extend while `generation` is current (held), even just after expiry.
        One transaction conditioned on the generation only: a retry after an
        ambiguous failure succeeds again."""
        ttl = self.ttl(ttl)
        check_holder(holder)
        sk = self.keys(tenant, sid)
        if not holder:
            holder = await self._holder_of(sk, generation)
        new = LeaseState(holder, generation, self.clock() + ttl, False)
        value = new.encode()
        res = await self.storage.transact(
            [Check(sk.gen, Expect(value=gen_value(generation, True)))], [Put(sk.lease, value)]
        )
        if not res.applied:
            raise await self.fenced(sk, generation)
        self.remember_lease(sk.lease, Item(sk.lease, value, res.versions[0] or ""))
        return new

    async def _holder_of(self, sk: SessionKeys, generation: int) -> str:
        """The holder granted `generation`, for a renew that did not name it:
        the renew rewrites the whole lease record, and a blank holder there
        would make the holder's own re-acquire by generation LEASE_HELD (by
        ""). Remembered, or read once when this process has not seen that
        generation ("" when it is not the stored one: the renew is fenced)."""
        cached = self.cached_lease(sk.lease)
        if cached is not None:
            st = LeaseState.decode(cached.value)
            if st.generation == generation:
                return st.holder
        item = await self.storage.get(sk.lease)
        if item is None:
            return ""
        st = LeaseState.decode(item.value)
        return st.holder if st.generation == generation else ""

    async def fenced(self, sk: SessionKeys, generation: int) -> Exception:
        """The error for a failed generation check (read after the fact)."""
        item = await self.storage.get(sk.gen)
        if item is None or is_erased(item.value):
            return session_not_found(sk.sid)
        current, held = parse_gen(item.value)
        return lease_fenced(generation, current, released=not held)

    async def release(self, tenant: str, sid: str, generation: int, force: bool = False) -> int:
        """Give the lease up, keeping the generation. Returns the events left
        pending (force only). Without force, one transaction both releases and
        proves the inbox empty: it deletes the session's pending-index entry at
        the version read *before* the inbox was listed (or checks it absent), so
        a Deliver that parks after that read changes the entry and fails the
        release (see docs/ledger.md, "Release vs Deliver")."""
        sk = self.keys(tenant, sid)
        for _ in range(_ATTEMPTS):
            checks: list[Check] = []
            writes: list[Write] = [
                Put(sk.gen, gen_value(generation, False), Expect(value=gen_value(generation, True))),
                Put(sk.lease, LeaseState("", generation, self.clock(), True).encode()),
            ]
            if not force:
                entry = await self.storage.get(sk.pending)
                try:
                    await self.prove_inbox_empty(sk, entry, checks, writes, "commit them, then release")
                except FailedPrecondition:
                    # the events are the caller's to drain only while it holds the
                    # lease: a retried release (already released) succeeds, a
                    # replaced holder is LEASE_FENCED
                    if (done := await self._not_holding(sk, generation, force)) is not None:
                        return done
                    raise
            res = await self.storage.transact(checks, writes, CountKeys(sk.inbox, INBOX_COUNT_CAP) if force else None)
            self.remember_lease(sk.lease, None)
            if res.applied:
                lease_put = writes[1]
                assert isinstance(lease_put, Put)
                self.remember_lease(sk.lease, Item(sk.lease, lease_put.value, res.versions[1] or ""))
                if not force:
                    return 0
                return res.count if res.count is not None else await self.pending_after_write(sk, INBOX_COUNT_CAP)
            gen_index = len(checks)  # the gen write's condition index
            if gen_index in res.failed or not res.failed:
                if (done := await self._not_holding(sk, generation, force)) is not None:
                    return done
            # the pending entry changed under us: a delivery raced; decide again
        raise contended("ReleaseLease")

    async def _not_holding(self, sk: SessionKeys, generation: int, force: bool) -> int | None:
        """A release's answer when `generation` is no longer held: the pending
        count (0 without force) when it was released at that generation (a
        retried release), else LEASE_FENCED or SESSION_NOT_FOUND. None while
        it is still held (the caller decides again)."""
        item = await self.storage.get(sk.gen)
        if item is None or is_erased(item.value):
            raise session_not_found(sk.sid)
        current, held = parse_gen(item.value)
        if current == generation and held:
            return None
        if current == generation:
            return await self.count_inbox(sk) if force else 0  # already released
        raise lease_fenced(generation, current, released=not held)
