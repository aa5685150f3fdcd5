"""Agent- and tenant-wide erasure: a long-running operation kept in the backend.

An operation is one item, `#/ops/erase/{id}`, holding its scope, phase,
cursor and counts. Any replica may run it: a runner claims the operation by
a CAS on that item (a claim that expires), does one bounded step, and
records its progress with a CAS on the version it claimed, so a replica that
died mid-step leaves the operation to whoever claims it after the expiry,
and two replicas never both record progress (a step outlasting a third of
the claim renews it meanwhile). Every step is idempotent
(deletes, and DeleteSession's tombstone and sweep), so the step a dead
replica was in the middle of is simply done again.

The record is written together with the scope's erasure marker
(ledger/erasing.py), which refuses every session creation of the scope until
the step reaching `done` takes it out: the fence finds every session created
before, and none is created after, so no session is ever half erased.

Phases:
- fence: every session in scope is tombstoned and swept, as DeleteSession
  with force and delete_descendants (so a paused holder's next write
  fails, and the ledger's global entries of each session go too). Sessions
  are found by walking the scope's keys with skips: one list per session;
  then an agent's sessions whose DeleteSession was cut short after their own
  keys went (blobs and to-do entry left under `#/`) are swept too.
- sweep: every key left under the scope's prefixes is deleted in batches
  (journal and archives, memory, evals, author KV, ...); a tenant's request-id
  markers and ledger index entries under `#/` go too.
- directory: what the backend keeps besides items that names the scope
  (DynamoDB's partition-directory rows) goes, a batch of names at a time:
  the names are recorded first, then forgotten, then the runner waits the
  backend's `partition_settle_seconds` (saving the time waited as it goes,
  which also renews its claim), then settles them (a partition a racing
  write filled again gets its record back). A replica taking over mid-wait
  goes on from the recorded time: the wait only has to follow the removal.
  Nothing to do on backends that keep no such records.
- done: a raw read of the backend finds nothing of the scope, bar what was
  written after the erasure began (new data).

The stored record never names an erased tenant (its SHA-256 authorizes
GetOperation), and a finished agent erasure forgets the agent's name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from fencepost import reasons

from ..storage import Check, Delete, Expect, Item, Put, Storage, Write
from .erasure_steps import EraseSteps
from .errors import NotFound
from .keys import GLOBAL_PREFIX, check_erasable_agent
from .ledger import Ledger
from .ledger.core import contended
from .ledger.layout import digest
from .ledger.erasing import (
    ERASING_PREFIX,
    OPERATION_NAME_PREFIX,
    SHARDS,
    marker_keys,
    marker_ops,
    marker_prefix,
    marker_value,
)
from .requests import check_request_id
from .throttled_log import ThrottledWarning

log = logging.getLogger("fencepost.erasure")

OPS_PREFIX = GLOBAL_PREFIX + "ops/erase/"
NAME_PREFIX = OPERATION_NAME_PREFIX
_MARKER_ATTEMPTS = 20  # the marker only changes when an operation of its scope starts or ends
_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True, slots=True)
class OperationView:
    name: str
    done: bool
    agent: str
    phase: str
    sessions_fenced: int
    items_erased: int
    created: float
    updated: float


def _view(op_id: str, state: dict[str, object]) -> OperationView:
    return OperationView(
        NAME_PREFIX + op_id, state["phase"] == "done", str(state.get("agent") or ""), str(state["phase"]),
        int(state["fenced"]), int(state["erased"]), float(state["created"]), float(state["updated"]),  # type: ignore[arg-type]
    )


def _op_seed(tenant: str, agent: str | None, request_id: str) -> str:
    """What a request id's operation id is derived from: one seed per (tenant,
    scope, request id). Without NUL in any part it is the original form (the
    tenant scope as NUL, a name no such agent has; as `None` it was the agent
    "None"), so a retry across an upgrade finds its operation; its parts are
    split by exactly two or three NULs. When a part holds NUL that form is
    ambiguous (agent "a\\0b" + "r" vs agent "a" + "b\\0r"), so the seed is
    their JSON list, which holds no NUL at all and so meets no original seed."""
    if not any("\x00" in part for part in (tenant, agent or "", request_id)):
        scope = "\x00" if agent is None else agent
        return "\x00".join((tenant, scope, request_id))
    return json.dumps([tenant, agent, request_id])


class Eraser(EraseSteps):
    """Starts, runs and reports erasure operations. One per process."""

    def __init__(
        self,
        storage: Storage,
        ledger: Ledger,
        *,
        clock: Callable[[], float] = time.time,
        claim_seconds: float = 30.0,
        poll_seconds: float | None = 5.0,
        events: Callable[..., None] | None = None,
    ) -> None:
        self.storage = storage
        self.ledger = ledger
        self.clock = clock
        self.claim_seconds = claim_seconds
        self.poll_seconds = poll_seconds
        self.events: Callable[..., None] = events or (lambda name, value=1.0: None)
        self.replica = uuid.uuid4().hex
        self._wake = asyncio.Event()

    # -- the RPCs ---------------------------------------------------------------------
    async def start(self, tenant: str, agent: str | None, request_id: str = "") -> OperationView:
        """Record a new operation (or return the one this request_id started)."""
        # any name a service stores data under can be erased: the journal and
        # memory take names holding NUL, so NUL is no reason to refuse one; the
        # operation's record keeps the name, and must fit one DynamoDB item
        if agent is not None:
            check_erasable_agent(agent, reasons.AGENT_NAME_INVALID, "agent")
        check_request_id(request_id)
        seed = _op_seed(tenant, agent, request_id) if request_id else uuid.uuid4().hex
        op_id = digest(seed)[:32]
        now = self.clock()
        marker = marker_prefix(tenant, agent)
        state: dict[str, object] = {
            "tenant": digest(tenant), "scope_tenant": tenant, "agent": agent, "phase": "fence",
            "cursor": None, "fenced": 0, "erased": 0, "created": now, "updated": now, "claim": None,
            "marker": marker,
        }
        # The record and its id in the scope's marker, in one transaction: from
        # the moment the operation exists (before its fence lists anything), no
        # session of the scope can be created (ledger/erasing.py says why).
        for _ in range(_MARKER_ATTEMPTS):
            shards = await self._shards(tenant, agent)
            res = await self.storage.transact((), [
                Put(OPS_PREFIX + op_id, _dump(state), Expect(exists=False)),
                *(Put(key, marker_value([*marker_ops(item), op_id]), _unchanged(item)) for key, item in shards),
            ])
            if res.applied:
                break
            if 0 in res.failed:  # a retry of a start: its operation (done or not)
                return await self.get(tenant, NAME_PREFIX + op_id)
        else:
            raise contended("EraseAgent" if agent is not None else "EraseTenant")
        self._wake.set()
        self.events("erasure.started")
        # an audit line without the scope's name: a finished erasure keeps none
        log.info("erasure %s started (%s scope)", NAME_PREFIX + op_id, "tenant" if agent is None else "agent")
        return _view(op_id, state)

    async def get(self, tenant: str, name: str) -> OperationView:
        op_id = name[len(NAME_PREFIX):] if name.startswith(NAME_PREFIX) else ""
        item = await self.storage.get(OPS_PREFIX + op_id) if _ID.fullmatch(op_id) else None
        state = json.loads(item.value) if item is not None else None
        if state is None or state["tenant"] != digest(tenant):
            raise NotFound(reasons.OPERATION_NOT_FOUND, f"no operation {name!r}", {"name": name})
        return _view(op_id, state)

    # -- the runner -------------------------------------------------------------------
    async def run(self) -> None:
        """The background loop (every replica): claim unfinished operations
        every `poll_seconds` (None: only when this replica starts one), and at
        once when this replica starts one."""
        warning = ThrottledWarning(log, "erasure pass")
        stale_markers = True
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_seconds)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                if stale_markers:
                    await self.forget_stale_markers()
                    stale_markers = False
                await self.run_pending()
                warning.ok()
            except Exception as exc:  # an outage: try again next round
                warning.failed(exc)

    async def forget_stale_markers(self) -> int:
        """Take out of the erasure markers every operation id whose record is
        done or missing; returns how many shards changed. On a store written
        only by servers there is none: one transaction writes an operation
        and its id, and the id goes before `done` is saved. A store restored
        or migrated from a logical read of a live DynamoDB table (not
        quiesced) can hold a marker read before its operation finished and
        the record read after: that marker would refuse every session of the
        scope forever. Each change is conditioned on the shard as read (an
        operation moving it meanwhile is left to itself). Once per start."""
        changed, start, known = 0, None, {}  # type: ignore[var-annotated]
        while True:
            items = await self.storage.list(ERASING_PREFIX, start, 256)
            for item in items:
                ops = marker_ops(item)
                for op in ops:
                    if op not in known:
                        record = await self.storage.get(OPS_PREFIX + op) if _ID.fullmatch(op) else None
                        known[op] = record is not None and json.loads(record.value)["phase"] != "done"
                rest = [op for op in ops if known[op]]
                if rest != ops:
                    expect = _unchanged(item)
                    write = Put(item.key, marker_value(rest), expect) if rest else Delete(item.key, expect)
                    changed += (await self.storage.transact((), [write])).applied
            if len(items) < 256:
                if changed:
                    log.warning("erasure markers: %d shard(s) named finished or unrecorded operations", changed)
                return changed
            start = items[-1].key

    async def run_pending(self) -> int:
        """Run every unfinished operation this replica can claim to the end;
        returns how many it finished."""
        finished, start = 0, None
        while True:
            items = await self.storage.list(OPS_PREFIX, start, 100)
            for item in items:
                if json.loads(item.value)["phase"] != "done" and await self._run(item):
                    finished += 1
            if len(items) < 100:
                return finished
            start = items[-1].key

    async def _run(self, item: Item) -> bool:
        state = json.loads(item.value)
        claim = state.get("claim")
        now = self.clock()
        if claim and claim["by"] != self.replica and claim["until"] > now:
            return False  # another replica is on it
        saved_at = time.monotonic()
        version = await self._save(item.key, item.version, state, claimed=True)
        if version is None:
            return False
        while state["phase"] != "done":
            claim = self._claim(version, saved_at, state)
            if not await self._renewing(item.key, state, claim):
                return False  # taken over mid-step
            version = claim.version
            if state["phase"] == "done" and not await self._unmark(item.key, version, state):
                return False  # taken over: the other replica takes the marker out
            saved_at = time.monotonic()
            version = await self._save(item.key, version, state, claimed=state["phase"] != "done")
            if version is None:
                return False  # taken over (this replica was too slow): the other one goes on
        self.events("erasure.finished")
        log.info("erasure %s done: %d sessions fenced, %d items erased",
                 NAME_PREFIX + item.key[len(OPS_PREFIX):], state["fenced"], state["erased"])
        return True

    def _claim(self, version: str, saved_at: float, state: dict[str, object]) -> _Claim:
        """The claim just saved in `state` (at `version`; `saved_at`: monotonic,
        taken before the save was sent)."""
        until = float(state["claim"]["until"])  # type: ignore[index]
        third = self.claim_seconds / 3
        return _Claim(version, saved_at + 2 * third, until - third, self.clock)

    async def _renewing(self, key: str, state: dict[str, object], claim: _Claim) -> bool:
        """One step, renewing the claim every third of its length while the
        step runs: a fence step sweeping a large session can outlast the
        claim (DynamoDB under load), and another replica taking over then
        would redo it, and the counts of what this one deleted would be lost.
        A renewal saves the state as it was before the step (what a replica
        taking over after a crash redoes). False when a renewal finds the
        operation taken over: the step is cancelled."""
        before = json.loads(_dump(state))
        step = asyncio.ensure_future(self._step(state, claim.held))
        try:
            while True:
                finished, _ = await asyncio.wait({step}, timeout=self.claim_seconds / 3)
                if finished:
                    step.result()  # the step's failure, if any
                    return True
                saved_at = time.monotonic()
                version = await self._save(key, claim.version, before, claimed=True)
                if version is None:
                    return False
                renewed = self._claim(version, saved_at, before)
                claim.version, claim.deadline, claim.until = renewed.version, renewed.deadline, renewed.until
        finally:
            if not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)

    async def _save(self, key: str, version: str, state: dict[str, object], *, claimed: bool) -> str | None:
        now = self.clock()
        state["claim"] = {"by": self.replica, "until": now + self.claim_seconds} if claimed else None
        state["updated"] = now
        res = await self.storage.put_if_version(key, _dump(state), version)
        return res.version if res.applied else None

    async def _shards(self, tenant: str, agent: str | None) -> list[tuple[str, Item | None]]:
        """Every shard of a scope's marker (ledger/erasing.py), as stored: one list."""
        stored = {item.key: item for item in await self.storage.list(marker_prefix(tenant, agent), None, SHARDS)}
        return [(key, stored.get(key)) for key in marker_keys(tenant, agent)]

    async def _unmark(self, key: str, version: str, state: dict[str, object]) -> bool:
        """Take the operation out of its scope's marker, before `done` is saved
        (a replica dying in between leaves it to the next claimer, which finds
        the id gone). Only while the record is still at the version this
        replica saved: a replica whose claim was taken over removes nothing
        (the new claimer may still be sweeping). False then."""
        prefix = state.pop("marker", None)
        if not isinstance(prefix, str):
            return True  # recorded before operations kept markers: nothing to take out
        op_id = key[len(OPS_PREFIX):]
        for _ in range(_MARKER_ATTEMPTS):
            writes: list[Write] = []
            for item in await self.storage.list(prefix, None, SHARDS):
                ops = marker_ops(item)
                if op_id in ops:
                    rest = [each for each in ops if each != op_id]
                    expect = _unchanged(item)
                    writes.append(Put(item.key, marker_value(rest), expect) if rest else Delete(item.key, expect))
            if not writes:
                return True
            res = await self.storage.transact([Check(key, Expect(version=version))], writes)
            if res.applied:
                return True
            if 0 in res.failed:
                return False
        raise contended("the erasure's marker")

