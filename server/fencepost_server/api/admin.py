"""AdminService: the operator's erasures, as long-running operations (decode, call the domain, encode)."""

from __future__ import annotations

import grpc
from google.protobuf import timestamp_pb2

from fencepost.v1 import admin_pb2 as pb
from fencepost.v1 import admin_pb2_grpc

from ..domain.erasure import Eraser, OperationView
from .base import Authenticator, RpcObserver, ServicerBase, require_operator, unary


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _operation(op: OperationView) -> pb.ErasureOperation:
    return pb.ErasureOperation(
        name=op.name, done=op.done, agent=op.agent, phase=op.phase, sessions_fenced=op.sessions_fenced,
        items_erased=op.items_erased, create_time=_ts(op.created), update_time=_ts(op.updated),
    )


class AdminServicer(ServicerBase, admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, eraser: Eraser, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.eraser = eraser

    @unary
    async def EraseAgent(self, request: pb.EraseAgentRequest, context: grpc.aio.ServicerContext) -> pb.EraseAgentResponse:
        who = require_operator("EraseAgent")
        op = await self.eraser.start(who.tenant, request.agent, request.request_id)
        return pb.EraseAgentResponse(operation=_operation(op))

    @unary
    async def EraseTenant(
        self, request: pb.EraseTenantRequest, context: grpc.aio.ServicerContext
    ) -> pb.EraseTenantResponse:
        who = require_operator("EraseTenant")
        op = await self.eraser.start(who.tenant, None, request.request_id)
        return pb.EraseTenantResponse(operation=_operation(op))

    @unary
    async def GetOperation(
        self, request: pb.GetOperationRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetOperationResponse:
        who = require_operator("GetOperation")
        return pb.GetOperationResponse(operation=_operation(await self.eraser.get(who.tenant, request.name)))
