"""Where a call's server CPU goes, layer by layer (docs/performance.md).

The grpc transport's share is the floor's CPU per call (a KvService that
stores nothing, bench/echo_server.py; bench/kv.py prints it). Everything fencepost adds on top runs in the method handler the
server looks up for the call, so that is driven here in process, without
gRPC, 64 calls in flight on the event loop, and timed as CPU per call
(`time.process_time`, which includes the SQLite writer thread) in variants
that each leave one layer out:

    full        decode + handler (interceptor, auth, metrics, servicer, domain, backend) + encode
    no metrics  the same with a null observer and the backend unobserved
    servicer    the undecorated servicer method (no interceptor, auth or metrics) on the bare backend
    backend     only the backend calls the op makes (KV ops)

    python -m bench breakdown       (FENCEPOST_BENCH_OPS=put,commit for some ops only)
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from fencepost.v1 import journal_pb2, kv_pb2, ledger_pb2
from fencepost_server import app as app_module
from fencepost_server.api.base import NullObserver, _caller
from fencepost_server.api.wire import tolerant_handlers
from fencepost_server.auth import DefaultTenantAuthenticator
from fencepost_server.config import Settings
from fencepost_server.domain.paging import PageTokens
from fencepost_server.domain.requests import RequestLog
from fencepost_server.observability import Metrics
from fencepost_server.storage import Storage
from fencepost_server.storage.counting import ObservedStorage
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.storage.sqlite import SqliteStorage

from .harness import Reporter

IN_FLIGHT = 64
CALLS = 3000
VALUE = b"v" * 200


class _Handlers:
    """Collects the generic handlers the services register, and finds a method's."""

    def __init__(self) -> None:
        self.generic: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(tolerant_handlers(handlers))  # as app.HandlerRegistry registers them

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass

    def find(self, method: str) -> grpc.RpcMethodHandler:
        details = type("Details", (), {"method": method, "invocation_metadata": ()})()
        for h in self.generic:
            found = h.service(details)  # type: ignore[arg-type]
            if found is not None:
                return found
        raise KeyError(method)


def _handlers(storage: Storage, metrics: bool) -> _Handlers:
    observed: Storage = storage
    observer: Any = NullObserver()
    if metrics:
        m = Metrics()
        observed, observer = ObservedStorage(storage, m.backend_call), m
    settings = Settings(ledger_janitor=False)
    ctx = app_module.AppContext(settings, observed, DefaultTenantAuthenticator(), observer, RequestLog(observed),
                                lambda *a: None, PageTokens.of_deployment(observed))
    registry = _Handlers()
    for build in app_module._SERVICES:
        build(ctx, registry)  # type: ignore[arg-type]
    return registry


async def _cpu_per_call(call: Callable[[int], Awaitable[Any]]) -> float:
    """CPU µs per call, IN_FLIGHT callers; caller `slot` issues slot, slot + IN_FLIGHT, ..."""
    for i in range(IN_FLIGHT * 4):  # warm caches, statements, first-use paths
        await call(i)
    per = CALLS // IN_FLIGHT

    async def caller(slot: int) -> None:
        for k in range(per):
            await call(slot + IN_FLIGHT * (k + 4))

    started = time.process_time()
    await asyncio.gather(*(caller(s) for s in range(IN_FLIGHT)))
    return (time.process_time() - started) / (per * IN_FLIGHT) * 1e6


