"""A session's activity: its act/ item and its entries in the agent's
activity index, which ListSessions reads newest first (listing.py).

    {A}act/{sid}                  {t, u, s, b, k, p}: the current activity (µs `u`,
                                  float seconds `t`), seq, log bytes, session key,
                                  and the superseded index entries still kept (`p`)
    {A}ix/{TOP - u:017d}/{sid}    {s, b, k, n}: one activity; `n` = when it was superseded

Every write that changes a session's activity (open, fork, commit) writes,
in its one transaction and without reading first:

    put act/{sid} := new            if act/{sid} == the value it replaces
    put ix/{new u}/{sid}            the new entry
    put ix/{old u}/{sid} with n     the entry it supersedes, marked superseded at new u
    delete ix/{...}/{sid}           superseded entries older than the listing horizon

The new value is computed from the old one, which the process remembers from
its own last write (or, on a cache miss, reads once): sizes add up (`b`),
activity only moves forward (`u = max(now, old u + 1)`, so two commits of one
session can never be ordered differently by their timestamps than by their
seq), and the condition on the old act/ value makes a stale memory fail the
write instead of corrupting the index (the commit then re-reads and retries).

A listing that started at T0 sees each session at exactly one entry: the one
with `u < T0 <= n` (n absent = current). Superseded entries are kept for the
listing horizon so that a listing in progress still finds a session that
moved after its first page.

The one exception: a commit whose own operations leave no room for the three
activity operations (64 records + 32 consumed ids + commit_id use 99 of the
100), or none for dropping the oldest entry once MAX_KEPT are kept
(DeleteSession's tombstone deletes them all in one transaction), puts only
act/{sid}, conditioned as above, and leaves the index where it was. That act/
value keeps the index's view (`u`, `s`, `b`, `p` unchanged) and records what
the index owes in `w` = {s, b, u}: the seq, log bytes and time of the commit.
Right after the commit applied, a second write settles it: the ordinary
advance above from that value (conditioned on it), at a time after `w.u`,
which clears `w`. Until then the session is listed once, at its
previous entry (its previous activity, seq and size), never skipped nor twice;
a listing in progress is not disturbed by the settling (the new entry lies
above its T0, the old one stays valid for it). A crash or an outage between
the two writes leaves `w` in act/; whoever reads act/ next settles it: the
session's next commit (its advance starts from the owed seq and size),
GetSession, a replayed commit, and retention before it judges the session idle.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field, replace

from ...storage import MAX_TXN_OPS, Delete, Expect, Put, StorageError, Write
from ..errors import NotFound
from .core import LedgerBase, log
from .layout import Meta, SessionKeys, activity_micros, json_str

#: Session keys longer than this stay out of the index (the listing reads meta).
KEY_IN_INDEX_BYTES = 1024
#: At most this many superseded entries are kept per session; older ones are
#: deleted even inside the horizon (a session committing faster than this).
#: DeleteSession's one tombstone transaction deletes them all, so it must fit.
MAX_KEPT = 64
#: Operations an activity change adds to a transaction (act, new entry, old entry).
ACTIVITY_OPS = 3


@dataclass(frozen=True, slots=True)
class Activity:
    micros: int
    seq: int
    size: int | None  # None: not known yet (written before the index, or a fork)
    key: str | None  # None: not known yet, or too long to index
    kept: tuple[int, ...] = ()  # µs of superseded entries still in the index, oldest first
    owed: tuple[int, int, int] | None = None  # (seq, size, µs) committed but not yet in the index
    #: `kept` as act/ spells it ("1,2,3"), when known: a session that commits
    #: often keeps MAX_KEPT entries, and formatting 64 numbers anew was a
    #: tenth of a commit's own CPU; advance_writes derives it from the old one.
    #: None or exactly `",".join(map(str, kept))` (whoever changes `kept` sets it).
    kept_text: str | None = field(default=None, compare=False, repr=False)

    @property
    def head_seq(self) -> int:
        """The session's seq (the index may still show an older one: `owed`)."""
        return self.owed[0] if self.owed else self.seq

    @property
    def head_size(self) -> int | None:
        return self.owed[1] if self.owed else self.size

    @property
    def last_micros(self) -> int:
        """The session's last activity (the index may still show an older one)."""
        return self.owed[2] if self.owed else self.micros

    @staticmethod
    def decode(value: bytes) -> Activity:
        d = json.loads(value)
        size = d.get("b")
        w = d.get("w")
        return Activity(
            activity_micros(d), int(d["s"]), None if size is None else int(size), d.get("k"),
            tuple(map(int, d.get("p", ()))),
            None if w is None else (int(w["s"]), int(w["b"]), int(w["u"])),
        )

    # The encodings below are `dumps` of the dicts they name, byte for byte
    # (sorted keys, no spaces, ASCII), spelled out because every commit
    # writes them and the generic encoder costs several times more.
    def act_value(self) -> bytes:
        """dumps({"b", "k", "p", "s", "t": µs / 1e6, "u", "w": {"b", "s", "u"}}), absent fields left out."""
        parts = [] if self.size is None else [f'"b":{self.size}']
        if self.key is not None:
            parts.append('"k":' + json_str(self.key))
        if self.kept:
            text = self.kept_text if self.kept_text is not None else ",".join(map(str, self.kept))
            parts.append('"p":[' + text + "]")
        parts.append(f'"s":{self.seq},"t":{self.micros / 1e6!r},"u":{self.micros}')
        if self.owed:
            parts.append(f'"w":{{"b":{self.owed[1]},"s":{self.owed[0]},"u":{self.owed[2]}}}')
        return ("{" + ",".join(parts) + "}").encode()

    def entry_value(self, superseded_at: int | None = None) -> bytes:
        """dumps({"b", "k", "n", "s"}), absent fields left out."""
        parts = [] if self.size is None else [f'"b":{self.size}']
        if self.key is not None:
            parts.append('"k":' + json_str(self.key))
        if superseded_at is not None:
            parts.append(f'"n":{superseded_at}')
        parts.append(f'"s":{self.seq}')
        return ("{" + ",".join(parts) + "}").encode()


