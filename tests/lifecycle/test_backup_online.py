"""A backup of a SQLite store taken while writers run is consistent: restored
into a fresh file and served, it holds every write acked before the backup
started, and the reliability checkers' invariants (KV linearizable, no lost
or doubled commit, fencing, inbox, journal) hold on it."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from pathlib import Path

import fencepost
from bench.load import BoundedLoad
from fencepost_server.lifecycle import backup, restore
from fencepost_server.storage import open_backend
from tests.conftest import running
from tests.reliability.history import OK, UNKNOWN, History
from tests.reliability.suite import JOURNAL_SETTINGS, Figures, check_all, read_back, workers
from tests.reliability.workloads import Workload

STEPS = 900


def cut(history: History, started: float, finished: float) -> History:
    """The history as the snapshot saw it: calls completed before the backup
    started keep their outcome, calls invoked after it finished never
    happened, and calls in between may or may not be in it."""
    out = History()
    for op in history.ops:
        if op.invoke > finished:
            continue
        if op.complete >= started:
            op = dataclasses.replace(op, status=UNKNOWN, complete=math.inf, result=None, error=None)
        out.ops.append(op)
    return out


async def _kv_read_back(client: fencepost.AsyncClient, history: History) -> None:
    """Record one read of every KV key, after everything: the linearizability
    check then covers the restored values too."""
    for key in sorted({op.args["key"] for op in history.of("kv.")}):
        op = history.invoke("restored", "kv.get", key=key)
        entry = await client.get_with_version(key)
        History.finish(op, OK, None if entry is None else (entry.value, entry.version))


async def test_backup_while_writers_run_restores_consistently(tmp_path: Path) -> None:
    source_url = f"sqlite://{tmp_path / 'live.db'}"
    archive = tmp_path / "live.arch"
    source = open_backend(source_url)
    window: dict[str, float] = {}
    try:
        async with running(source, ledger_janitor=False, **JOURNAL_SETTINGS) as srv, \
                srv.client(timeout=10.0) as client:
            w = Workload(client, History(), seed=16)
            sessions = await w.open_sessions("s", 3)
            races = await w.open_sessions("race", 2)
            load = BoundedLoad(max_steps=STEPS, max_seconds=60.0)

            async def take_backup() -> None:
                while len(w.history.ops) < STEPS // 3:
                    await asyncio.sleep(0.01)
                window["started"] = time.monotonic()
                report = await backup(source_url, archive)
                window["finished"] = time.monotonic()
                assert report.consistency == "snapshot" and report.quiesced
                window["ops during"] = sum(1 for op in w.history.ops if op.invoke >= window["started"]
                                           and op.invoke <= window["finished"])

            await load.run(workers(w, sessions, races), background=[take_backup])
    finally:
        await source.close()
    assert window["ops during"] > 0, "no writer ran while the backup was taken"
    acked_before = [op for op in w.history.ops if op.status == OK and op.complete < window["started"]]
    assert len(acked_before) > 100
    history = cut(w.history, window["started"], window["finished"])

    target_url = f"sqlite://{tmp_path / 'restored.db'}"
    assert (await restore(target_url, archive)).verification.same
    target = open_backend(target_url)
    try:
        async with running(target, ledger_janitor=False, **JOURNAL_SETTINGS) as srv, \
                srv.client(timeout=10.0) as client:
            ledger, journals = await read_back(client, history)
            await _kv_read_back(client, history)
    finally:
        await target.close()
    figures = Figures("sqlite", "backup while writing")
    check_all(history, ledger, journals, figures)
    assert figures.histories["kv"] and figures.histories["ledger"] and figures.histories["journal"]
    assert not figures.violations, "\n".join(figures.violations)
    # acked commits and deliveries before the backup are in it (the checkers
    # say so for each; make sure there were some)
    assert any(op.kind == "ledger.commit" for op in acked_before)
    assert any(op.kind == "ledger.deliver" for op in acked_before)
    assert any(op.kind == "journal.append" for op in acked_before)
