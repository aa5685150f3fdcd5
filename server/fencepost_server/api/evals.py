"""EvalService: decode, call the domain, encode."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from fencepost.v1 import evals_pb2, evals_pb2_grpc

from ..domain.evals import EvalRun, EvalStore
from .base import Authenticator, RpcObserver, ServicerBase, caller, unary
from .fields import check_json_struct, timestamp_micros


def _obj(struct: struct_pb2.Struct, field: str) -> dict[str, Any]:
    check_json_struct(struct, field)
    return json_format.MessageToDict(struct)


def _struct(obj: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(obj)
    return out


def _ts(ns: int) -> timestamp_pb2.Timestamp:
    seconds, nanos = divmod(ns, 1_000_000_000)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def _run(run: EvalRun) -> evals_pb2.EvalRun:
    return evals_pb2.EvalRun(run_id=run.run_id, snapshot=_struct(run.snapshot), update_time=_ts(run.updated_ns))


class EvalServicer(ServicerBase, evals_pb2_grpc.EvalServiceServicer):
    def __init__(self, evals: EvalStore, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.evals = evals

    @unary
    async def PutEvalRun(
        self, request: evals_pb2.PutEvalRunRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.PutEvalRunResponse:
        run = await self.evals.put_run(
            caller().tenant, request.agent, request.run_id, _obj(request.snapshot, "snapshot"), request.request_id
        )
        return evals_pb2.PutEvalRunResponse(run=_run(run))

    @unary
    async def GetEvalRun(
        self, request: evals_pb2.GetEvalRunRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.GetEvalRunResponse:
        run = await self.evals.get_run(caller().tenant, request.agent, request.run_id)
        return evals_pb2.GetEvalRunResponse(run=_run(run))

    @unary
    async def DeleteEvalRun(
        self, request: evals_pb2.DeleteEvalRunRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.DeleteEvalRunResponse:
        existed = await self.evals.delete_run(caller().tenant, request.agent, request.run_id, request.request_id)
        return evals_pb2.DeleteEvalRunResponse(existed=existed)

    @unary
    async def ListEvalRuns(
        self, request: evals_pb2.ListEvalRunsRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.ListEvalRunsResponse:
        page = await self.evals.list_runs(
            caller().tenant, request.agent, request.page_size, request.page_token, request.history_window
        )
        return evals_pb2.ListEvalRunsResponse(
            runs=[_run(r) for r in page.runs], next_page_token=page.next_page_token, pruned_count=page.pruned
        )

    @unary
    async def PutAbSample(
        self, request: evals_pb2.PutAbSampleRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.PutAbSampleResponse:
        # A Timestamp's nanos outside 0..999,999,999 would name the key of
        # another instant (seconds=0, nanos=1e9 is seconds=1): refused.
        at_ns = None if timestamp_micros(request, "at") is None \
            else request.at.seconds * 1_000_000_000 + request.at.nanos
        await self.evals.put_sample(
            caller().tenant, request.agent, request.experiment, request.session_id, at_ns,
            _obj(request.sample, "sample"), request.request_id,
        )
        return evals_pb2.PutAbSampleResponse()

    @unary
    async def ListAbSamples(
        self, request: evals_pb2.ListAbSamplesRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.ListAbSamplesResponse:
        page = await self.evals.list_samples(
            caller().tenant, request.agent, request.experiment, request.session_id,
            request.page_size, request.page_token,
        )
        samples = [
            evals_pb2.AbSample(
                experiment=s.experiment, session_id=s.session_id, at=_ts(s.at_ns), sample=_struct(s.sample)
            )
            for s in page.samples
        ]
        return evals_pb2.ListAbSamplesResponse(samples=samples, next_page_token=page.next_page_token)

    @unary
    async def PutAbSnapshot(
        self, request: evals_pb2.PutAbSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.PutAbSnapshotResponse:
        updated = await self.evals.put_snapshot(
            caller().tenant, request.agent, _obj(request.snapshot, "snapshot"), request.request_id
        )
        return evals_pb2.PutAbSnapshotResponse(update_time=_ts(updated))

    @unary
    async def GetAbSnapshot(
        self, request: evals_pb2.GetAbSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> evals_pb2.GetAbSnapshotResponse:
        snap = await self.evals.get_snapshot(caller().tenant, request.agent)
        if snap is None:
            return evals_pb2.GetAbSnapshotResponse(found=False)
        return evals_pb2.GetAbSnapshotResponse(
            found=True, snapshot=_struct(snap.snapshot), update_time=_ts(snap.updated_ns)
        )