class _Ops:
    """One op's request per call index, and what it needs set up first."""

    def __init__(self, h: _Handlers) -> None:
        self.h = h
        self.state: dict[str, Any] = {}

    async def unary(self, method: str, request: Any) -> Any:
        handler = self.h.find(method)
        return await handler.unary_unary(request, None)  # type: ignore[misc]

    async def setup(self) -> None:
        tag = uuid.uuid4().hex[:8]
        sids, gens = [], []
        for s in range(IN_FLIGHT):
            res = await self.unary("/fencepost.v1.LedgerService/OpenSession",
                                   ledger_pb2.OpenSessionRequest(agent="bench", session_key=f"{tag}-{s}"))
            sid = res.session.session_id
            lease = await self.unary("/fencepost.v1.LedgerService/AcquireLease", ledger_pb2.AcquireLeaseRequest(
                session_id=sid, holder_id="bench", ttl=duration_pb2.Duration(seconds=600)))
            sids.append(sid)
            gens.append(lease.lease.generation)
        self.state.update(sids=sids, gens=gens, seqs=[0] * IN_FLIGHT, versions={})
        for s in range(IN_FLIGHT):
            put = await self.unary("/fencepost.v1.KvService/Put", kv_pb2.PutRequest(key=f"cas/{s}", value=VALUE))
            self.state["versions"][s] = put.version

    def requests(self) -> dict[str, tuple[str, Callable[[int], Any], Callable[[int, Any], None] | None]]:
        st = self.state
        ttl = duration_pb2.Duration(seconds=600)

        def cas_done(i: int, res: Any) -> None:
            st["versions"][i % IN_FLIGHT] = res.version

        def acquire_done(i: int, res: Any) -> None:
            st["gens"][i % IN_FLIGHT] = res.lease.generation
            st["seqs"][i % IN_FLIGHT] = st["seqs"][i % IN_FLIGHT]

        def commit_done(i: int, res: Any) -> None:
            st["seqs"][i % IN_FLIGHT] = res.seq

        kv, ledger = "/fencepost.v1.KvService/", "/fencepost.v1.LedgerService/"
        return {
            "put": (kv + "Put", lambda i: kv_pb2.PutRequest(key=f"bench/{i % 1000}", value=VALUE), None),
            "get": (kv + "Get", lambda i: kv_pb2.GetRequest(key=f"bench/{i % 1000}"), None),
            "cas": (kv + "PutIfVersion", lambda i: kv_pb2.PutIfVersionRequest(
                key=f"cas/{i % IN_FLIGHT}", value=VALUE, expected_version=st["versions"][i % IN_FLIGHT]), cas_done),
            "cas (request id)": (kv + "PutIfVersion", lambda i: kv_pb2.PutIfVersionRequest(
                key=f"cas/{i % IN_FLIGHT}", value=VALUE, expected_version=st["versions"][i % IN_FLIGHT],
                request_id=os.urandom(16).hex()), cas_done),
            "commit": (ledger + "Commit", lambda i: ledger_pb2.CommitRequest(
                session_id=st["sids"][i % IN_FLIGHT], generation=st["gens"][i % IN_FLIGHT],
                expected_seq=st["seqs"][i % IN_FLIGHT], records=[VALUE], commit_id=os.urandom(16).hex()), commit_done),
            "deliver": (ledger + "Deliver", lambda i: ledger_pb2.DeliverRequest(
                session_id=st["sids"][i % IN_FLIGHT], payload=VALUE), None),
            "renew": (ledger + "RenewLease", lambda i: ledger_pb2.RenewLeaseRequest(
                session_id=st["sids"][i % IN_FLIGHT], generation=st["gens"][i % IN_FLIGHT], ttl=ttl,
                holder_id="bench"), None),
            "acquire": (ledger + "AcquireLease", lambda i: ledger_pb2.AcquireLeaseRequest(
                session_id=st["sids"][i % IN_FLIGHT], holder_id="bench", ttl=ttl), acquire_done),
            "journal append": ("/fencepost.v1.JournalService/AppendTurn", lambda i: journal_pb2.AppendTurnRequest(
                agent=f"bench-{i % 8}", request_id=os.urandom(16).hex(), record=journal_pb2.TurnRecord(
                    at="2026-01-01T00:00:00Z", session_id=f"s{i}", channel_id="c", status=1,
                    user_message="x" * 150)), None),
        }


def _variant(ops: _Ops, name: str, kind: str) -> Callable[[int], Awaitable[Any]]:
    method, make, done = ops.requests()[name]
    handler = ops.h.find(method)
    fn = handler.unary_unary
    if kind == "servicer":
        fn = fn.__wrapped__.__get__(fn.__self__)  # type: ignore[attr-defined]
    decode, encode = handler.request_deserializer, handler.response_serializer

    async def call(i: int) -> None:
        request = make(i)
        if kind == "full":
            request = decode(request.SerializeToString())  # type: ignore[misc]
        res = await fn(request, None)  # type: ignore[misc]
        if kind == "full":
            encode(res)  # type: ignore[misc]
        if done is not None:
            done(i, res)

    return call


def _backend_call(storage: Storage, name: str, versions: dict[int, str]) -> Callable[[int], Awaitable[Any]] | None:
    async def put(i: int) -> None:
        await storage.put(f"default/kv/bench/{i % 1000}", VALUE)

    async def get(i: int) -> None:
        await storage.get(f"default/kv/bench/{i % 1000}")

    async def cas(i: int) -> None:
        res = await storage.put_if_version(f"default/kv/bcas/{i % IN_FLIGHT}", VALUE, versions[i % IN_FLIGHT])
        versions[i % IN_FLIGHT] = res.version or versions[i % IN_FLIGHT]

    return {"put": put, "get": get, "cas": cas}.get(name)


async def _breakdown(report: Reporter, backend: str, open_storage: Callable[[], Storage]) -> None:
    storage = open_storage()
    try:
        _caller.set(DefaultTenantAuthenticator()._caller)  # the servicer variant runs without the interceptor
        with_metrics, without = _Ops(_handlers(storage, True)), _Ops(_handlers(storage, False))
        await with_metrics.setup()
        without.state = with_metrics.state
        versions = {s: await storage.put(f"default/kv/bcas/{s}", VALUE) for s in range(IN_FLIGHT)}
        only = os.environ.get("FENCEPOST_BENCH_OPS", "")
        for name in with_metrics.requests():
            if only and name not in only.split(","):
                continue
            full = await _cpu_per_call(_variant(with_metrics, name, "full"))
            bare = await _cpu_per_call(_variant(without, name, "full"))
            servicer = await _cpu_per_call(_variant(without, name, "servicer"))
            backend_only = _backend_call(storage, name, versions)
            figures: dict[str, object] = {
                "handler_us": round(full), "metrics_us": round(full - bare),
                "interceptor_auth_codec_us": round(bare - servicer), "servicer_domain_backend_us": round(servicer),
            }
            if backend_only is not None:
                backend_us = await _cpu_per_call(backend_only)
                figures.update(domain_us=round(servicer - backend_us), backend_us=round(backend_us))
            report(f"server CPU per call {backend} {name}", **figures)
    finally:
        await storage.close()


async def run(report: Reporter) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await _breakdown(report, "memory", MemoryStorage)
        await _breakdown(report, "sqlite", lambda: SqliteStorage(Path(tmp) / "breakdown.db"))
