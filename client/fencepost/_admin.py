"""AdminService methods of the async client: operator erasures (long-running operations)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from .v1 import admin_pb2 as pb
from .v1 import admin_pb2_grpc


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    done: bool
    agent: str  # "" for a whole tenant
    phase: str
    sessions_fenced: int
    items_erased: int


def _operation(op: pb.ErasureOperation) -> Operation:
    return Operation(op.name, op.done, op.agent, op.phase, op.sessions_fenced, op.items_erased)


class AdminMethods:
    _admin: admin_pb2_grpc.AdminServiceStub
    _caller: Any

    async def erase_agent(self, agent: str, *, request_id: str | None = None, **opts: Any) -> Operation:
        """Start erasing every key of `agent` (operator role); poll the operation."""
        req = pb.EraseAgentRequest(agent=agent, request_id=request_id or uuid.uuid4().hex)
        return _operation((await self._caller.call(self._admin.EraseAgent, req, safe=True, **opts)).operation)

    async def erase_tenant(self, *, request_id: str | None = None, **opts: Any) -> Operation:
        """Start erasing every key of the caller's tenant (operator role)."""
        req = pb.EraseTenantRequest(request_id=request_id or uuid.uuid4().hex)
        return _operation((await self._caller.call(self._admin.EraseTenant, req, safe=True, **opts)).operation)

    async def get_operation(self, name: str, **opts: Any) -> Operation:
        req = pb.GetOperationRequest(name=name)
        return _operation((await self._caller.call(self._admin.GetOperation, req, safe=True, **opts)).operation)

    async def wait_operation(self, name: str, *, poll: float = 0.2, **opts: Any) -> Operation:
        """Poll until the operation is done (bounded by the caller's own deadline)."""
        while True:
            op = await self.get_operation(name, **opts)
            if op.done:
                return op
            await asyncio.sleep(poll)
