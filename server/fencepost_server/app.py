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
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fencepost.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    evals_pb2,
    evals_pb2_grpc,
    journal_pb2,
    journal_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    ledger_pb2,
    ledger_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
    store_api_pb2,
    store_api_pb2_grpc,
)

from .api.admin import AdminServicer
from .api.base import Authenticator, RpcObserver
from .api.recording import recorder_from_env
from .api.evals import EvalServicer
from .api.journal import JournalServicer, StoreApiServicer
from .api.kv import KvServicer
from .api.ledger import LedgerServicer
from .api.memory import MemoryServicer
from .api.schedule import ScheduleServicer
from .api.wire import tolerant_handlers
from .auth import DefaultTenantAuthenticator
from .config import Settings
from .domain.erasure import Eraser
from .domain.evals import EvalStore
from .domain.limits import Limits
from .domain.journal import Journal, JournalConfig
from .domain.kv import KvStore
from .domain.ledger import Ledger
from .domain.memory import MemoryStore
from .domain.paging import PageTokens, secret_from_file
from .domain.requests import RequestLog
from .domain.retention import Retention
from .domain.schedule import Schedule
from .observability import Metrics
from .reflection import enable_reflection
from .security import IdentityMap, build_authenticator
from .startup import StartFailure
from .storage import Storage, open_backend
from .storage.counting import ObservedStorage

log = logging.getLogger("fencepost")


