"""A store holding every service's data, written through a real server, and
every read RPC's answer over it: what a migration must carry unchanged."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import fencepost

AGENT = "agent-1"
#: small journals, so a handful of appends rotates into archives
JOURNAL_SETTINGS: dict[str, Any] = {"journal_flush_seconds": 0.2, "journal_flush_bytes": 1024,
                                    "max_journal_bytes": 3 * 1024}
SERVER_SETTINGS: dict[str, Any] = {"ledger_janitor": False, **JOURNAL_SETTINGS}
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass
class Written:
    """Handles on what was written, for the checks after the move."""

    kv_versions: dict[str, str] = field(default_factory=dict)
    gone_version: str = ""  # of a key deleted before the move
    held: str = ""  # session whose lease is held across the move
    held_generation: int = 0
    expired: str = ""  # session whose holder's lease expired before the move
    expired_generation: int = 0
    fork: str = ""
    commit: tuple[str, int, int, list[bytes], int] = ("", 0, 0, [], 0)  # (commit_id, gen, expected, records, seq)
    dedupe_key: str = ""
    sessions: list[str] = field(default_factory=list)
    minted: set[str] = field(default_factory=set)  # every KV version the server handed out


def _turn(i: int) -> dict[str, Any]:
    return {"at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z", "sessionId": f"s{i}", "channelId": "c1",
            "status": "completed", "result": "r" * 180}


async def populate(c: fencepost.AsyncClient) -> Written:
    w = Written()
    # KV
    for i in range(30):
        key = f"app/{i:03d}"
        w.kv_versions[key] = await c.put(key, f"value {i}".encode() * (i + 1))
    w.kv_versions["bin"] = await c.put("bin", bytes(range(256)))
    w.gone_version = await c.put("gone", b"deleted before the move")
    await c.delete("gone")
    w.minted |= set(w.kv_versions.values()) | {w.gone_version}

    # ledger: a held session with log, pending inbox, reminders; a fork; an expired holder
    s1 = (await c.open_session(AGENT, "chan-1", metadata={"team": "a"})).session_id
    lease = await c.acquire_lease(s1, "holder-1", ttl=3600)
    w.held, w.held_generation = s1, lease.generation
    seq = 0
    for n in range(3):
        commit_id = uuid.uuid4().hex
        records = [f"turn {n}.{r}".encode() for r in range(3)]
        done = await c.commit(s1, lease.generation, seq, records, commit_id=commit_id)
        w.commit = (commit_id, lease.generation, seq, records, done.seq)
        seq = done.seq
    w.dedupe_key = "event-0"
    for n in range(3):
        await c.deliver(f"event {n}".encode(), session_id=s1, dedupe_key=f"event-{n}")
    await c.create_reminder(s1, lease.generation, "check the build", after_seconds=7 * 24 * 3600)
    await c.create_reminder(s1, lease.generation, "follow up", after_seconds=30 * 24 * 3600)
    w.fork = (await c.fork(s1, 4, "chan-1-fork")).session_id
    s2 = (await c.open_session(AGENT, "chan-2")).session_id
    short = await c.acquire_lease(s2, "holder-2", ttl=0.3)
    await c.commit(s2, short.generation, 0, [b"only record"])
    w.expired, w.expired_generation = s2, short.generation
    while (await c.get_session(s2)).lease.live:  # wait for the expiry: nobody took it over yet
        await asyncio.sleep(0.1)
    w.sessions = [s1, w.fork, s2]

    # journal, rotated into archives
    for i in range(40):
        await c.append_turn(AGENT, _turn(i))
    archives = [a async for a in c.list_archives(AGENT)]
    while not archives:  # rotation happens on flush; a read flushes
        await c.read_journal(AGENT)
        archives = [a async for a in c.list_archives(AGENT)]

    # memory with pins
    ids = [(await c.memory_append(AGENT, f"fact {i}: deploys go through staging {i}", about=[f"topic{i % 3}"])).id
           for i in range(6)]
    await c.memory_pin(AGENT, ids[0])
    await c.memory_pin(AGENT, ids[3])
    await c.memory_forget(AGENT, ids[5])

    # evals
    for i in range(3):
        await c.put_eval_run(AGENT, f"run-{i}", {"score": i / 10, "suite": "smoke"})
    for i in range(4):
        await c.put_ab_sample(AGENT, "exp-a", f"session-{i % 2}", {"turn": i}, at=T0 + timedelta(seconds=i))
    await c.put_ab_snapshot(AGENT, {"winner": "b", "n": 4})
    return w


async def read_everything(c: fencepost.AsyncClient, w: Written) -> dict[str, Any]:
    """Every read RPC's answer (as comparable values)."""
    out: dict[str, Any] = {}
    out["kv.list"] = [e async for e in c.list("")]
    out["kv.list_keys"] = [k async for k in c.list_keys("app/")]
    out["kv.get"] = [await c.get_with_version(k) for k in (*w.kv_versions, "gone")]
    for sid in w.sessions:
        out[f"ledger.get_session {sid}"] = await c.get_session(sid)
        out[f"ledger.read_log {sid}"] = [r async for r in c.read_log(sid)]
        out[f"ledger.list_inbox {sid}"] = [e async for e in c.list_inbox(sid)]
        out[f"schedule.list {sid}"] = [r async for r in c.list_reminders(sid)]
        out[f"schedule.due {sid}"] = [r async for r in c.due_reminders(sid)]
    out["ledger.resolve"] = await c.resolve_session(AGENT, "chan-1")
    out["ledger.list_sessions"] = [s async for s in c.list_sessions(AGENT)]
    out["journal.read"] = await c.read_journal(AGENT)
    archives = [a async for a in c.list_archives(AGENT)]
    out["journal.archives"] = archives
    out["journal.read_archive"] = [await c.read_archive(AGENT, a.name) for a in archives]
    out["store_api.memory.read"] = await c.store_call("memory.read", {"agent": AGENT})
    out["memory.list"] = [e async for e in c.memory_list_all(AGENT, all_validity=True)]
    # Search records recall statistics (a recording read): compare them apart
    search = await c.memory_search(AGENT, "deploys staging", strategy="relevance")
    out["memory.search recall counts"] = [e.usage.recall_count for e in search.entries]
    for entry in search.entries:
        entry.ClearField("usage")
    out["memory.search"] = search
    out["memory.pinned"] = await c.memory_pinned(AGENT, allocated=True)
    out["memory.topics"] = await c.memory_topics(AGENT)
    out["memory.injection"] = await c.memory_injection(AGENT)
    audit = await c.memory_audit(AGENT)
    for entry in audit.entries:
        entry.ClearField("usage")
    out["memory.audit"] = audit
    out["evals.runs"] = [r async for r in c.list_eval_runs(AGENT)]
    out["evals.run"] = await c.get_eval_run(AGENT, "run-1")
    out["evals.samples"] = [s async for s in c.list_ab_samples(AGENT, "exp-a")]
    out["evals.snapshot"] = await c.get_ab_snapshot(AGENT)
    assert out["journal.archives"] and out["memory.pinned"] and out["ledger.list_inbox " + w.held]
    return out
