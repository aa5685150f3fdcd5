"""OpenTelemetry tracing through a real server, spans kept by the SDK's
in-memory exporter: the caller's trace continues on the server (W3C
traceparent in the metadata), backend calls are children of the RPC span,
and no attribute carries a value, a payload or a token."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fencepost
from fencepost_server import tracing
from fencepost_server.storage.memory import MemoryStorage
from tests.api.security_support import write_tokens
from tests.conftest import RunningServer, running

TOKEN = "token-tenant-a"
SECRETS = (TOKEN, "VALUE-must-not-be-traced", "PAYLOAD-must-not-be-traced", "MEMORY-must-not-be-traced",
           "KEY-holds-no-secret")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    try:
        yield spans
    finally:
        tracing.shutdown()


@pytest.fixture
async def srv(tmp_path: Path, exporter: InMemorySpanExporter) -> AsyncIterator[RunningServer]:
    async with running(MemoryStorage(), tokens_file=write_tokens(tmp_path / "tokens.json")) as s:
        yield s


def attribute_text(span: Any) -> str:
    return " ".join(f"{k}={v}" for k, v in (span.attributes or {}).items()) + f" {span.name}"


async def test_rpc_spans_join_the_callers_trace_and_nest_backend_calls(
    srv: RunningServer, exporter: InMemorySpanExporter
) -> None:
    client_tracer = TracerProvider().get_tracer("the-caller")
    async with srv.client(token=TOKEN) as fp:
        with client_tracer.start_as_current_span("caller work") as caller:
            await fp.put("KEY-holds-no-secret", b"VALUE-must-not-be-traced")
        caller_ctx = caller.get_span_context()
        got = await fp.get("KEY-holds-no-secret")
        assert got is not None
        session = await fp.open_session("agent-t", "chan-1")
        await fp.deliver(b"PAYLOAD-must-not-be-traced", session_id=session.session_id)
        await fp.memory_append("agent-t", "MEMORY-must-not-be-traced")
        with pytest.raises(fencepost.errors.FencepostError):
            await fp.get("")  # an invalid key: the reason is recorded
        _ = [r async for r in fp.read_log(session.session_id)]  # a server stream

    spans = exporter.get_finished_spans()
    rpc = {s.context.span_id: s for s in spans if s.kind is trace.SpanKind.SERVER}
    backend = [s for s in spans if s.name.startswith("backend ")]

    put = next(s for s in rpc.values() if s.name == "fencepost.v1.KvService/Put")
    # the caller's span is the server span's parent, in the caller's trace
    assert put.parent is not None and put.parent.span_id == caller_ctx.span_id
    assert put.context.trace_id == caller_ctx.trace_id
    assert put.attributes["rpc.system"] == "grpc" and put.attributes["rpc.method"] == "Put"
    assert put.attributes["rpc.service"] == "fencepost.v1.KvService"
    assert put.attributes["rpc.grpc.status_code"] == 0 and put.attributes["fencepost.tenant"] == "tenant-a"

    # a call without an active caller span starts its own trace
    get = next(s for s in rpc.values() if s.name == "fencepost.v1.KvService/Get" and
               s.attributes.get("rpc.grpc.status_code") == 0)
    assert get.parent is None and get.context.trace_id != caller_ctx.trace_id

    refused = next(s for s in rpc.values() if s.attributes.get("fencepost.reason") == "KEY_INVALID")
    assert refused.attributes["rpc.grpc.status_code"] == 3  # INVALID_ARGUMENT: the caller's fault, not an error
    assert refused.status.status_code is not trace.StatusCode.ERROR
    assert any(s.name == "fencepost.v1.LedgerService/ReadLog" for s in rpc.values())

    # every backend call made while serving is a child of its RPC's span
    assert backend
    for span in backend:
        assert span.parent is not None and span.parent.span_id in rpc, span.name
        assert span.context.trace_id == rpc[span.parent.span_id].context.trace_id
    put_children = [s.name for s in backend if s.parent.span_id == put.context.span_id]  # type: ignore[union-attr]
    assert put_children, "Put made no traced backend call"

    # nothing recorded holds a value, a payload, memory content or a token
    recorded = " ".join(attribute_text(s) for s in spans)
    for secret in SECRETS[:-1]:
        assert secret not in recorded, secret
    for span in spans:
        assert not span.events  # no exception events (their messages could quote input)


async def test_tracing_off_records_nothing(exporter: InMemorySpanExporter) -> None:
    tracing.shutdown()
    assert tracing.TRACER is None
    async with running(MemoryStorage()) as srv, srv.client() as fp:
        await fp.put("k", b"v")
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_the_standard_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_configure_from_env_installs_an_otlp_exporter() -> None:
    try:
        line = tracing.configure_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
        assert line == "tracing: otlp" and tracing.TRACER is not None
    finally:
        tracing.shutdown()
    assert tracing.TRACER is None


def test_serve_refuses_an_unknown_exporter(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0", "--state-root",
         str(tmp_path)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"})
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("fencepost: error: OTEL_TRACES_EXPORTER: expected otlp, console or none")


@pytest.mark.parametrize(("sampler", "arg", "expected"), [
    pytest.param(None, None, "ParentBased{root:AlwaysOnSampler,", id="default"),
    pytest.param("always_off", None, "AlwaysOffSampler", id="always-off"),
    pytest.param(" ParentBased_Always_Off ", "ignored", "ParentBased{root:AlwaysOffSampler,", id="any-case"),
    pytest.param("traceidratio", "0.25", "TraceIdRatioBased{0.25}", id="ratio"),
    pytest.param("parentbased_traceidratio", None, "ParentBased{root:TraceIdRatioBased{1.0},", id="ratio-default"),
])
def test_the_sampler_is_the_one_the_environment_names(sampler: str | None, arg: str | None, expected: str) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console"}
    env |= {"OTEL_TRACES_SAMPLER": sampler} if sampler is not None else {}
    env |= {"OTEL_TRACES_SAMPLER_ARG": arg} if arg is not None else {}
    try:
        tracing.configure_from_env(env)
        assert tracing._provider.sampler.get_description().startswith(expected)
    finally:
        tracing.shutdown()


@pytest.mark.parametrize(("sampler", "arg", "message"), [
    pytest.param("always_onn", None, "OTEL_TRACES_SAMPLER: expected always_on, always_off, traceidratio, "
                 "parentbased_always_on, parentbased_always_off or parentbased_traceidratio, got 'always_onn'",
                 id="unknown"),
    pytest.param("traceidratio", "ten percent", "OTEL_TRACES_SAMPLER_ARG: expected a sampling ratio 0..1 for "
                 "traceidratio, got 'ten percent'", id="ratio-not-a-number"),
    pytest.param("parentbased_traceidratio", "1.5", "OTEL_TRACES_SAMPLER_ARG: expected a sampling ratio 0..1 for "
                 "parentbased_traceidratio, got '1.5'", id="ratio-out-of-range"),
    pytest.param("traceidratio", "nan", "OTEL_TRACES_SAMPLER_ARG: expected a sampling ratio 0..1", id="ratio-nan"),
])
def test_a_sampler_that_cannot_work_is_a_configuration_error(sampler: str, arg: str | None, message: str) -> None:
    """The SDK only logs "Couldn't recognize sampler" and samples every trace
    (or traces at ratio 1.0): a deployment that asked for 1% would trace all."""
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": sampler}
    env |= {"OTEL_TRACES_SAMPLER_ARG": arg} if arg is not None else {}
    try:
        with pytest.raises(tracing.TracingConfigError) as caught:
            tracing.configure_from_env(env)
    finally:
        tracing.shutdown()
    assert str(caught.value).startswith(message), str(caught.value)
    assert tracing.TRACER is None


def test_serve_refuses_an_unknown_sampler() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0", "--backend", "memory://"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "sometimes"})
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("fencepost: error: OTEL_TRACES_SAMPLER: expected always_on, "), res.stderr
    assert "fencepost serving on" not in res.stdout
