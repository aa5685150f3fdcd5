"""Prometheus metrics (on their own port) and structured JSON logs.

Never logged: payloads, values, tokens, certificates. An RPC log line carries
method, status code, reason, duration and tenant only.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .api.base import caller_or_none

rpc_log = logging.getLogger("fencepost.rpc")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LEASE_EVENTS = {"LEASE_HELD": "conflict", "LEASE_FENCED": "fencing"}
_GRANTING_RPCS = ("AcquireLease", "ClaimOrphan")


class Metrics:
    """All of fencepost's metrics in one registry (one per App, so tests can
    run several servers in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpcs = Counter("fencepost_rpcs_total", "RPCs served", ["method", "code"], registry=r)
        self.rpc_seconds = Histogram("fencepost_rpc_seconds", "RPC latency", ["method"],
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.errors = Counter("fencepost_rpc_errors_total", "RPC errors by ErrorInfo reason",
                              ["method", "reason"], registry=r)
        self.backend_calls = Counter("fencepost_backend_calls_total", "backend round trips",
                                     ["operation", "outcome"], registry=r)
        self.backend_seconds = Histogram("fencepost_backend_seconds", "backend round-trip latency",
                                         ["operation"], buckets=_LATENCY_BUCKETS, registry=r)
        self.lease_events = Counter("fencepost_lease_events_total", "lease grants, conflicts and fencings",
                                    ["event"], registry=r)
        self.janitor = Counter("fencepost_janitor_findings_total", "what the janitor found and did",
                               ["kind"], registry=r)
        self.oldest_pending = Gauge("fencepost_janitor_oldest_pending_seconds",
                                    "age of the oldest pending inbox event seen by the janitor", registry=r)
        self.lifecycle = Counter("fencepost_lifecycle_total",
                                 "erasures and retention sweeps: sessions deleted, items erased, "
                                 "operations started / finished, expired items swept",
                                 ["kind"], registry=r)
        self.flush_lag = Gauge("fencepost_journal_flush_lag_seconds",
                               "age of the oldest unflushed journal record at the last flush", registry=r)
        self._http: Any = None
        # labels() costs a lock and a dict lookup per call: keep the children.
        self._rpc_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._backend_children: dict[tuple[str, bool], tuple[Any, Any]] = {}

    # -- RpcObserver -------------------------------------------------------
    def rpc_done(self, method: str, code: str, reason: str, seconds: float) -> None:
        children = self._rpc_children.get((method, code))
        if children is None:
            children = self._rpc_children[(method, code)] = (
                self.rpcs.labels(method, code), self.rpc_seconds.labels(method))
        children[0].inc()
        children[1].observe(seconds)
        if reason:
            self.errors.labels(method, reason).inc()
            if reason in _LEASE_EVENTS:
                self.lease_events.labels(_LEASE_EVENTS[reason]).inc()
        elif code == "OK" and method.endswith(_GRANTING_RPCS):
            self.lease_events.labels("grant").inc()
        if rpc_log.isEnabledFor(logging.DEBUG):
            who = caller_or_none()
            rpc_log.debug("rpc", extra={"method": method, "code": code, "reason": reason,
                                        "duration_ms": round(seconds * 1e3, 3),
                                        "tenant": who.tenant if who else None})

    # -- storage hook ----------------------------------------------------------
    def backend_call(self, op: str, seconds: float, error: BaseException | None) -> None:
        key = (op, error is None)
        children = self._backend_children.get(key)
        if children is None:
            children = self._backend_children[key] = (
                self.backend_calls.labels(op, "ok" if error is None else "error"), self.backend_seconds.labels(op))
        children[0].inc()
        children[1].observe(seconds)

    # -- domain events -----------------------------------------------------------
    def event(self, name: str, value: float = 1.0) -> None:
        """Domain events by name: `janitor.<kind>`, `janitor.oldest_pending_seconds`,
        `journal.flush_lag_seconds`, `lease.<grant|conflict|fencing>`, and the
        lifecycle's `ledger.sessions_deleted`, `ledger.erased_items`,
        `erasure.<started|finished>`, `retention.<kind>`."""
        group, _, kind = name.partition(".")
        if group == "janitor" and kind == "oldest_pending_seconds":
            self.oldest_pending.set(value)
        elif group == "janitor":
            self.janitor.labels(kind).inc(value)
        elif group == "journal" and kind == "flush_lag_seconds":
            self.flush_lag.set(value)
        elif group == "lease":
            self.lease_events.labels(kind).inc(value)
        elif group in ("ledger", "erasure", "retention"):
            self.lifecycle.labels(name).inc(value)

    def serve(self, listen: str) -> int:
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        self._http = server
        return server.server_port

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `extra={...}` fields are included."""

    _STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update({k: v for k, v in vars(record).items() if k not in self._STANDARD})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)
