"""The reliability runs: faults injected at every backend call kind (each
backend), and kill -9 restarts of a server subprocess (SQLite; DynamoDB in
the long profile). Short by default; FENCEPOST_RELIABILITY=long for
`make reliability`. Every run ends with the history checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from fencepost_server.storage import Storage

from .suite import LONG, Figures, run_with_faults, run_with_kills

# the targets of the long profile (on sqlite; the emulator covers what it can)
TARGET_OPERATIONS = 10_000
TARGET_KILLS = 20
TARGET_RACES = 1_000


def _assert_clean(figures: Figures) -> None:
    shown = "\n\n".join(figures.violations[:5])
    assert not figures.violations, f"{len(figures.violations)} violations, first:\n{shown}"
    assert figures.histories["kv"] and figures.histories["ledger"] and figures.histories["journal"]


async def test_faults_at_every_backend_call(storage: Storage, request: pytest.FixtureRequest,
                                            collect: list[Figures]) -> None:
    backend = request.node.callspec.params["storage"]
    figures = await run_with_faults(storage, backend, seed=11)
    collect.append(figures)
    _assert_clean(figures)
    assert all(figures.faults[kind] for kind in ("fail", "timeout", "lose")), figures.faults
    assert figures.outcomes["ok"] > figures.operations // 2
    assert figures.faulted_calls == figures.backend_calls, "some backend call kind never got a fault"
    if LONG and backend == "sqlite":
        assert figures.operations >= TARGET_OPERATIONS
        assert figures.races >= TARGET_RACES


async def test_kill9_restarts_sqlite(tmp_path: Path, collect: list[Figures]) -> None:
    figures = await run_with_kills(f"sqlite://{tmp_path}/reliability.db", "sqlite", seed=23, log_dir=tmp_path)
    collect.append(figures)
    _assert_clean(figures)
    assert figures.kills >= (TARGET_KILLS if LONG else 2)


async def test_kill9_restarts_sqlite_two_workers(tmp_path: Path, collect: list[Figures]) -> None:
    """`--workers 2` on one SQLite file: kill one worker, then the whole server."""
    figures = await run_with_kills(f"sqlite://{tmp_path}/reliability.db", "sqlite", seed=31, log_dir=tmp_path,
                                   processes=2)
    collect.append(figures)
    _assert_clean(figures)
    assert figures.kills >= (TARGET_KILLS if LONG else 2)


async def test_kill9_restarts_dynamodb(tmp_path: Path, collect: list[Figures]) -> None:
    from tests.dynamo_support import backend_url, new_dynamo_storage

    table_owner = await new_dynamo_storage()  # creates the table; the server subprocesses share it
    await table_owner.close()
    figures = await run_with_kills(backend_url(table_owner.table), "dynamodb", seed=29, log_dir=tmp_path)
    collect.append(figures)
    _assert_clean(figures)
    assert figures.kills >= (3 if LONG else 1)
