"""Client workloads that record every call into a `History`.

- KV CAS: a few key slots, several processes per slot doing get / put /
  delete / put_if_absent / put_if_version / delete_if_version; a slot moves
  to a fresh key every `ops_per_key` ops, so each key's history is short.
  Every write carries a request id: the SDK retries a blind put / delete
  without one, which is at-least-once (a lost response then re-applies the
  write after other writers' writes: not linearizable, by design).
- Ledger holders: two holders contend for each session's lease (short ttl,
  occasional pauses past it), commit records and consume inbox events that
  delivery processes park.
- Paused-holder races: holder A is granted a lease and pauses past its ttl;
  holder B acquires while A commits, then A wakes, re-reads the head and
  commits again with its old generation (which must be fenced).
- Journal appenders: turn records with unique tags.

Each `step_*` is one step of a `BoundedLoad` worker.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import fencepost
from fencepost.errors import LeaseFenced, LeaseHeld

from .checks import record_bytes
from .history import OK, History

Step = Callable[[], Awaitable[None]]


@dataclass
class Workload:
    client: fencepost.AsyncClient
    history: History
    seed: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    lease_ttl: float = 0.4
    race_ttl: float = 0.03
    ops_per_key: int = 30
    races: int = 0
    _values: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._slot_keys: dict[int, tuple[str, int]] = {}

    def set_client(self, client: fencepost.AsyncClient) -> None:
        """Point every worker at a new connection (after a server restart)."""
        self.client = client

    def _value(self, process: str) -> bytes:
        self._values += 1
        return f"{process}:{self._values}".encode()

    # -- KV CAS -----------------------------------------------------------
    def kv_worker(self, slot: int, process: str) -> Step:
        known: dict[str, str | None] = {}  # key -> the last version this process saw

        async def step() -> None:
            key, used = self._slot_keys.get(slot, (f"{self.tag}/kv/{slot}/0", 0))
            if used >= self.ops_per_key:
                key, used = f"{self.tag}/kv/{slot}/{uuid.uuid4().hex[:6]}", 0
            self._slot_keys[slot] = (key, used + 1)
            await self._kv_op(process, key, known)

        return step

    async def _kv_op(self, process: str, key: str, known: dict[str, str | None]) -> None:
        c, h, roll = self.client, self.history, self.rng.random()
        version = known.get(key)
        if roll < 0.3:
            op, entry = await h.call(process, "kv.get", lambda: c.get_with_version(key), key=key)
            if op.status == OK:
                op.result = None if entry is None else (entry.value, entry.version)
                known[key] = None if entry is None else entry.version
            return
        if roll < 0.36:
            value = self._value(process)
            op, new = await h.call(process, "kv.put", lambda: c.put(key, value, request_id=uuid.uuid4().hex), key=key, value=value)
            known[key] = new if op.status == OK else version
            return
        if roll < 0.4:
            await h.call(process, "kv.delete", lambda: c.delete(key, request_id=uuid.uuid4().hex), key=key)
            return
        if version is None or roll < 0.5:
            value = self._value(process)
            op, res = await h.call(process, "kv.put_if_absent", lambda: c.put_if_absent(key, value),
                                   key=key, value=value)
        elif roll < 0.92:
            value = self._value(process)
            op, res = await h.call(process, "kv.put_if_version",
                                   lambda: c.put_if_version(key, value, version),
                                   key=key, value=value, expected=version)
        else:
            op, res = await h.call(process, "kv.delete_if_version", lambda: c.delete_if_version(key, version),
                                   key=key, expected=version)
        if res is not None:
            known[key] = res.version or None

    # -- ledger holders and deliveries ---------------------------------------
    async def open_sessions(self, prefix: str, count: int) -> list[str]:
        sids = []
        for i in range(count):
            info = await self.client.open_session("reliability", f"{self.tag}-{prefix}-{i}")
            sids.append(info.session_id)
        return sids

    def holder_worker(self, sid: str, process: str) -> Step:
        held: dict[str, int] = {}  # "gen", "seq" while this holder has the lease

        async def step() -> None:
            c, h = self.client, self.history
            if not held:
                op, lease = await h.call(process, "ledger.acquire",
                                         lambda: c.acquire_lease(sid, process, ttl=self.lease_ttl),
                                         session=sid, holder=process)
                if lease is None:
                    await asyncio.sleep(self.lease_ttl / 4 if isinstance(op.error, LeaseHeld) else 0.01)
                    return
                held["gen"] = lease.generation
                if not await self._reread_head(process, sid, held):
                    return
            if self.rng.random() < 0.05:  # pause past the ttl: the other holder may take over
                await asyncio.sleep(self.lease_ttl * 1.2)
            _, events = await h.call(process, "ledger.list_inbox", lambda: _first(c.list_inbox(sid), 4),
                                     session=sid)
            consume = [e.inbox_id for e in events or []]
            await self._commit(process, sid, held, consume)

        return step

    async def _reread_head(self, process: str, sid: str, held: dict[str, int]) -> bool:
        _, info = await self.history.call(process, "ledger.get_session",
                                          lambda: self.client.get_session(sid), session=sid)
        if info is None:
            held.clear()
            return False
        held["seq"] = info.seq
        return True

    async def _commit(self, process: str, sid: str, held: dict[str, int], consume: list[str]) -> None:
        cid = uuid.uuid4().hex
        gen, seq = held["gen"], held["seq"]
        records = [record_bytes(cid, gen, i) for i in range(1 + self.rng.randrange(3))]
        op, res = await self.history.call(
            process, "ledger.commit",
            lambda: self.client.commit(sid, gen, seq, records, consume=consume, commit_id=cid),
            session=sid, generation=gen, expected_seq=seq, records=records, consume=consume, commit_id=cid,
        )
        if res is not None:
            held["seq"] = res.seq
        elif isinstance(op.error, LeaseFenced):
            held.clear()
        else:  # sequence moved, an entry gone, or unknown: re-read the head
            await self._reread_head(process, sid, held)

    def deliver_worker(self, sids: list[str], process: str) -> Step:
        async def step() -> None:
            sid = self.rng.choice(sids)
            payload = self._value(process)
            await self.history.call(
                process, "ledger.deliver",
                lambda: self.client.deliver(payload, session_id=sid, dedupe_key=payload.decode()),
                session=sid, payload=payload,
            )
        return step

    # -- paused-holder races ----------------------------------------------------
    def race_worker(self, sid: str, process: str) -> Step:
        async def step() -> None:
            c, h = self.client, self.history
            a, b = f"{process}-a", f"{process}-b"
            _, lease_a = await h.call(a, "ledger.acquire", lambda: c.acquire_lease(sid, a, ttl=self.race_ttl),
                                      session=sid, holder=a)
            if lease_a is None:
                await asyncio.sleep(self.race_ttl)
                return
            held_a = {"gen": lease_a.generation}
            if not await self._reread_head(a, sid, held_a):
                return
            await asyncio.sleep(self.race_ttl * 1.5)  # A pauses; its lease expires
            acquire_b = h.call(b, "ledger.acquire", lambda: c.acquire_lease(sid, b, ttl=1.0),
                               session=sid, holder=b)
            (_, lease_b), _ = await asyncio.gather(acquire_b, self._commit(a, sid, dict(held_a), []))
            self.races += 1
            if lease_b is None:
                return
            held_b = {"gen": lease_b.generation}
            if await self._reread_head(b, sid, held_b):
                await self._commit(b, sid, held_b, [])
            # A wakes, re-reads the head, and commits with its old generation
            if await self._reread_head(a, sid, held_a):
                await self._commit(a, sid, held_a, [])
            await h.call(b, "ledger.release", lambda: c.release_lease(sid, lease_b.generation),
                         session=sid, generation=lease_b.generation)
        return step

    # -- journal ----------------------------------------------------------------
    def journal_worker(self, agent: str, process: str) -> Step:
        async def step() -> None:
            tag = f"{process}-{uuid.uuid4().hex[:10]}"
            record = {"at": datetime.now(timezone.utc).isoformat(), "sessionId": tag, "channelId": "reliability",
                      "status": "completed"}
            await self.history.call(process, "journal.append", lambda: self.client.append_turn(agent, record),
                                    agent=agent, tag=tag)
        return step


async def _first(events: AsyncIterator[fencepost.InboxEvent], n: int) -> list[fencepost.InboxEvent]:
    out: list[fencepost.InboxEvent] = []
    async for event in events:
        out.append(event)
        if len(out) >= n:
            break
    return out
