"""Shared fixtures: every backend, and a real server on loopback.

`BACKENDS` lists how to open each backend for one test; every contract and API
test that takes the `storage` / `client` fixtures runs once per backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import fencepost
import fencepost.errors
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage import Storage
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.storage.sqlite import SqliteStorage
from tests import reason_contract

Opener = Callable[[Path], Awaitable[Storage]]


async def _memory(_tmp: Path) -> Storage:
    return MemoryStorage()


async def _sqlite(tmp: Path) -> Storage:
    # NORMAL keeps the suite fast; durability across restart is tested with FULL.
    return SqliteStorage(tmp / f"{uuid.uuid4().hex}.db", synchronous="NORMAL")


BACKENDS: dict[str, Opener] = {"memory": _memory, "sqlite": _sqlite}

with contextlib.suppress(ImportError):
    from tests.dynamo_support import open_dynamodb  # added with the DynamoDB backend

    BACKENDS["dynamodb"] = open_dynamodb


def backend_params() -> list[pytest.param]:
    return [pytest.param(name, id=name, marks=[pytest.mark.backend(name)]) for name in BACKENDS]


@pytest.fixture(params=backend_params())
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    backend = await BACKENDS[request.param](tmp_path)
    try:
        yield backend
    finally:
        await backend.close()


@pytest.fixture
def backend_name(storage: Storage) -> str:
    return type(storage).__name__


# The local DynamoDB-compatible server serves a few hundred requests a second,
# one at a time; load-shaped tests run a smaller count there (the same count
# everywhere else). FENCEPOST_FULL_SCALE=1 runs the full counts everywhere.
SLOW_BACKENDS = set() if os.environ.get("FENCEPOST_FULL_SCALE") == "1" else {"dynamodb"}


@pytest.fixture
def scaled(request: pytest.FixtureRequest) -> Callable[[int, int], int]:
    """`scaled(full, on_slow_backend)`: the count for this test's backend."""
    callspec = getattr(request.node, "callspec", None)
    name = callspec.params.get("storage") if callspec else None

    def pick(full: int, slow: int) -> int:
        return slow if name in SLOW_BACKENDS else full

    return pick


class RunningServer:
    def __init__(self, app: App) -> None:
        self.app = app

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.app.port}"

    def client(self, **kwargs: object) -> fencepost.AsyncClient:
        return fencepost.AsyncClient(self.target, **kwargs)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(storage: Storage, **settings: object) -> AsyncIterator[RunningServer]:
    """A real server on a free loopback port over `storage`."""
    app = App(Settings(listen="127.0.0.1:0", **settings), storage=storage)  # type: ignore[arg-type]
    await app.start()
    try:
        yield RunningServer(app)
    finally:
        await app.stop(grace=0.5)


class Drained:
    """A watch stream (WatchInbox, WatchDue) drained in a task: `pick` of
    each thing it yields in `seen`, and in `ended` the error that ended it."""

    def __init__(self, stream: AsyncIterator[Any], pick: Callable[[Any], Any] = lambda x: x) -> None:
        self.seen: list[Any] = []
        self.ended: list[fencepost.errors.FencepostError] = []
        self.task = asyncio.create_task(self._drain(stream, pick))

    async def _drain(self, stream: AsyncIterator[Any], pick: Callable[[Any], Any]) -> None:
        try:
            async for item in stream:
                self.seen.append(pick(item))
        except fencepost.errors.FencepostError as exc:
            self.ended.append(exc)

    async def until_seen(self, n: int = 1) -> None:
        while len(self.seen) < n:
            await asyncio.sleep(0.01)

    async def end(self, timeout: float = 10) -> None:
        await asyncio.wait_for(self.task, timeout)


@pytest.fixture
async def server(storage: Storage) -> AsyncIterator[RunningServer]:
    async with running(storage) as srv:
        yield srv


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[fencepost.AsyncClient]:
    async with server.client(timeout=10.0) as c:
        yield c


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "backend(name): the backend a parametrized test runs on")
    os.environ.setdefault("FENCEPOST_TEST", "1")
    config.addinivalue_line("markers", "scaled: uses `scaled` (smaller counts on the DynamoDB emulator)")
    reason_contract.start(config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # every server this session started recorded what it returned: all of it must be declared
    reason_contract.finish(session)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reason_contract.report(terminalreporter)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "scaled" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.scaled)