class _Claim:
    """The claim a step runs under: the record's version, and until when the
    step may go on deleting. `held` is False from within a third of the
    claim's length of its expiry, by the monotonic clock (from before the
    save that claimed or renewed it was sent) and by the operation's clock,
    by which other replicas see it expire: Linux's monotonic clock does not
    count a suspended machine (nor, on some hypervisors, a paused VM). The
    sweep asks between listing keys and deleting them, the fence between
    listing a session and tombstoning it, and each ends its step early on False (the
    save renews the claim, or finds it taken over): a replica that stalled
    past its claim (a pause, a frozen VM) while another one finished the
    operation would otherwise list and delete what was written after `done`
    (new sessions, new data). Replicas' clocks are assumed to agree within
    that third (10 s by default)."""

    __slots__ = ("version", "deadline", "until", "clock")

    def __init__(self, version: str, deadline: float, until: float, clock: Callable[[], float]) -> None:
        self.version, self.deadline, self.until, self.clock = version, deadline, until, clock

    def held(self) -> bool:
        return time.monotonic() <= self.deadline and self.clock() <= self.until


def _unchanged(item: Item | None) -> Expect:
    """The condition that a marker shard is still as it was read."""
    return Expect(exists=False) if item is None else Expect(version=item.version)


def _dump(state: dict[str, object]) -> bytes:
    return json.dumps(state, separators=(",", ":"), sort_keys=True).encode()
