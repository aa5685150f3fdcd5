"""Runs: a workload under injected backend faults (in process, any backend)
and a workload across kill -9 restarts of a server subprocess; each ends by
reading the state back and checking the recorded history.

Profiles: `short` (the default, part of `make test`) and `long`
(FENCEPOST_RELIABILITY=long, `make reliability`)."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import fencepost
from bench.load import BoundedLoad
from fencepost_server.storage import Storage

from tests.conftest import running
from tests.faults import FaultyStorage

from .checks import LedgerState, check_journal, check_kv, check_ledger
from .crash import CLIENT_OPTIONS, CrashableServer
from .history import History
from .workloads import Step, Workload

LONG = os.environ.get("FENCEPOST_RELIABILITY", "short") == "long"


@dataclass(frozen=True)
class Budget:
    steps: int
    seconds: float
    kills: int = 0


def budget(kind: str, backend: str) -> Budget:
    """How much load one run gets: (faults|kills) x backend x profile."""
    slow = backend == "dynamodb"
    if LONG:
        if kind == "faults":
            return Budget(2_500, 240.0) if slow else Budget(20_000, 240.0)
        return Budget(4_000, 240.0, kills=5) if slow else Budget(40_000, 240.0, kills=22)
    if kind == "faults":
        return Budget(150, 12.0) if slow else Budget(600, 10.0)
    return Budget(20_000, 25.0, kills=2)  # the killer ends the load after the last restart


@dataclass
class Figures:
    backend: str
    run: str
    operations: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    faulted_calls: set[str] = field(default_factory=set)
    backend_calls: set[str] = field(default_factory=set)
    kills: int = 0
    races: int = 0
    histories: Counter[str] = field(default_factory=Counter)
    inconclusive: int = 0
    violations: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    seconds: float = 0.0


def workers(w: Workload, sessions: list[str], races: list[str]) -> list[Step]:
    out: list[Step] = []
    out += [w.kv_worker(slot, f"kv{slot}.{p}") for slot in range(3) for p in range(3)]
    out += [w.holder_worker(sid, f"holder{i}.{p}") for i, sid in enumerate(sessions) for p in range(2)]
    out += [w.deliver_worker(sessions, f"deliver{p}") for p in range(2)]
    out += [w.race_worker(sid, f"race{i}") for i, sid in enumerate(races)]
    out += [w.journal_worker(f"{w.tag}-agent{a}", f"journal{a}.{p}") for a in range(2) for p in range(2)]
    return out


async def _first_ready(w: Workload) -> tuple[list[str], list[str]]:
    # the long profile needs >= 1,000 races: more race workers (a race step is slow: it sleeps past a ttl)
    return await w.open_sessions("s", 3), await w.open_sessions("race", 16 if LONG else 4)


async def read_back(client: fencepost.AsyncClient, history: History) -> tuple[LedgerState, dict[str, list[str]]]:
    state = LedgerState()
    sessions = {op.args["session"] for op in history.of("ledger.")}
    for sid in sorted(sessions):
        state.logs[sid] = [(r.seq, r.data) async for r in client.read_log(sid)]
        state.pending[sid] = {e.inbox_id async for e in client.list_inbox(sid)}
    journals: dict[str, list[str]] = {}
    for agent in sorted({op.args["agent"] for op in history.of("journal.")}):
        tags: list[str] = []
        async for archive in client.list_archives(agent):
            tags += [r["sessionId"] for r in (await client.read_archive(agent, archive.name)).records()]
        live = await client.read_journal(agent)
        tags += [r["sessionId"] for r in live.records()] if live is not None else []
        journals[agent] = tags
    return state, journals


def check_all(history: History, ledger: LedgerState, journals: dict[str, list[str]], figures: Figures) -> None:
    for name, report in (("kv", check_kv(history)), ("ledger", check_ledger(history, ledger)),
                         ("journal", check_journal(history, journals))):
        figures.histories[name] += report.histories
        figures.inconclusive += report.inconclusive
        figures.violations += [str(v) for v in report.violations]
        figures.known += [str(v) for v in report.known]
    figures.operations = len(history.ops)
    figures.outcomes = history.outcomes()


JOURNAL_SETTINGS = {"journal_flush_seconds": 0.5, "journal_flush_bytes": 16 * 1024, "max_journal_bytes": 96 * 1024}


async def run_with_faults(storage: Storage, backend: str, seed: int) -> Figures:
    """The workload on an in-process server whose backend injects faults at
    every call kind (fail before, timeout, applied-but-response-lost)."""
    plan = budget("faults", backend)
    figures = Figures(backend, "faults")
    faulty = FaultyStorage(storage, seed, fail=0.04, timeout=0.03, lose=0.03, cover_each=3)
    faulty.armed = False
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with running(faulty, ledger_janitor=False, **JOURNAL_SETTINGS) as srv:
        async with srv.client(timeout=10.0) as client:
            w = Workload(client, History(), seed)
            sessions, races = await _first_ready(w)
            faulty.armed = True
            await BoundedLoad(max_steps=plan.steps, max_seconds=plan.seconds).run(workers(w, sessions, races))
            faulty.armed = False
            ledger, journals = await read_back(client, w.history)
    figures.seconds = loop.time() - started
    figures.faults = Counter(faulty.injected)
    figures.faulted_calls = {name for _, name in faulty.injected_by_call}
    figures.backend_calls = set(faulty.armed_calls)  # call kinds made while faults were on
    figures.races = w.races
    check_all(w.history, ledger, journals, figures)
    return figures


async def run_with_kills(backend_url: str, backend: str, seed: int, log_dir: Path, processes: int = 1) -> Figures:
    """The workload against a server subprocess that is kill -9'd at random
    moments and restarted on the same data, `plan.kills` times. With
    `processes` > 1 (`--workers`) every other kill takes one worker only (its supervisor
    restarts it), the others the whole server."""
    plan = budget("kills", backend)
    figures = Figures(backend, "kill -9" if processes == 1 else f"kill -9, {processes} workers")
    rng = random.Random(seed)
    extra = ("--workers", str(processes)) if processes > 1 else ()
    server = CrashableServer(backend_url, log_dir, *extra)
    await asyncio.to_thread(server.start)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with fencepost.AsyncClient(server.target, timeout=8.0, options=CLIENT_OPTIONS) as client:
            w = Workload(client, History(), seed)
            sessions, races = await _first_ready(w)
            load = BoundedLoad(max_steps=plan.steps, max_seconds=plan.seconds)

            async def killer() -> None:
                while server.kills < plan.kills:
                    await asyncio.sleep(rng.uniform(0.3, 1.2))
                    if processes > 1 and server.kills % 2 == 0:
                        await asyncio.to_thread(server.kill9_worker, rng.randrange(processes))
                        continue
                    server.kill9()
                    await asyncio.to_thread(server.start)
                await asyncio.sleep(0.5)  # some load on the last restart, then stop
                load.stop()

            await load.run(workers(w, sessions, races), background=[killer])
            ledger, journals = await read_back(client, w.history)
    finally:
        server.stop()
    figures.seconds = loop.time() - started
    figures.kills = server.kills
    figures.races = w.races
    check_all(w.history, ledger, journals, figures)
    return figures
