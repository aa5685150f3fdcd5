"""Prometheus metrics (on their own port) and structured JSON logs.

Never logged: payloads, values, tokens, certificates. An RPC log line carries
method, status code, reason, duration and tenant only.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from .api.base import caller_or_none

rpc_log = logging.getLogger("fencepost.rpc")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LEASE_EVENTS = {"LEASE_HELD": "conflict", "LEASE_FENCED": "fencing"}
_GRANTING_RPCS = ("AcquireLease", "ClaimOrphan")


class _Timings:
    """A call counter and a latency histogram per label set, for the two
    series touched on every RPC (RPCs and backend calls). prometheus_client
    takes a lock per counter and per histogram update; here an observation is
    one bisect and two list increments on the event loop, and the series are
    rendered when scraped (a registered collector), under the same names,
    labels and buckets as a Counter + Histogram pair would have."""

    def __init__(self, count_name: str, count_help: str, count_labels: tuple[str, ...],
                 time_name: str, time_help: str, time_labels: tuple[str, ...]) -> None:
        self._count = (count_name, count_help, count_labels)
        self._time = (time_name, time_help, time_labels)
        self._calls: dict[tuple[str, ...], list[int]] = {}
        # per time label set: one count per bucket (+Inf last), then the sum
        self._hist: dict[tuple[str, ...], list[float]] = {}

    def series(self, count_labels: tuple[str, ...], time_labels: tuple[str, ...]) -> tuple[list[int], list[float]]:
        """The (counter, histogram) cells of one label set, made on first use."""
        calls = self._calls.setdefault(count_labels, [0])
        hist = self._hist.setdefault(time_labels, [0.0] * (len(_LATENCY_BUCKETS) + 2))
        return calls, hist

    @staticmethod
    def observe(cells: tuple[list[int], list[float]], seconds: float) -> None:
        calls, hist = cells
        calls[0] += 1
        hist[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        hist[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        name, doc, labels = self._count
        counter = CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels)
        for values, cell in list(self._calls.items()):
            counter.add_metric(list(values), cell[0])
        yield counter
        name, doc, labels = self._time
        histogram = HistogramMetricFamily(name, doc, labels=labels)
        for values, cells in list(self._hist.items()):
            cells = list(cells)
            cumulative, buckets = 0.0, []
            for bound, n in zip((*_LATENCY_BUCKETS, float("inf")), cells[:-1]):
                cumulative += n
                buckets.append((_bound(bound), cumulative))
            histogram.add_metric(list(values), buckets, cells[-1])
        yield histogram


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class Metrics:
    """All of fencepost's metrics in one registry (one per App, so tests can
    run several servers in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpcs = _Timings("fencepost_rpcs_total", "RPCs served", ("method", "code"),
                             "fencepost_rpc_seconds", "RPC latency", ("method",))
        r.register(self.rpcs)
        self.errors = Counter("fencepost_rpc_errors_total", "RPC errors by ErrorInfo reason",
                              ["method", "reason"], registry=r)
        self.backend = _Timings("fencepost_backend_calls_total", "backend round trips", ("operation", "outcome"),
                                "fencepost_backend_seconds", "backend round-trip latency", ("operation",))
        r.register(self.backend)
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
        # the cells of each label set, found with one dict lookup per call
        self._rpc_cells: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        self._backend_cells: dict[tuple[str, bool], tuple[list[int], list[float]]] = {}
        self._grants = self.lease_events.labels("grant")  # on every granting RPC: look it up once

    # -- RpcObserver -------------------------------------------------------
    def rpc_done(self, method: str, code: str, reason: str, seconds: float) -> None:
        cells = self._rpc_cells.get((method, code))
        if cells is None:
            cells = self._rpc_cells[(method, code)] = self.rpcs.series((method, code), (method,))
        _Timings.observe(cells, seconds)
        if reason:
            self.errors.labels(method, reason).inc()
            if reason in _LEASE_EVENTS:
                self.lease_events.labels(_LEASE_EVENTS[reason]).inc()
        elif code == "OK" and method.endswith(_GRANTING_RPCS):
            self._grants.inc()
        if rpc_log.isEnabledFor(logging.DEBUG):
            who = caller_or_none()
            rpc_log.debug("rpc", extra={"method": method, "code": code, "reason": reason,
                                        "duration_ms": round(seconds * 1e3, 3),
                                        "tenant": who.tenant if who else None})

    # -- storage hook ----------------------------------------------------------
    def backend_call(self, op: str, seconds: float, error: BaseException | None) -> None:
        key = (op, error is None)
        cells = self._backend_cells.get(key)
        if cells is None:
            cells = self._backend_cells[key] = self.backend.series((op, "ok" if error is None else "error"), (op,))
        _Timings.observe(cells, seconds)

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
        host = host.strip("[]")  # [::1]:9464: the brackets are the address syntax, not the host
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