@dataclass
class AppContext:
    """What a service needs to build its domain object and servicer."""

    settings: Settings
    storage: Storage
    auth: Authenticator
    observer: RpcObserver
    requests: RequestLog
    #: domain events for metrics: events("janitor.recovered"), events("journal.flush_lag_seconds", 3.2)
    events: Callable[..., None]
    #: page tokens under the deployment's key (shared by every replica of the backend)
    pages: PageTokens
    background: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    #: called when shutdown begins, before in-flight RPCs are drained (end long-polls)
    on_drain: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    #: called after the identity files were reloaded (long-polls re-check their caller)
    on_identities_reloaded: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    #: domain objects that more than one servicer serves (e.g. the journal's two lanes)
    shared: dict[str, Any] = field(default_factory=dict)
    #: the tenant names this server serves (retention names hashed tenant segments with them)
    tenants: Callable[[], set[str]] = set

    @property
    def limits(self) -> Limits:
        """The settings' limits, with a list page kept well inside the largest
        response this server may send (half of --max-receive-bytes)."""
        limits = self.settings.limits
        return replace(limits, max_page_bytes=min(limits.max_page_bytes, self.settings.max_receive_bytes // 2))


class HandlerRegistry:
    """What the generated `add_*_to_server` functions register into.

    grpc.aio's serving loop keeps one pending call request per *registered*
    method and runs `asyncio.wait` over all of them for every incoming RPC:
    with this server's ~70 methods that cost more than the handlers
    themselves. Generic handlers share one call request, so only they are
    registered. grpc then asks each generic handler in turn for every call,
    so every service's handler sits behind one (`_Services`), whose methods
    are found once and then with one dict hit per call, whatever the service.
    """

    def __init__(self, server: grpc.aio.Server) -> None:
        self._services = _Services()
        # Tolerant deserializers: undecodable bytes are refused by the servicer
        # with a documented reason, not answered UNKNOWN by grpc (api/wire.py).
        server.add_generic_rpc_handlers(tolerant_handlers([self._services]))

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._services.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """Covered by the generic handler registered alongside."""


class _Services(grpc.GenericRpcHandler):
    """The generic handlers of every service, asked in turn (the tolerant
    wrapper around it remembers what each method resolved to)."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        for handler in self.handlers:
            found = handler.service(handler_call_details)
            if found is not None:
                return found
        return None


ServiceBuilder = Callable[[AppContext, HandlerRegistry], str]


def _kv(ctx: AppContext, server: HandlerRegistry) -> str:
    kv = KvStore(ctx.storage, ctx.limits, ctx.requests, ctx.pages)
    kv_pb2_grpc.add_KvServiceServicer_to_server(KvServicer(kv, ctx.auth, ctx.observer), server)
    return kv_pb2.DESCRIPTOR.services_by_name["KvService"].full_name


def _evals(ctx: AppContext, server: HandlerRegistry) -> str:
    evals = EvalStore(
        ctx.storage, ctx.limits, ctx.requests, history_window=ctx.settings.eval_history_window,
        pages=ctx.pages,
    )
    evals_pb2_grpc.add_EvalServiceServicer_to_server(EvalServicer(evals, ctx.auth, ctx.observer), server)
    return evals_pb2.DESCRIPTOR.services_by_name["EvalService"].full_name


def _memory(ctx: AppContext, server: HandlerRegistry) -> str:
    memory = MemoryStore(ctx.storage, ctx.limits, pages=ctx.pages)
    memory_pb2_grpc.add_MemoryServiceServicer_to_server(MemoryServicer(memory, ctx.auth, ctx.observer), server)
    return memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


def _ledger_of(ctx: AppContext) -> Ledger:
    """The one Ledger the ledger and schedule services share (built once per
    AppContext, with one janitor)."""
    ledger: Ledger | None = ctx.shared.get("ledger")
    if ledger is None:
        ledger = Ledger(
            ctx.storage, ctx.limits, ctx.settings.ledger_config(), events=ctx.events, pages=ctx.pages
        )
        ctx.shared["ledger"] = ledger
        ctx.on_drain.append(ledger.janitor.drain)
        ctx.on_identities_reloaded.append(ledger.janitor.wake_claims)
        ctx.on_identities_reloaded.append(ledger.wake_watchers)
        if ctx.settings.ledger_janitor:
            ctx.background.append(ledger.janitor.run)
    return ledger


def _ledger(ctx: AppContext, server: HandlerRegistry) -> str:
    ledger = _ledger_of(ctx)
    ledger_pb2_grpc.add_LedgerServiceServicer_to_server(LedgerServicer(ledger, ctx.auth, ctx.observer), server)
    return ledger_pb2.DESCRIPTOR.services_by_name["LedgerService"].full_name


def _journal_of(ctx: AppContext) -> Journal:
    """The one Journal both journal lanes share (built once per AppContext,
    with one background flusher)."""
    journal: Journal | None = ctx.shared.get("journal")
    if journal is None:
        s = ctx.settings
        config = JournalConfig(
            flush_seconds=s.journal_flush_seconds, flush_bytes=s.journal_flush_bytes,
            # StoreApiService's memory.read answers the live journal in one
            # message: it rotates well inside the largest one this server sends
            max_journal_bytes=min(s.max_journal_bytes, s.max_receive_bytes // 2),
        )
        journal = Journal(
            ctx.storage, ctx.limits, config, requests=ctx.requests, pages=ctx.pages, events=ctx.events
        )
        ctx.shared["journal"] = journal
        ctx.background.append(journal.run_flusher)
    return journal


def _journal(ctx: AppContext, server: HandlerRegistry) -> str:
    servicer = JournalServicer(_journal_of(ctx), ctx.auth, ctx.observer)
    journal_pb2_grpc.add_JournalServiceServicer_to_server(servicer, server)
    return journal_pb2.DESCRIPTOR.services_by_name["JournalService"].full_name


def _store_api(ctx: AppContext, server: HandlerRegistry) -> str:
    servicer = StoreApiServicer(_journal_of(ctx), ctx.auth, ctx.observer)
    store_api_pb2_grpc.add_StoreApiServiceServicer_to_server(servicer, server)
    return store_api_pb2.DESCRIPTOR.services_by_name["StoreApiService"].full_name


def _schedule(ctx: AppContext, server: HandlerRegistry) -> str:
    s = ctx.settings
    schedule = Schedule(_ledger_of(ctx), clock=s.schedule_clock or time.time, watch_segment=s.schedule_watch_seconds)
    ctx.on_identities_reloaded.append(schedule.wake_watchers)
    ctx.on_drain.append(schedule.drain)
    schedule_pb2_grpc.add_ScheduleServiceServicer_to_server(ScheduleServicer(schedule, ctx.auth, ctx.observer), server)
    return schedule_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name


def _admin(ctx: AppContext, server: HandlerRegistry) -> str:
    """Lifecycle: the operator's erasures, and the retention sweeps (when enabled)."""
    s = ctx.settings
    # with the janitor off (benchmarks that count backend calls) nothing polls in the background
    poll = s.erasure_poll_seconds if s.ledger_janitor else None
    eraser = Eraser(ctx.storage, _ledger_of(ctx), poll_seconds=poll, events=ctx.events)
    ctx.background.append(eraser.run)
    retention = s.retention_config()
    if retention.enabled:
        sweeper = Retention(ctx.storage, _ledger_of(ctx), _journal_of(ctx), retention, events=ctx.events,
                            tenants=ctx.tenants)
        ctx.background.append(sweeper.run)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminServicer(eraser, ctx.auth, ctx.observer), server)
    return admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


# One line per service; each returns its full service name (for health + reflection).
_SERVICES: list[ServiceBuilder] = [
    _kv,
    _evals,
    _memory,
    _ledger,
    _journal,
    _store_api,
    _schedule,
    _admin,
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
        self.metrics = Metrics()
        self.identities: IdentityMap | None = None
        if auth is None and settings.auth_configured():
            auth, self.identities = build_authenticator(
                tokens_file=settings.tokens_file, spiffe_file=settings.spiffe_map,
                mtls=bool(settings.tls_client_ca), trust_xfcc=settings.trust_xfcc,
            )
        self.auth = auth or DefaultTenantAuthenticator(settings.default_tenant)
        self.observer = observer or self.metrics
        raw = storage or open_backend(settings.backend_url())
        #: how logs name the backend (a backend handed in by a test has no URL of its own)
        self.backend_label = settings.backend_url() if storage is None or settings.backend else type(raw).__name__
        self.storage: Storage = ObservedStorage(raw, self.metrics.backend_call)
        key_file = settings.page_token_key_file
        self.pages = (
            PageTokens.with_secret(secret_from_file(key_file)) if key_file else PageTokens.of_deployment(self.storage)
        )
        self.metrics_port: int | None = None
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.port: int | None = None
        self.service_names: list[str] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._on_drain: list[Callable[[], Awaitable[None]]] = []
        self._on_reload: list[Callable[[], Awaitable[None]]] = []
        self._reload_tasks: set[asyncio.Task[None]] = set()
        self._draining = False
        #: why the backend did not answer the last probe (None: it did)
        self.backend_problem: str | None = None

    async def start(self) -> int:
        """Bind, serve, and start the background loops. A failure leaves
        nothing running (the caller still owns and closes the backend)."""
        opts = [
            ("grpc.max_receive_message_length", self.settings.max_receive_bytes),
            ("grpc.max_send_message_length", self.settings.max_receive_bytes),
            ("grpc.so_reuseport", 1 if self.settings.reuse_port else 0),
        ]
        recorder = recorder_from_env()  # set by the test suite only (see api/recording.py)
        server = grpc.aio.server(options=opts, interceptors=[recorder] if recorder else None)
        registry = HandlerRegistry(server)
        ctx = AppContext(
            self.settings, self.storage, self.auth, self.observer, RequestLog(self.storage), self.metrics.event,
            self.pages, tenants=self.known_tenants,
        )
        self.service_names = [build(ctx, registry) for build in _SERVICES]
        self._on_drain = ctx.on_drain
        self._on_reload = ctx.on_identities_reloaded
        health_pb2_grpc.add_HealthServicer_to_server(self.health, registry)
        enable_reflection([*self.service_names, health.SERVICE_NAME], server)
        # NOT_SERVING until the first probe answered (grpc's default for the
        # whole server is SERVING): the port serves before the probe returns
        await self._set_serving(False)
        flag, listen = "--listen", self.settings.listen
        try:
            port = self._bind(server)
            if self.settings.metrics_listen:
                flag, listen = "--metrics-listen", self.settings.metrics_listen
                self.metrics_port = self.metrics.serve(listen)
            await server.start()
        except BaseException as exc:
            self.metrics.stop()
            await server.stop(0)
            if isinstance(exc, (OSError, RuntimeError)):
                # as check_listen says it (a name it could not tell apart from the
                # other flag's address, or a port taken since the check)
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise StartFailure(f"cannot listen on {listen} ({flag}): {reason}") from exc
            raise
        self.server, self.port = server, port
        # Health starts as the backend answers now: NOT_SERVING (with the
        # cause in the start-up line) until an unreachable backend answers.
        self.backend_problem = await self._probe_once()
        await self._set_serving(self.backend_problem is None)
        if self.backend_problem is not None:
            log.warning("backend %s not answering: %s", self.backend_label, self.backend_problem)
        loops = [*ctx.background, lambda: self._sweep_requests(ctx.requests), self._probe_backend]
        self._tasks = [asyncio.create_task(_guard(loop)) for loop in loops]
        return port

    def _bind(self, server: grpc.aio.Server) -> int:
        s = self.settings
        if s.tls_configured():
            assert s.tls_cert is not None and s.tls_key is not None
            creds = grpc.ssl_server_credentials(
                [(s.tls_key.read_bytes(), s.tls_cert.read_bytes())],
                root_certificates=s.tls_client_ca.read_bytes() if s.tls_client_ca else None,
                require_client_auth=bool(s.tls_client_ca),
            )
            port = server.add_secure_port(s.listen, creds)
        else:
            port = server.add_insecure_port(s.listen)
        if port == 0:
            raise StartFailure(f"cannot listen on {s.listen}")
        return port

    def known_tenants(self) -> set[str]:
        """The tenants this server can serve: the identity files' (as loaded now) and the default."""
        known = {self.settings.default_tenant}
        if self.identities is not None:
            known |= self.identities.tenants()
        return known

    def reload_identities(self) -> None:
        """SIGHUP: re-read the tokens file and SPIFFE map."""
        if self.identities is not None:
            self.identities.reload()
            for hook in self._on_reload:
                task = asyncio.get_running_loop().create_task(hook())
                self._reload_tasks.add(task)  # kept referenced until it ran
                task.add_done_callback(self._reload_tasks.discard)

    async def _set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def _probe_once(self) -> str | None:
        """None when the backend answers a cheap probe, else why not. (The
        first call may open connections: never less than 5 s to answer.)"""
        timeout = max(self.settings.health_probe_seconds, 5.0)
        try:
            await asyncio.wait_for(self.storage.ping(), timeout=timeout)
        except asyncio.TimeoutError:
            return f"no answer within {timeout:g}s"
        except Exception as exc:  # any failure means "not serving"
            return str(exc) or type(exc).__name__
        return None

    async def _probe_backend(self) -> None:
        """Health follows the backend: NOT_SERVING while the probe fails.
        Logged when it changes, and while it stays down at most once per
        `backend_warning_seconds` (an outage is not a log flood)."""
        healthy = self.backend_problem is None
        warned_at = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.health_probe_seconds)
            problem = await self._probe_once()
            now = time.monotonic()
            if problem is not None and (healthy or now - warned_at >= self.settings.backend_warning_seconds):
                log.warning("backend %s not answering: %s", self.backend_label, problem)
                warned_at = now
            elif problem is None and not healthy:
                log.warning("backend %s answers again; serving", self.backend_label)
            ok = problem is None
            self.backend_problem = problem
            if ok != healthy and not self._draining:
                healthy = ok
                await self._set_serving(ok)

    async def _sweep_requests(self, requests: RequestLog) -> None:
        while True:
            await asyncio.sleep(self.settings.request_sweep_seconds)
            with contextlib.suppress(Exception):
                self.metrics.event("retention.request_markers_erased", await requests.sweep())

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, drain in-flight RPCs, stop loops, close backend."""
        if self.server is None:
            return
        self._draining = True
        await self.health.enter_graceful_shutdown()
        for hook in self._on_drain:
            await hook()
        await self.server.stop(self.settings.grace_seconds if grace is None else grace)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.storage.close()
        self.metrics.stop()
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