def _kept_text(old: Activity, dropped: int) -> str:
    """The `kept_text` of (*old.kept, old.micros)[dropped:], cut from the old
    one's text rather than formatted number by number."""
    if not old.kept:
        return "" if dropped else str(old.micros)
    text = old.kept_text if old.kept_text is not None else ",".join(map(str, old.kept))
    text = f"{text},{old.micros}"
    if dropped:
        if dropped > len(old.kept):
            return ""
        text = text.split(",", dropped)[dropped]
    return text


class _Dating:
    """`with ledger.dating(micros):` counts `micros` in flight; a negative
    one (nothing dated) counts nothing. A plain class: every commit enters one."""

    __slots__ = ("_counts", "_micros")

    def __init__(self, counts: Counter[int], micros: int) -> None:
        self._counts, self._micros = counts, micros

    def __enter__(self) -> None:
        if self._micros >= 0:
            self._counts[self._micros] += 1

    def __exit__(self, *exc: object) -> None:
        counts, micros = self._counts, self._micros
        if micros < 0:
            return
        if counts[micros] <= 1:
            del counts[micros]
        else:
            counts[micros] -= 1


def indexed_key(session_key: str) -> str | None:
    return session_key if len(session_key.encode()) <= KEY_IN_INDEX_BYTES else None


def creation_writes(sk: SessionKeys, act: Activity) -> list[Write]:
    """A new session's act/ item and its first index entry."""
    return [Put(sk.act, act.act_value()), Put(sk.index_key(act.micros), act.entry_value())]


