"""EvalService methods of the async client: eval-run history and A/B metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from ._call import paged
from .v1 import evals_pb2, evals_pb2_grpc


@dataclass(frozen=True, slots=True)
class EvalRun:
    run_id: str
    snapshot: dict[str, Any]
    update_time: datetime


@dataclass(frozen=True, slots=True)
class AbSample:
    experiment: str
    session_id: str
    at: datetime
    sample: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AbSnapshot:
    snapshot: dict[str, Any]
    update_time: datetime


def _struct(obj: Mapping[str, Any] | None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    if obj:
        out.update(dict(obj))
    return out


def _obj(struct: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(struct)


def _time(ts: timestamp_pb2.Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=timezone.utc)


def _timestamp(at: datetime | None) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    if at is None:
        ts.GetCurrentTime()
    else:
        ts.FromDatetime(at if at.tzinfo else at.replace(tzinfo=timezone.utc))
    return ts


def _eval_run(run: evals_pb2.EvalRun) -> EvalRun:
    return EvalRun(run.run_id, _obj(run.snapshot), _time(run.update_time))


class EvalMethods:
    """Mixed into AsyncClient; `self._caller` and `self._evals` come from it.

    Every write here is idempotent (an upsert, a put of a deterministic key, or
    a last-write-wins snapshot), so each is retried on UNAVAILABLE."""

    _caller: Any
    _evals: evals_pb2_grpc.EvalServiceStub

    async def put_eval_run(
        self, agent: str, run_id: str, snapshot: Mapping[str, Any], *, request_id: str = "", **opts: Any
    ) -> EvalRun:
        """Upsert the snapshot (a JSON object) of one eval run."""
        req = evals_pb2.PutEvalRunRequest(agent=agent, run_id=run_id, snapshot=_struct(snapshot), request_id=request_id)
        return _eval_run((await self._caller.call(self._evals.PutEvalRun, req, safe=True, **opts)).run)

    async def get_eval_run(self, agent: str, run_id: str, **opts: Any) -> EvalRun:
        """One run; raises `errors.EvalRunNotFound` when there is none."""
        req = evals_pb2.GetEvalRunRequest(agent=agent, run_id=run_id)
        return _eval_run((await self._caller.call(self._evals.GetEvalRun, req, safe=True, **opts)).run)

    async def delete_eval_run(self, agent: str, run_id: str, *, request_id: str = "", **opts: Any) -> bool:
        """Remove one run; returns whether it existed."""
        req = evals_pb2.DeleteEvalRunRequest(agent=agent, run_id=run_id, request_id=request_id)
        return (await self._caller.call(self._evals.DeleteEvalRun, req, safe=True, **opts)).existed

    async def list_eval_runs_page(
        self, agent: str, *, page_size: int = 0, page_token: str = "", history_window: int = 0, **opts: Any
    ) -> tuple[list[EvalRun], str]:
        """One page of runs (run-id order) and the next page token ("" at the end).
        The first page prunes runs past `history_window` (0 = the server's window)."""
        req = evals_pb2.ListEvalRunsRequest(
            agent=agent, page_size=page_size, page_token=page_token, history_window=history_window
        )
        res = await self._caller.call(self._evals.ListEvalRuns, req, safe=True, **opts)
        return [_eval_run(r) for r in res.runs], res.next_page_token

    async def list_eval_runs(
        self, agent: str, *, page_size: int = 0, history_window: int = 0, **opts: Any
    ) -> AsyncIterator[EvalRun]:
        """Every stored run of `agent` (after pruning past the history window)."""
        async for run in paged(lambda token: self.list_eval_runs_page(
            agent, page_size=page_size, page_token=token, history_window=history_window, **opts
        )):
            yield run

    async def put_ab_sample(
        self,
        agent: str,
        experiment: str,
        session_id: str,
        sample: Mapping[str, Any],
        *,
        at: datetime | None = None,
        request_id: str = "",
        **opts: Any,
    ) -> None:
        """Append one A/B metric sample (`at` defaults to now; naive datetimes are UTC).
        Re-sending the same (experiment, session_id, at) overwrites that sample."""
        req = evals_pb2.PutAbSampleRequest(
            agent=agent, experiment=experiment, session_id=session_id, at=_timestamp(at),
            sample=_struct(sample), request_id=request_id,
        )
        await self._caller.call(self._evals.PutAbSample, req, safe=True, **opts)

    async def list_ab_samples_page(
        self, agent: str, experiment: str, *, session_id: str = "", page_size: int = 0, page_token: str = "",
        **opts: Any,
    ) -> tuple[list[AbSample], str]:
        req = evals_pb2.ListAbSamplesRequest(
            agent=agent, experiment=experiment, session_id=session_id, page_size=page_size, page_token=page_token
        )
        res = await self._caller.call(self._evals.ListAbSamples, req, safe=True, **opts)
        samples = [AbSample(s.experiment, s.session_id, _time(s.at), _obj(s.sample)) for s in res.samples]
        return samples, res.next_page_token

    async def list_ab_samples(
        self, agent: str, experiment: str, *, session_id: str = "", page_size: int = 0, **opts: Any
    ) -> AsyncIterator[AbSample]:
        """Every sample of `experiment` (optionally of one session), page by page."""
        async for sample in paged(lambda token: self.list_ab_samples_page(
            agent, experiment, session_id=session_id, page_size=page_size, page_token=token, **opts
        )):
            yield sample

    async def put_ab_snapshot(
        self, agent: str, snapshot: Mapping[str, Any], *, request_id: str = "", **opts: Any
    ) -> datetime:
        """Store the latest A/B aggregate (last write wins); returns its update time."""
        req = evals_pb2.PutAbSnapshotRequest(agent=agent, snapshot=_struct(snapshot), request_id=request_id)
        return _time((await self._caller.call(self._evals.PutAbSnapshot, req, safe=True, **opts)).update_time)

    async def get_ab_snapshot(self, agent: str, **opts: Any) -> AbSnapshot | None:
        """The latest A/B aggregate, or None when none was stored."""
        req = evals_pb2.GetAbSnapshotRequest(agent=agent)
        res = await self._caller.call(self._evals.GetAbSnapshot, req, safe=True, **opts)
        return AbSnapshot(_obj(res.snapshot), _time(res.update_time)) if res.found else None
