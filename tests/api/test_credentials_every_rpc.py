"""Credentials, checked as an outside caller sees them, on every RPC of every
service and on every backend: no, malformed, unknown and revoked tokens are
UNAUTHENTICATED (ErrorInfo reason UNAUTHENTICATED, domain fencepost.dev) and
write nothing; health and reflection stay open; a role taken away by a reload
is gone on the next call; request ids and operations are per tenant, and a
service token cannot replay an operator's write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fencepost import reasons
from fencepost.v1 import memory_pb2
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage import Item, Storage
from tests.api.security_support import SERVICES, TOKENS, Rpc, write_tokens
from tests.api.test_roles import OPERATOR_ONLY


def _error_info(exc: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    info = error_details_pb2.ErrorInfo()
    raw = dict(exc.trailing_metadata() or ()).get("grpc-status-details-bin")
    if raw:
        for detail in status_pb2.Status.FromString(raw).details:
            if detail.Unpack(info):
                break
    return info


async def _outcome(rpc: Rpc, rpc_name: str, /, **fields: Any) -> tuple[str, str, str, dict[str, str]]:
    """(code, reason, domain, metadata) of one call; ("OK", "", "", {}) when it succeeded."""
    try:
        await rpc(rpc_name, **fields)
    except grpc.aio.AioRpcError as exc:
        info = _error_info(exc)
        return exc.code().name, info.reason, info.domain, dict(info.metadata)
    return "OK", "", "", {}


class _Raw(Rpc):
    """An Rpc that sends exactly the given metadata (a malformed authorization)."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        super().__init__(channel)
        self.metadata = metadata


async def _snapshot(storage: Storage) -> list[Item]:
    return await storage.list("", None, 1_000_000)


@pytest.fixture
async def secured(tmp_path: Path, storage: Storage) -> AsyncIterator[tuple[App, grpc.aio.Channel, Path]]:
    tokens = write_tokens(tmp_path / "tokens.json")
    app = App(Settings(listen="127.0.0.1:0", tokens_file=tokens), storage=storage)
    await app.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        yield app, channel, tokens
    await app.stop(grace=0.2)


UNAUTHENTICATED = ("UNAUTHENTICATED", reasons.UNAUTHENTICATED, reasons.DOMAIN)


async def test_every_rpc_refuses_bad_credentials_and_writes_nothing(
    secured: tuple[App, grpc.aio.Channel, Path], storage: Storage
) -> None:
    app, channel, tokens = secured
    await Rpc(channel, "token-tenant-b")("KvService/Put", key="b-key", value=b"b")
    # token-tenant-b is revoked by a reload; every other token keeps its identity
    write_tokens(tokens, {t: who for t, who in TOKENS.items() if t != "token-tenant-b"})
    app.reload_identities()
    callers = {
        "none": Rpc(channel),
        "unknown": Rpc(channel, "no-such-token"),
        "revoked": Rpc(channel, "token-tenant-b"),
        "prefix of a token": Rpc(channel, "token-tenant"),
        "empty bearer": _Raw(channel, (("authorization", "Bearer "),)),
        "other scheme": _Raw(channel, (("authorization", "Basic token-tenant-a"),)),
        "no scheme": _Raw(channel, (("authorization", "token-tenant-a"),)),
        "token then junk": _Raw(channel, (("authorization", "Bearer token-tenant-a junk"),)),
        # two authorization headers are ambiguous, even when both name a valid token
        "two tokens": _Raw(channel, (("authorization", "Bearer token-tenant-a"),
                                     ("authorization", "Bearer token-operator-a"))),
        "one token twice": _Raw(channel, (("authorization", "Bearer token-tenant-a"),
                                          ("authorization", "Bearer token-tenant-a"))),
        # the identity header of a sidecar is not trusted unless enabled
        "forwarded cert only": _Raw(channel, (("x-forwarded-client-cert", "URI=spiffe://corp/tenant-a"),)),
    }
    before = await _snapshot(storage)
    wrong: dict[str, Any] = {}
    for label, rpc in callers.items():
        for service in SERVICES.values():
            for method in service.methods:
                name = f"{service.name}/{method.name}"
                got = await _outcome(rpc, name)
                if got[:3] != UNAUTHENTICATED:
                    wrong[f"{label}: {name}"] = got
    assert wrong == {}
    assert await _snapshot(storage) == before
    # health and reflection need no credentials
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    info = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name async for r in info for s in r.list_services_response.service}
    assert {s.full_name for s in SERVICES.values()} <= names


async def test_a_role_taken_away_by_a_reload_is_gone_on_the_next_call(
    secured: tuple[App, grpc.aio.Channel, Path],
) -> None:
    app, channel, tokens = secured
    operator = Rpc(channel, "token-operator-a")
    assert (await _outcome(operator, "MemoryService/Audit", agent_id="ag"))[0] == "OK"
    write_tokens(tokens, {**TOKENS, "token-operator-a": ("tenant-a", "service")})
    app.reload_identities()
    denied = ("PERMISSION_DENIED", reasons.PERMISSION_DENIED, reasons.DOMAIN, {"role": "service"})
    # each operator-only RPC, with an empty request: the role is checked before the fields
    assert {name: await _outcome(operator, name) for name in sorted(OPERATOR_ONLY)} == dict.fromkeys(
        sorted(OPERATOR_ONLY), denied)
    label = memory_pb2.MemoryProvenance(trust=memory_pb2.MEMORY_TRUST_OPERATOR)
    assert await _outcome(operator, "MemoryService/Append", agent_id="ag", content="c", provenance=label) == denied


async def test_request_ids_and_operations_belong_to_their_tenant(
    secured: tuple[App, grpc.aio.Channel, Path],
) -> None:
    _, channel, _ = secured
    a, b = Rpc(channel, "token-tenant-a"), Rpc(channel, "token-tenant-b")
    op_a, op_b = Rpc(channel, "token-operator-a"), Rpc(channel, "token-operator-b")
    # B's write under A's request id is B's own write, applied, not A's outcome replayed
    await a("KvService/Put", key="k", value=b"a", request_id="rid-1")
    await b("KvService/Put", key="k", value=b"b", request_id="rid-1")
    assert (await b("KvService/Get", key="k")).value == b"b"
    assert (await a("KvService/Get", key="k")).value == b"a"
    # an erasure started with A's request id by B is another operation, A's is not B's to read
    started_a = (await op_a("AdminService/EraseAgent", agent="gone", request_id="op-1")).operation.name
    started_b = (await op_b("AdminService/EraseAgent", agent="gone", request_id="op-1")).operation.name
    assert started_a != started_b
    assert await _outcome(op_b, "AdminService/GetOperation", name=started_a) == (
        "NOT_FOUND", reasons.OPERATION_NOT_FOUND, reasons.DOMAIN, {"name": started_a})
    # a service token replaying an operator's labelled append (same request id) is refused,
    # not handed the operator's outcome
    label = memory_pb2.MemoryProvenance(trust=memory_pb2.MEMORY_TRUST_OPERATOR)
    await op_a("MemoryService/Append", agent_id="ag", content="said by ops", provenance=label, request_id="m-1")
    assert await _outcome(a, "MemoryService/Append", agent_id="ag", content="said by ops", provenance=label,
                          request_id="m-1") == (
        "PERMISSION_DENIED", reasons.PERMISSION_DENIED, reasons.DOMAIN, {"role": "service"})