class ActivityMethods(LedgerBase):
    def remember_activity(self, sk: SessionKeys, value: bytes | None, act: Activity | None = None) -> None:
        """Remember the act/ value last seen or written (None: forget it), with
        its decoding when the caller has it (saves decoding it again)."""
        if value is None:
            self._acts.drop(sk.act)
        else:
            self._acts.put(sk.act, (value, act))

    async def prior_activity(
        self, tenant: str, sk: SessionKeys, expected_seq: int
    ) -> tuple[bytes, Activity] | None:
        """The act/ value a write at `expected_seq` replaces: remembered, or
        read once (None: there is none, the session is gone). Legacy items (no
        size or key yet) are completed here, once."""
        cached = self._acts.get(sk.act)
        value, act = cached if isinstance(cached, tuple) else (None, None)
        if value is not None and act is None:
            act = Activity.decode(value)
        if act is None or act.head_seq != expected_seq:
            item = await self.storage.get(sk.act)
            if item is None:
                return None
            value, act = item.value, Activity.decode(item.value)
            self.remember_activity(sk, value, act)
        assert isinstance(value, bytes) and act is not None
        if act.size is None:
            try:
                size = await self.session_bytes(tenant, sk.sid, act.seq)  # type: ignore[attr-defined]
            except NotFound:
                return None
            act = replace(act, size=size)
        if act.key is None:
            meta = await self.storage.get(sk.meta)
            if meta is None:
                return None
            act = replace(act, key=indexed_key(Meta.decode(meta.value).key))
        return value, act

    def dating(self, micros: int) -> _Dating:
        """Around the write of an index entry dated `micros` (advance_writes):
        until it lands, a listing's snapshot time stays at or before it
        (`snapshot_time`). Otherwise a listing whose first page is read while
        the write is in flight would pass the position the new entry lands at
        and then find the entry it supersedes marked superseded before its
        snapshot: the session would be on no page."""
        return _Dating(self._dating, micros)

    def snapshot_time(self, now: int) -> int:
        """A new listing's T0 (µs): now, or the oldest index entry this
        process is still writing (`dating`), whichever is earlier."""
        return min(now, min(self._dating)) if self._dating else now

    def advance_writes(
        self, sk: SessionKeys, old_value: bytes, old: Activity, seq: int, added_bytes: int, room: int
    ) -> tuple[list[Write], bytes, Activity]:
        """The writes that move the session's activity to now (see the module
        docstring), deleting at most `room` expired entries; the new act/ value
        and its decoding. From a value that owes the index a commit, the move
        starts from the owed seq and size and lands after the owed time."""
        now = int(self.clock() * 1e6)
        micros = max(now, old.last_micros + 1)
        horizon = now - int(self.config.listing_horizon * 1e6)
        kept = (*old.kept, old.micros)
        # Entry i is superseded at kept[i + 1] (the last one at `micros`), and
        # kept only ascends (activity only moves forward), so the entries to
        # drop, expired ones (superseded by the horizon) and the oldest past
        # MAX_KEPT, are a prefix of kept.
        expired = bisect_right(kept, horizon, 1) - 1
        if expired == len(kept) - 1 and micros <= horizon:
            expired += 1
        dropped = min(max(expired, len(kept) - MAX_KEPT), max(room, 0))
        new = Activity(micros, seq, (old.head_size or 0) + added_bytes, old.key, kept[dropped:],
                       kept_text=_kept_text(old, dropped))
        new_value = new.act_value()
        writes: list[Write] = [
            Put(sk.act, new_value, Expect(value=old_value)),
            Put(sk.index_key(micros), new.entry_value()),
        ]
        if dropped < len(kept):  # the entry it supersedes stays, marked superseded now
            writes.append(Put(sk.index_key(old.micros), old.entry_value(micros)))
        writes += [Delete(sk.index_key(u)) for u in kept[:dropped]]
        return writes, new_value, new

    def deferred_writes(
        self, sk: SessionKeys, old_value: bytes, old: Activity, seq: int, added_bytes: int
    ) -> tuple[list[Write], bytes, Activity]:
        """The one write of a commit with no room for the index: act/ keeps the
        index's view and owes it the commit (`w`, module docstring)."""
        micros = max(int(self.clock() * 1e6), old.last_micros + 1)
        new = replace(old, owed=(seq, (old.head_size or 0) + added_bytes, micros))
        new_value = new.act_value()
        return [Put(sk.act, new_value, Expect(value=old_value))], new_value, new

    async def settle_index(self, sk: SessionKeys, value: bytes) -> bytes:
        """Write the index entries act/ `value` owes (conditioned on act/ still
        holding it: a writer that moved it on has settled them itself); the
        act/ value now current, as far as this process knows."""
        act = Activity.decode(value)
        if act.owed is None:
            return value
        writes, new_value, new = self.advance_writes(
            sk, value, act, act.owed[0], 0, MAX_TXN_OPS - ACTIVITY_OPS)
        with self.dating(new.micros):
            res = await self.storage.transact((), writes)
        if not res.applied:
            self.remember_activity(sk, None)
            return value
        self.remember_activity(sk, new_value, new)
        return new_value

    async def trim_kept(self, sk: SessionKeys, value: bytes) -> bytes | None:
        """act/ `value` with at most MAX_KEPT superseded entries, trimming them
        first if needed (a write per ~97 entries, each conditioned on act/):
        commits of earlier builds that filled their transaction kept more, and
        a tombstone deleting them all would not fit one transaction. None: act/
        moved under the trim (the caller reads it again)."""
        act = Activity.decode(value)
        while len(act.kept) > MAX_KEPT:
            writes, new_value, new = self.advance_writes(
                sk, value, act, act.head_seq, 0, MAX_TXN_OPS - ACTIVITY_OPS)
            with self.dating(new.micros):
                res = await self.storage.transact((), writes)
            if not res.applied:
                self.remember_activity(sk, None)
                return None
            self.remember_activity(sk, new_value, new)
            value, act = new_value, new
        return value

    async def settle_quietly(self, sk: SessionKeys, value: bytes) -> bytes:
        """`settle_index`, best effort: an outage leaves the entries owed in
        act/ for the next reader (the caller's own write has applied)."""
        try:
            return await self.settle_index(sk, value)
        except StorageError:
            self.remember_activity(sk, None)
            log.warning("activity index not settled for %s; the next reader does", sk.sid, exc_info=True)
            return value

    async def settled_activity(self, sk: SessionKeys) -> Activity | None:
        """The session's act/ item read now, its owed index entries written
        first if any (None: the session has none)."""
        item = await self.storage.get(sk.act)
        if item is None:
            return None
        return Activity.decode(await self.settle_quietly(sk, item.value))
