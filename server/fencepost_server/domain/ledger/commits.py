"""Fenced commits: one transaction, no read first.

    check  gen  == gen_value(G, held)                  (the fence)
    put    head := seq(E + n)     if head == seq(E)    (the sequence)
    put    log/{E+1..E+n}         if absent
    delete in/{id} ...            if present           (the inbox drain)
    put    cm/{sha(commit_id)}    if absent            (idempotency)
    put    act/{sid}              if act == the value it replaces
    put    ix/{now}/{sid}, ix/{previous}/{sid} (superseded)   (restore listing, activity.py)

That is 2 + records + consumed + 1 + 3 operations against the transaction
limit of 100. Every commit the bounds allow (64 records, 32 consumed ids, a
commit_id: 99 operations before the activity) is accepted: when the two index
puts do not fit, the transaction carries only act/{sid} (still conditioned, so
the fence, the sequence and the idempotency are unchanged) marked as owing
the index this commit, and a second write right after it applied puts the
index entries (activity.py explains the exception and who settles it after
a crash between the two). Extra room deletes expired superseded entries.
The pending count the response carries comes back with the same
backend call (`CountKeys`; on DynamoDB a keys-only Query sent alongside).
Nothing is read before the write (the replaced act/ value is the one this
process wrote last; a process that has not seen the session reads it once);
only when the write fails is anything read, to say why. A write that failed
only because the remembered act/ value was stale is retried from a fresh read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from fencepost import reasons

from ...storage import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    TXN_OP_OVERHEAD,
    Check,
    CountKeys,
    Delete,
    Expect,
    InvalidTransaction,
    Put,
    StorageError,
    Write,
    key_bytes,
)
from ..errors import FailedPrecondition, InvalidArgument, limit_error
from .activity import ACTIVITY_OPS, MAX_KEPT, ActivityMethods
from .core import ABSENT, MAX_CONSUMED, MAX_RECORDS, PRESENT, bad, contended
from .layout import check_inbox_id, gen_value, parse_seq, seq_value, session_not_found


#: The response's pending count stops here: it only has to say "run another turn".
PENDING_COUNT_CAP = 1000


@dataclass(frozen=True, slots=True)
class CommitResult:
    seq: int
    pending: int
    replayed: bool = False


def _fingerprint(expected_seq: int, records: Sequence[bytes], consume: Sequence[str]) -> str:
    h = hashlib.sha256(str(expected_seq).encode())
    for r in records:
        h.update(len(r).to_bytes(8, "big"))
        h.update(r)
    for c in consume:
        h.update(b"\x00" + c.encode())
    return h.hexdigest()


def _marker(seq: int, fingerprint: str, when: int) -> bytes:
    """dumps({"s": seq, "f": fingerprint, "t": when}), spelled out (a hex fingerprint needs no escaping)."""
    return f'{{"f":"{fingerprint}","s":{seq},"t":{when}}}'.encode()


#: A commit whose remembered act/ value went stale is retried this often.
_ATTEMPTS = 3


class CommitMethods(ActivityMethods):
    async def commit(
        self,
        tenant: str,
        sid: str,
        generation: int,
        expected_seq: int,
        records: Sequence[bytes],
        consume: Sequence[str] = (),
        commit_id: str = "",
    ) -> CommitResult:
        self._check_commit(records, consume, expected_seq, commit_id)
        sk = self.keys(tenant, sid)
        new_seq = expected_seq + len(records)
        # only an idempotent commit needs its fingerprint (the marker, and _why on a replay)
        fp = _fingerprint(expected_seq, records, consume) if commit_id else ""
        checks = [Check(sk.gen, Expect(value=gen_value(generation, True)))]
        writes: list[Write] = [Put(sk.head, seq_value(new_seq), Expect(value=seq_value(expected_seq)))]
        log_key = sk.log_key
        writes += [Put(log_key(expected_seq + 1 + i), rec, ABSENT) for i, rec in enumerate(records)]
        if consume:
            writes += [Delete(sk.inbox_key(cid), PRESENT) for cid in consume]
        if commit_id:
            # "t": when, so retention can sweep markers past their window (docs/lifecycle.md)
            writes.append(Put(sk.commit_key(commit_id), _marker(new_seq, fp, int(self.clock())), ABSENT))
        added = sum(map(len, records))
        room = MAX_TXN_OPS - len(checks) - len(writes) - ACTIVITY_OPS
        # the transaction's bytes (validate_transaction's measure) without the activity writes
        fixed_size = key_bytes([sk.gen, *(w.key for w in writes)]) + len(writes[0].value) + added
        if commit_id:
            fixed_size += len(writes[-1].value)
        deferred = False  # an attempt wrote act/ alone, owing the index (activity.py)
        for _attempt in range(_ATTEMPTS):
            prior = await self.prior_activity(tenant, sk, expected_seq)
            new_act = new_value = None
            dated = -1  # the time of the index entry this attempt writes (-1: none)
            if prior is None:  # the session is gone: the write fails and _why says how
                ops, conds = writes, [*checks, Check(sk.act, PRESENT)]
                size = fixed_size + len(sk.act.encode())
            else:
                # no room for the index entries, or for dropping the oldest kept one
                # (past MAX_KEPT the tombstone would not fit): they follow the commit
                if room < max(0, len(prior[1].kept) + 1 - MAX_KEPT):
                    deferred = True
                    activity, new_value, new_act = self.deferred_writes(sk, *prior, new_seq, added)
                else:
                    activity, new_value, new_act = self.advance_writes(sk, *prior, new_seq, added, room)
                    dated = new_act.micros
                ops, conds = [*writes, *activity], checks
                size = fixed_size + key_bytes([w.key for w in activity])
                size += sum([len(w.value) for w in activity if type(w) is Put])
            # as a backend counts it (DynamoDB: attribute names, key prefixes,
            # versions), so a commit within the limit fits one transaction on
            # every backend, and one over it is refused alike on every backend
            size += TXN_OP_OVERHEAD * (len(conds) + len(ops))
            if size > self.limits.max_txn_bytes:
                raise limit_error(reasons.COMMIT_TOO_LARGE, "the commit", self.limits.max_txn_bytes, size,
                                  field="records")

            # One backend call: the pending count comes back with the write.
            try:
                with self.dating(dated):
                    res = await self.storage.transact(conds, ops, CountKeys(sk.inbox, PENDING_COUNT_CAP))
            except InvalidTransaction as exc:
                if exc.limit != MAX_TXN_BYTES or exc.size is None:
                    raise
                # A backend's own count of the stored form (DynamoDB's counts
                # attribute names too) refused what the count above let
                # through: nothing was written; Commit's refusal all the same.
                raise limit_error(reasons.COMMIT_TOO_LARGE, "the commit as stored", exc.limit, exc.size,
                                  field="records") from exc
            except StorageError:
                self.remember_activity(sk, None)  # the outcome is unknown: re-read next time
                raise
            if res.applied:
                self.remember_activity(sk, new_value, new_act)
                if deferred and new_value is not None:  # the second write (activity.py)
                    await self.settle_quietly(sk, new_value)
                self.notify_commit(sid)
                pending = res.count if res.count is not None else await self.pending_after_write(
                    sk, PENDING_COUNT_CAP)
                return CommitResult(new_seq, pending)
            self.remember_activity(sk, None)
            why = await self._why(sk, sid, generation, expected_seq, consume, commit_id, fp)
            if isinstance(why, CommitReplay):
                if deferred or room < 0:  # the first attempt may have stopped between its two writes
                    with contextlib.suppress(StorageError):  # best effort: the replay stands
                        await self.settled_activity(sk)
                return CommitResult(why.seq, await self.count_inbox(sk, PENDING_COUNT_CAP), replayed=True)
            if why is not None:
                raise why
        raise contended("the commit")

    def _check_commit(
        self, records: Sequence[bytes], consume: Sequence[str], expected_seq: int, commit_id: str
    ) -> None:
        """INVALID_ARGUMENT for a commit no session could take, in this order."""
        for field_name, count, cap in (("records", len(records), MAX_RECORDS),
                                       ("consume_inbox_ids", len(consume), MAX_CONSUMED)):
            if count > cap:
                raise InvalidArgument(
                    reasons.COMMIT_TOO_LARGE,
                    f"a commit holds at most {MAX_RECORDS} records and {MAX_CONSUMED} consumed ids "
                    f"(got {len(records)} and {len(consume)})",
                    {"limit": cap, "size": count, "records": len(records), "consumed": len(consume),
                     "max_records": MAX_RECORDS, "max_consumed": MAX_CONSUMED},
                    field=field_name,
                )
        if records and max(map(len, records)) > self.limits.max_value_bytes:
            for i, rec in enumerate(records):
                if len(rec) > self.limits.max_value_bytes:
                    raise limit_error(
                        reasons.RECORD_TOO_LARGE, f"records[{i}]", self.limits.max_value_bytes, len(rec),
                        field="records",
                    )
        if consume:
            for cid in consume:
                check_inbox_id(cid, "consume_inbox_ids")
            if len(set(consume)) != len(consume):
                raise bad("consume_inbox_ids", "consume_inbox_ids names one id twice")
        if expected_seq < 0:
            raise bad("expected_seq", "expected_seq must not be negative")
        if len(commit_id) > 256:
            raise bad("commit_id", "commit_id is longer than 256 characters")

    def notify_commit(self, sid: str) -> None:
        """Hook for watchers (nothing to do today)."""

    async def _why(
        self, sk, sid: str, generation: int, expected_seq: int, consume: Sequence[str],  # type: ignore[no-untyped-def]
        commit_id: str, fp: str,
    ) -> Exception | CommitReplay | None:
        """Why a commit did not apply: read the facts in precedence order
        (a replay of an applied commit wins over everything). None: only the
        remembered act/ value was stale (the caller re-reads and retries)."""
        if commit_id:
            marker = await self.storage.get(sk.commit_key(commit_id))
            if marker is not None:
                first = json.loads(marker.value)
                if first["f"] != fp:
                    return bad("commit_id", "commit_id was already used for a different commit")
                return CommitReplay(int(first["s"]))
        gen = await self.storage.get(sk.gen)
        if gen is None:
            return session_not_found(sid)
        if gen.value != gen_value(generation, True):
            return await self.fenced(sk, generation)  # type: ignore[attr-defined,no-any-return]
        head = await self.storage.get(sk.head)
        current = parse_seq(head.value) if head is not None else -1
        if current != expected_seq:
            return FailedPrecondition(
                reasons.SEQUENCE_MISMATCH,
                f"expected_seq {expected_seq} is not the head ({current}); re-read the log",
                {"expected_seq": expected_seq, "current_seq": current},
            )
        gone = []
        for cid in consume:
            if await self.storage.get(sk.inbox_key(cid)) is None:
                gone.append(cid)
        if not gone:
            return None
        return FailedPrecondition(
            reasons.INBOX_ENTRY_GONE,
            f"inbox entries {gone} are not pending; nothing was written",
            {"inbox_ids": ",".join(gone)},
        )


class CommitReplay(Exception):
    """Internal: the commit was already applied (returned by `_why`, never raised)."""

    def __init__(self, seq: int) -> None:
        super().__init__(seq)
        self.seq = seq
