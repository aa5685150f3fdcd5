"""Wiring: backend -> domain -> servicers -> one grpc.aio server.

`App` is what `fencepost serve` runs and what the tests start on loopback.
Each service registers itself in `_SERVICES`; background loops (janitor,
journal flusher, request-id sweeper) are started with the server and stopped,
before the backend is closed, on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fencepost.v1 import journal_pb2, journal_pb2_grpc, kv_pb2, kv_pb2_grpc, store_api_pb2, store_api_pb2_grpc

from .api.base import Authenticator, NullObserver, RpcObserver
from .api.journal import JournalServicer, StoreApiServicer
from .api.kv import KvServicer
from .auth import DefaultTenantAuthenticator
from .config import Settings
from .domain.journal import Journal, JournalConfig
from .domain.kv import KvStore
from .domain.requests import RequestLog
from .storage import Storage, open_backend

log = logging.getLogger("fencepost")


@dataclass
class AppContext:
    """What a service needs to build its domain object and servicer."""

    settings: Settings
    storage: Storage
    auth: Authenticator
    observer: RpcObserver
    requests: RequestLog
    background: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


ServiceBuilder = Callable[[AppContext, grpc.aio.Server], str]


def _kv(ctx: AppContext, server: grpc.aio.Server) -> str:
    kv = KvStore(ctx.storage, ctx.settings.limits, ctx.requests)
    kv_pb2_grpc.add_KvServiceServicer_to_server(KvServicer(kv, ctx.auth, ctx.observer), server)
    return kv_pb2.DESCRIPTOR.services_by_name["KvService"].full_name


def _journal_of(ctx: AppContext) -> Journal:
    """The one Journal both journal lanes share (built once per AppContext,
    with one background flusher)."""
    journal: Journal | None = getattr(ctx, "_journal_domain", None)
    if journal is None:
        s = ctx.settings
        config = JournalConfig(
            flush_seconds=s.journal_flush_seconds, flush_bytes=s.journal_flush_bytes,
            max_journal_bytes=s.max_journal_bytes,
        )
        journal = Journal(ctx.storage, s.limits, config)
        ctx._journal_domain = journal  # type: ignore[attr-defined]
        ctx.background.append(journal.run_flusher)
    return journal


def _journal(ctx: AppContext, server: grpc.aio.Server) -> str:
    servicer = JournalServicer(_journal_of(ctx), ctx.auth, ctx.observer)
    journal_pb2_grpc.add_JournalServiceServicer_to_server(servicer, server)
    return journal_pb2.DESCRIPTOR.services_by_name["JournalService"].full_name


def _store_api(ctx: AppContext, server: grpc.aio.Server) -> str:
    servicer = StoreApiServicer(_journal_of(ctx), ctx.auth, ctx.observer)
    store_api_pb2_grpc.add_StoreApiServiceServicer_to_server(servicer, server)
    return store_api_pb2.DESCRIPTOR.services_by_name["StoreApiService"].full_name


# One line per service; each returns its full service name (for health + reflection).
_SERVICES: list[ServiceBuilder] = [
    _kv,
    _journal,
    _store_api,
]


class App:
    def __init__(
        self,
        settings: Settings,
        *,
        storage: Storage | None = None,
        auth: Authenticator | None = None,
        observer: RpcObserver | None = None,
    ) -> None:
        self.settings = settings
        self.storage = storage or open_backend(settings.backend_url())
        self.auth = auth or DefaultTenantAuthenticator(settings.default_tenant)
        self.observer = observer or NullObserver()
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.port: int | None = None
        self.service_names: list[str] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._draining = False

    async def start(self) -> int:
        opts = [
            ("grpc.max_receive_message_length", self.settings.max_receive_bytes),
            ("grpc.max_send_message_length", self.settings.max_receive_bytes),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=opts)
        ctx = AppContext(
            self.settings, self.storage, self.auth, self.observer, RequestLog(self.storage)
        )
        self.service_names = [build(ctx, server) for build in _SERVICES]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        port = server.add_insecure_port(self.settings.listen)
        if port == 0:
            raise OSError(f"cannot listen on {self.settings.listen}")
        await server.start()
        self.server, self.port = server, port
        await self._set_serving(True)
        loops = [*ctx.background, lambda: self._sweep_requests(ctx.requests), self._probe_backend]
        self._tasks = [asyncio.create_task(_guard(loop)) for loop in loops]
        return port

    async def _set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def _probe_backend(self) -> None:
        """Health follows the backend: NOT_SERVING while a cheap probe fails."""
        healthy = True
        while True:
            await asyncio.sleep(self.settings.health_probe_seconds)
            try:
                await asyncio.wait_for(self.storage.ping(), timeout=self.settings.health_probe_seconds)
                ok = True
            except Exception as exc:  # any failure means "not serving"
                ok = False
                if healthy:
                    log.warning("backend probe failed: %s", exc)
            if ok != healthy and not self._draining:
                healthy = ok
                await self._set_serving(ok)

    async def _sweep_requests(self, requests: RequestLog) -> None:
        while True:
            await asyncio.sleep(self.settings.request_sweep_seconds)
            with contextlib.suppress(Exception):
                await requests.sweep()

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, drain in-flight RPCs, stop loops, close backend."""
        if self.server is None:
            return
        self._draining = True
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.settings.grace_seconds if grace is None else grace)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.storage.close()
        self.server = None

    async def wait(self) -> None:
        if self.server is not None:
            await self.server.wait_for_termination()


async def _guard(loop: Callable[[], Awaitable[None]]) -> None:
    """Run a background loop; a crash is logged, never silent, and restarted."""
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background loop %s crashed; restarting in 1s", getattr(loop, "__name__", loop))
            await asyncio.sleep(1.0)
