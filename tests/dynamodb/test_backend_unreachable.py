"""A DynamoDB backend that does not answer at start: the start-up line names
it and the cause (table missing, credentials missing, endpoint unreachable),
health says NOT_SERVING until it answers, and an outage is a few log lines,
not one per probe."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.domain.erasure import Eraser
from fencepost_server.domain.journal import Journal
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.retention import Retention, RetentionConfig
from fencepost_server.domain.throttled_log import ThrottledWarning
from fencepost_server.storage import BackendUnavailable
from fencepost_server.storage.dynamodb import DynamoStorage
from fencepost_server.storage.memory import MemoryStorage
from tests.api.test_serve_process import free_port
from tests.dynamo_support import FAKE_CREDENTIALS, REGION, backend_url, moto_endpoint, unique_table

pytestmark = pytest.mark.backend("dynamodb")

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def health(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as ch:
        return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))).status


async def start_line(url: str, env: dict[str, str]) -> AsyncIterator[tuple[str, str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{free_port()}",
        "--backend", url, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        match = re.search(r"serving on (\S+:\d+)", line)
        assert match, line
        yield line, match.group(1)
    finally:
        proc.terminate()
        await proc.wait()


def without_aws(env: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    return {**clean, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true"}


async def test_missing_table_is_named_and_health_is_not_serving() -> None:
    env = {**os.environ, **FAKE_CREDENTIALS}
    async for line, target in start_line(backend_url(unique_table()), env):
        assert "NOT SERVING" in line and "table missing" in line and "create-table" in line
        assert await health(target) == NOT_SERVING


async def test_missing_credentials_are_named() -> None:
    url = backend_url(unique_table())  # starts moto; the server gets no credentials for it
    async for line, target in start_line(url, without_aws(dict(os.environ))):
        assert "NOT SERVING" in line and "credentials missing" in line
        assert await health(target) == NOT_SERVING


async def test_unreachable_endpoint_is_named() -> None:
    url = f"dynamodb://{unique_table()}?endpoint=http://127.0.0.1:{free_port()}&region={REGION}&attempts=1"
    async for line, _target in start_line(url, {**os.environ, **FAKE_CREDENTIALS}):
        assert "NOT SERVING" in line and "endpoint unreachable" in line


async def test_health_turns_serving_once_the_table_exists() -> None:
    storage = DynamoStorage(unique_table(), endpoint_url=moto_endpoint(), region=REGION)
    app = App(Settings(listen="127.0.0.1:0", health_probe_seconds=0.1, ledger_janitor=False), storage=storage)
    await app.start()
    try:
        assert app.backend_problem is not None and "table missing" in app.backend_problem
        assert await health(f"127.0.0.1:{app.port}") == NOT_SERVING
        await storage.create_table()
        for _ in range(300):
            if await health(f"127.0.0.1:{app.port}") == SERVING:
                break
            await asyncio.sleep(0.1)
        assert await health(f"127.0.0.1:{app.port}") == SERVING
        assert app.backend_problem is None
    finally:
        await app.stop(grace=0.2)


def test_an_outage_is_reported_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    warning = ThrottledWarning(logging.getLogger("test.throttle"), "janitor pass", every=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for _ in range(12):  # one minute of failures, every 5 s
            warning.failed(RuntimeError("table missing"))
            now[0] += 5.0
        warning.failed(RuntimeError("table missing"))  # 60 s after the first report
        warning.ok()
        warning.ok()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "janitor pass failed: table missing",
        "janitor pass failed: table missing (11 more since the last report)",
        "janitor pass works again",
    ]


class _Down(MemoryStorage):
    """A backend whose every listing fails, as one down for a while."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = 0

    async def list(self, *args: Any, **kwargs: Any) -> Any:
        self.lists += 1
        raise BackendUnavailable("backend down")

    async def list_keys(self, *args: Any, **kwargs: Any) -> Any:
        return await self.list()


@pytest.mark.parametrize("loop", ["erasure", "retention"])
async def test_background_passes_report_an_outage_once_per_interval(
    loop: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the erasure and retention loops logged every failed pass: a line every 5 s
    # from the erasure loop of every replica while the backend was down
    storage = _Down()
    ledger = Ledger(storage)
    if loop == "erasure":
        runner = Eraser(storage, ledger, poll_seconds=0).run()
    else:
        config = RetentionConfig(idle_session_seconds=3600.0, interval=0.0)
        runner = Retention(storage, ledger, Journal(storage, Limits()), config).run()
    with caplog.at_level(logging.WARNING, logger=f"fencepost.{loop}"):
        task = asyncio.ensure_future(runner)
        try:
            while storage.lists < 20:  # twenty failed passes
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    failures = [r.getMessage() for r in caplog.records if r.name == f"fencepost.{loop}"]
    assert failures == [f"{loop} pass failed: backend down"]


@pytest.mark.parametrize(("level", "workers"), [("INFO", 1), ("DEBUG", 1), ("INFO", 2)])
async def test_the_aws_libraries_say_routine_things_only_at_debug(level: str, workers: int) -> None:
    """botocore / aiobotocore log "Found credentials in environment variables."
    at INFO on every start (in every worker): noise in an operator's INFO
    log, kept for DEBUG."""
    url = f"dynamodb://{unique_table()}?endpoint=http://127.0.0.1:{free_port()}&region={REGION}&attempts=1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost_server", "serve", "--listen", f"127.0.0.1:{free_port()}",
        "--backend", url, "--log-level", level, "--workers", str(workers),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **FAKE_CREDENTIALS})
    assert proc.stdout is not None and proc.stderr is not None
    try:
        serving = 0
        while serving < workers:
            line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
            assert line, "the server stopped before serving"
            serving += "serving on" in line
    finally:
        proc.terminate()
        await proc.wait()
    stderr = (await proc.stderr.read()).decode()
    assert "not answering" in stderr  # fencepost's own warnings still come through
    assert ("Found credentials" in stderr) == (level == "DEBUG"), stderr
