"""OpenTelemetry tracing: one span per RPC, a child span per backend call.

Off unless the standard environment turns it on (`configure_from_env`):

    OTEL_TRACES_EXPORTER=otlp|console   (none: off)
    OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT  (implies otlp)
    OTEL_SDK_DISABLED=true              (off, whatever else is set)
    OTEL_TRACES_SAMPLER[_ARG]           checked here: an unknown sampler or a
                                        ratio outside 0..1 refuses to start
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
    OTEL_BSP_*, OTEL_EXPORTER_OTLP_* (headers, timeout, certificate, ...)
                                        read by the OpenTelemetry SDK itself

The RPC span continues the caller's trace (W3C `traceparent` in the request
metadata, through the globally configured propagators). What a span records:
the method, the gRPC status, the ErrorInfo reason and the tenant; never a
key's value, a payload, a token or a certificate.

When off, `TRACER` is None and the only per-call cost is that check (in
`api.base` and `storage.counting`); opentelemetry is not even imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: the tracer every span comes from; None = tracing off
TRACER: Any = None
_provider: Any = None

_SERVER_ERRORS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"})


class TracingConfigError(ValueError):
    """The OTEL_* variables ask for something this install cannot do."""


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the environment turns tracing on."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """Install a tracer provider with the exporter the environment names;
    returns a one-line description, or None when tracing stays off."""
    env = os.environ if env is None else env
    if not wanted(env):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingConfigError(
            "OTEL_* variables turn tracing on but opentelemetry-sdk is not installed "
            "(pip install 'fencepost[server]')") from exc
    sampler = _sampler(env)
    names = [n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    exporters = [_exporter(name, env) for name in names if name != "none"]
    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or "fencepost"}),
                              sampler=sampler)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    install(provider)
    return "tracing: " + ", ".join(names)


#: OTEL_TRACES_SAMPLER's values (the SDK's built-in samplers), in the order the error lists them
_SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
             "parentbased_traceidratio")


def _sampler(env: Mapping[str, str]) -> Any:
    """The sampler OTEL_TRACES_SAMPLER[_ARG] name. The SDK itself only logs a
    warning for a name or ratio it cannot use and then samples every trace:
    a deployment that asked for 1% would trace everything."""
    from opentelemetry.sdk.trace import sampling

    name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    if name not in _SAMPLERS:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER: expected {', '.join(_SAMPLERS[:-1])} or {_SAMPLERS[-1]}, "
                                 f"got {env.get('OTEL_TRACES_SAMPLER')!r}")
    if not name.endswith("traceidratio"):
        return {"always_on": sampling.ALWAYS_ON, "always_off": sampling.ALWAYS_OFF,
                "parentbased_always_on": sampling.DEFAULT_ON, "parentbased_always_off": sampling.DEFAULT_OFF}[name]
    arg = (env.get("OTEL_TRACES_SAMPLER_ARG") or "").strip()
    try:
        ratio = float(arg) if arg else 1.0  # no ratio: every trace (the specification's default)
    except ValueError:
        ratio = float("nan")
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a sampling ratio 0..1 for {name}, got {arg!r}")
    return sampling.TraceIdRatioBased(ratio) if name == "traceidratio" else sampling.ParentBasedTraceIdRatio(ratio)


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER: expected otlp, console or none, got {name!r}")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc").strip().lower()
    if protocol != "grpc":
        raise TracingConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: fencepost exports OTLP over grpc, got {protocol!r}")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, TLS: from OTEL_EXPORTER_OTLP_*


def install(provider: Any) -> None:
    """Trace with `provider` (tests pass one with an in-memory exporter)."""
    global TRACER, _provider
    from . import __version__

    _provider = provider
    TRACER = provider.get_tracer("fencepost_server", __version__)


def shutdown() -> None:
    """Flush what is buffered and turn tracing off."""
    global TRACER, _provider
    provider, TRACER, _provider = _provider, None, None
    if provider is not None:
        provider.shutdown()


# -- spans (called only when TRACER is not None) --------------------------------
class RpcSpan:
    """The span of one RPC, current for the handler (so backend spans nest)."""

    __slots__ = ("span", "_token")

    def __init__(self, service: str, method: str, metadata: Any) -> None:
        from opentelemetry import context, propagate, trace

        parent = propagate.extract({k: v for k, v in (metadata or ()) if isinstance(v, str)})
        self.span = TRACER.start_span(
            f"{service}/{method}", context=parent, kind=trace.SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
        )
        self._token = context.attach(trace.set_span_in_context(self.span, parent))

    def end(self, code: str, reason: str, tenant: str | None) -> None:
        from opentelemetry import context, trace

        span = self.span
        span.set_attribute("rpc.grpc.status_code", _status_number(code))
        if reason:
            span.set_attribute("fencepost.reason", reason)
        if tenant is not None:
            span.set_attribute("fencepost.tenant", tenant)
        if code in _SERVER_ERRORS:
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{code}/{reason}" if reason else code))
        span.end()
        try:
            context.detach(self._token)
        except ValueError:  # a stream finished in another context than it started in
            pass


def start_backend_span(operation: str) -> Any:
    """A child span for one backend round trip, or None outside a traced RPC
    (background loops would otherwise each start a trace of their own)."""
    from opentelemetry import trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    return TRACER.start_span(f"backend {operation}", kind=trace.SpanKind.CLIENT,
                             attributes={"fencepost.backend.operation": operation})


def end_backend_span(span: Any, error: BaseException | None) -> None:
    if error is not None:
        from opentelemetry import trace

        span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
    span.end()


def _status_number(code: str) -> int:
    import grpc

    return int(getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN).value[0])
