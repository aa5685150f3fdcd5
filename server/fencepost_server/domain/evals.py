"""Eval-run history and A/B metric tables, derived over the KV core (seed 004).

Key layout (under the tenant, see keys.TenantKeys.agent):

    .../agentkit/v1/{agent}/eval-runs/{run_id}
    .../agentkit/v1/{agent}/ab-samples/{experiment}/{session_id}/{at}
    .../agentkit/v1/{agent}/ab-snapshot

Every caller segment goes through `encode_segment`, which may replace it with
a hash, so each stored value carries the caller's original ids: listings
decode values, never keys. `{at}` is the ISO 8601 basic form with nanoseconds
(`20240501T120000.000000000Z`): fixed width, so key order is time order within
a session, and made only of unreserved characters.

Costs (backend calls): PutEvalRun, PutAbSample, PutAbSnapshot: one write, no
read (a blind put; with a request id, one transaction instead). GetAbSnapshot:
one read. ListEvalRuns' first page reads the whole run prefix (bounded by the
window plus the runs written since the last listing) and deletes what it prunes.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from fencepost import reasons
from fencepost.keys import encode_segment

from ..storage import BackendUnavailable, Delete, Expect, Item, PersistenceUncertain, Put, Storage, over_budget
from .errors import InvalidArgument, NotFound, limit_error
from .keys import TenantKeys, check_erasable_agent
from .kv import _fingerprint
from .limits import Limits
from .paging import ENTRY_OVERHEAD, PageTokens, fits, page_size
from .requests import RequestLog

DEFAULT_HISTORY_WINDOW = 50
_RECORD_VERSION = 1
_READ_BATCH = 1000

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class EvalRun:
    run_id: str
    snapshot: JsonObject
    updated_ns: int  # server clock, nanoseconds since the epoch


@dataclass(frozen=True, slots=True)
class AbSample:
    experiment: str
    session_id: str
    at_ns: int  # caller's instant, nanoseconds since the epoch
    sample: JsonObject


@dataclass(frozen=True, slots=True)
class AbSnapshot:
    snapshot: JsonObject
    updated_ns: int


@dataclass(frozen=True, slots=True)
class RunPage:
    runs: list[EvalRun]
    next_page_token: str
    pruned: int


@dataclass(frozen=True, slots=True)
class SamplePage:
    samples: list[AbSample]
    next_page_token: str


def format_at(at_ns: int) -> str:
    """The `{at}` key segment: ISO 8601 basic UTC, nanosecond precision, fixed width."""
    seconds, nanos = divmod(at_ns, 1_000_000_000)
    try:
        m = datetime.fromtimestamp(seconds, timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise InvalidArgument(
            reasons.FIELD_INVALID, "at is outside 0001-01-01..9999-12-31", {"at_seconds": seconds}, field="at"
        ) from None
    return f"{m.year:04d}{m.month:02d}{m.day:02d}T{m.hour:02d}{m.minute:02d}{m.second:02d}.{nanos:09d}Z"


def _require(value: str, field: str) -> None:
    if not value:
        raise InvalidArgument(reasons.FIELD_INVALID, f"{field} must not be empty", field=field)
    if "\x00" in value:
        raise InvalidArgument(reasons.FIELD_INVALID, f"{field} must not contain NUL", field=field)


def _segment(value: str, field: str) -> str:
    try:
        return encode_segment(value)
    except UnicodeEncodeError:
        raise InvalidArgument(reasons.FIELD_INVALID, f"{field} is not valid UTF-8", field=field) from None


def _dump(record: Mapping[str, Any], sort_keys: bool = False) -> bytes:
    return json.dumps(
        record, separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=sort_keys
    ).encode()


class EvalStore:
    """The eval and A/B rules over one backend. Stateless apart from configuration."""

    def __init__(
        self,
        storage: Storage,
        limits: Limits,
        requests: RequestLog,
        *,
        history_window: int = DEFAULT_HISTORY_WINDOW,
        clock_ns: Callable[[], int] = time.time_ns,
        pages: PageTokens | None = None,
    ) -> None:
        self.storage = storage
        self.limits = limits
        self.pages = pages or PageTokens.ephemeral()
        self.requests = requests
        self.history_window = history_window
        self.clock_ns = clock_ns

    # -- keys ----------------------------------------------------------------
    def _agent_prefix(self, tenant: str, agent: str) -> str:
        if not agent or "\x00" in agent:
            raise InvalidArgument(
                reasons.AGENT_NAME_INVALID, "agent must be non-empty and contain no NUL", field="agent"
            )
        # else EraseAgent could not name it: its runs never erased agent-wide
        check_erasable_agent(agent, reasons.AGENT_NAME_INVALID, "agent")
        try:
            return TenantKeys(tenant).agent(agent)
        except UnicodeEncodeError:
            raise InvalidArgument(reasons.AGENT_NAME_INVALID, "agent is not valid UTF-8", field="agent") from None

    def _runs_prefix(self, tenant: str, agent: str) -> str:
        return self._agent_prefix(tenant, agent) + "eval-runs/"

    def _run_key(self, tenant: str, agent: str, run_id: str) -> str:
        _require(run_id, "run_id")
        return self._bounded(self._runs_prefix(tenant, agent) + _segment(run_id, "run_id"))

    def _samples_prefix(self, tenant: str, agent: str, experiment: str) -> str:
        _require(experiment, "experiment")
        prefix = self._agent_prefix(tenant, agent) + "ab-samples/" + _segment(experiment, "experiment") + "/"
        return self._bounded(prefix)

    def _snapshot_key(self, tenant: str, agent: str) -> str:
        return self._agent_prefix(tenant, agent) + "ab-snapshot"

    def _bounded(self, key: str) -> str:
        size = len(key.encode())
        if size > self.limits.max_key_bytes:
            raise limit_error(reasons.KEY_TOO_LONG, "the encoded key", self.limits.max_key_bytes, size)
        return key

    def _value(self, record: Mapping[str, Any], field: str) -> bytes:
        try:
            value = _dump(record)
        except ValueError as exc:  # NaN / infinity are not JSON
            raise InvalidArgument(reasons.FIELD_INVALID, f"{field} is not valid JSON: {exc}", field=field) from None
        if len(value) > self.limits.max_value_bytes:
            raise limit_error(reasons.VALUE_TOO_LARGE, field, self.limits.max_value_bytes, len(value), field=field)
        return value

    async def _write(
        self, tenant: str, request_id: str, key: str, value: bytes, body: JsonObject, stamped_ns: int = 0
    ) -> int | None:
        """A blind put; with a request id, the put and its marker in one
        transaction. None when the put was made now; when the request id was
        already applied, the time the first attempt stamped (kept with the
        marker: the item itself may have been overwritten since)."""
        if not request_id:
            await self.storage.put(key, value)
            return None
        # The fingerprint leaves out server-stamped times, so a retry matches,
        # and hashes the JSON with sorted keys: a Struct is a map, whose entries
        # a retry may carry in another wire order (Go randomizes it, Python's
        # upb follows a per-process hash seed) and the parsed dict keeps it.
        fp = _fingerprint("put", key, hashlib.sha256(_dump(body, sort_keys=True)).digest())
        # a first attempt served by an earlier build recorded the wire order's hash
        legacy = _fingerprint("put", key, hashlib.sha256(_dump(body)).digest())
        result = await self.requests.transact(
            tenant, request_id, fp, [], [Put(key, value)], note=str(stamped_ns), also=(legacy,)
        )
        if not result.replayed:
            return None
        try:
            return int(result.note)
        except ValueError:  # a marker written before the time was kept with it
            return 0

    # -- eval runs -------------------------------------------------------------
    async def put_run(
        self, tenant: str, agent: str, run_id: str, snapshot: JsonObject, request_id: str = ""
    ) -> EvalRun:
        key = self._run_key(tenant, agent, run_id)
        now = self.clock_ns()
        value = self._value({"v": _RECORD_VERSION, "run_id": run_id, "updated_ns": now, "body": snapshot}, "snapshot")
        first_ns = await self._write(tenant, request_id, key, value, snapshot, now)
        # a retry reports the first attempt: this snapshot (the fingerprint
        # matched) and the time it was stamped with, whatever was written since
        return EvalRun(run_id, snapshot, first_ns or now)

    async def get_run(self, tenant: str, agent: str, run_id: str) -> EvalRun:
        item = await self.storage.get(self._run_key(tenant, agent, run_id))
        if item is None:
            raise NotFound(
                reasons.EVAL_RUN_NOT_FOUND, f"no eval run {run_id!r} for agent {agent!r}",
                {"agent": agent, "run_id": run_id},
            )
        return _run(item)

    async def delete_run(self, tenant: str, agent: str, run_id: str, request_id: str = "") -> bool:
        key = self._run_key(tenant, agent, run_id)
        if not request_id:
            return await self.storage.delete(key)
        result = await self.requests.transact(
            tenant, request_id, _fingerprint("delete_run", key), [], [Delete(key, Expect(exists=True))]
        )
        return result.applied

    async def list_runs(
        self, tenant: str, agent: str, size: int, token: str, history_window: int = 0
    ) -> RunPage:
        if history_window < 0:
            raise InvalidArgument(
                reasons.FIELD_INVALID, f"history_window must not be negative (got {history_window})",
                {"history_window": history_window}, field="history_window",
            )
        prefix = self._runs_prefix(tenant, agent)
        limit = page_size(self.limits, size)
        listing = ("evals.list_runs", agent)
        after = await self.pages.resume(tenant, listing, token)
        pruned = 0
        if after is None:
            rows, pruned = await self._prune(prefix, history_window or self.history_window)
            rows = rows[: limit + 1]
            more = len(rows) > limit
        else:
            rows, more = await self._page(prefix, prefix + after, limit)
        rows = rows[:limit]
        # end the page before it outgrows one response (AIP-158: fewer than asked)
        cut = fits((len(r.value) + ENTRY_OVERHEAD for r in rows), self.limits.max_page_bytes)
        if cut is not None:
            rows, more = rows[:cut], True
        next_token = await self.pages.issue(tenant, listing, rows[-1].key[len(prefix):]) if more else ""
        return RunPage([_run(r) for r in rows], next_token, pruned)

    async def _page(self, prefix: str, after: str | None, limit: int) -> tuple[list[Item], bool]:
        """Up to `limit` + 1 rows, read no further than one response holds;
        whether more may follow."""
        budget = self.limits.max_page_bytes
        rows = await self.storage.list(prefix, after, limit + 1, max_bytes=budget)
        return rows, len(rows) > limit or over_budget(rows, budget)

    async def _prune(self, prefix: str, window: int) -> tuple[list[Item], int]:
        """Read every run, delete all but the `window` newest; the kept rows in key order."""
        rows: list[Item] = []
        after: str | None = None
        while True:
            batch = await self.storage.list(prefix, after, _READ_BATCH)
            rows.extend(batch)
            if len(batch) < _READ_BATCH:
                break
            after = batch[-1].key
        if len(rows) <= window:
            return rows, 0
        updated = {r.key: _run(r).updated_ns for r in rows}
        newest_first = sorted(rows, key=lambda r: (-updated[r.key], r.key))
        doomed = newest_first[window:]
        pruned = 0
        spared: dict[str, Item | None] = {}
        for row in doomed:
            # Conditioned on the version read: a run upserted meanwhile survives.
            try:
                deleted = await self.storage.delete_if_version(row.key, row.version)
            except PersistenceUncertain as exc:
                # the caller listed, it wrote nothing: a failed read, retried by listing again
                raise BackendUnavailable(f"pruning eval runs: {exc}; list again") from exc
            if deleted.applied:
                pruned += 1
            else:  # still stored (the listing returns every stored run): as it is now
                spared[row.key] = await self.storage.get(row.key)
        gone = {r.key for r in doomed}
        kept = [spared.get(r.key) if r.key in gone else r for r in rows]
        return [r for r in kept if r is not None], pruned

    # -- A/B samples -------------------------------------------------------------
    async def put_sample(
        self,
        tenant: str,
        agent: str,
        experiment: str,
        session_id: str,
        at_ns: int | None,
        sample: JsonObject,
        request_id: str = "",
    ) -> None:
        prefix = self._samples_prefix(tenant, agent, experiment)
        _require(session_id, "session_id")
        if at_ns is None:
            raise InvalidArgument(reasons.FIELD_INVALID, "at must be set", field="at")
        key = self._bounded(f"{prefix}{_segment(session_id, 'session_id')}/{format_at(at_ns)}")
        record = {
            "v": _RECORD_VERSION, "experiment": experiment, "session_id": session_id, "at_ns": at_ns, "body": sample,
        }
        await self._write(tenant, request_id, key, self._value(record, "sample"), sample)

    async def list_samples(
        self, tenant: str, agent: str, experiment: str, session_id: str, size: int, token: str
    ) -> SamplePage:
        prefix = self._samples_prefix(tenant, agent, experiment)
        if session_id:
            prefix = self._bounded(prefix + _segment(session_id, "session_id") + "/")
        limit = page_size(self.limits, size)
        listing = ("evals.list_samples", agent, experiment, session_id)
        after = await self.pages.resume(tenant, listing, token)
        rows, more = await self._page(prefix, prefix + after if after is not None else None, limit)
        rows = rows[:limit]
        cut = fits((len(r.value) + ENTRY_OVERHEAD for r in rows), self.limits.max_page_bytes)
        if cut is not None:
            rows, more = rows[:cut], True
        next_token = await self.pages.issue(tenant, listing, rows[-1].key[len(prefix):]) if more else ""
        return SamplePage([_sample(r) for r in rows], next_token)

    # -- A/B snapshot ------------------------------------------------------------
    async def put_snapshot(self, tenant: str, agent: str, snapshot: JsonObject, request_id: str = "") -> int:
        key = self._snapshot_key(tenant, agent)
        now = self.clock_ns()
        value = self._value({"v": _RECORD_VERSION, "updated_ns": now, "body": snapshot}, "snapshot")
        first_ns = await self._write(tenant, request_id, key, value, snapshot, now)
        return first_ns or now  # a retry reports the first attempt's time

    async def get_snapshot(self, tenant: str, agent: str) -> AbSnapshot | None:
        item = await self.storage.get(self._snapshot_key(tenant, agent))
        if item is None:
            return None
        record = json.loads(item.value)
        return AbSnapshot(record["body"], int(record["updated_ns"]))


def _run(item: Item) -> EvalRun:
    record = json.loads(item.value)
    return EvalRun(record["run_id"], record["body"], int(record["updated_ns"]))


def _sample(item: Item) -> AbSample:
    record = json.loads(item.value)
    return AbSample(record["experiment"], record["session_id"], int(record["at_ns"]), record["body"])
