"""Agent- and tenant-wide erasure (AdminService) through a real server on every
backend: every service's data written first, erased, proven on the raw store,
and everything outside the scope untouched byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost import errors
from fencepost.keys import author_kv
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.domain.erasure import Eraser
from fencepost_server.storage import Storage
from tests.api.security_support import write_tokens
from tests.raw_store import data_only, raw_items

TOKENS = {
    "op-doomed": ("doomed-tenant", "operator"),
    "svc-doomed": ("doomed-tenant", "service"),
    "op-kept": ("kept-tenant", "operator"),
}
TURN = {"at": "2026-11-29T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}


@contextlib.asynccontextmanager
async def erasure_app(
    tmp_path: Path, storage: Storage, tokens: dict[str, tuple[str, str]], **settings: Any
) -> AsyncIterator[App]:
    """A server for erasure tests: small journals kept unflushed (so erasure
    meets buffered turns), the erasure loop polling fast, `tokens` as callers."""
    app = App(Settings(
        listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json", tokens),
        max_journal_bytes=1500, journal_flush_seconds=3600, erasure_poll_seconds=0.2, **settings,
    ), storage=storage)
    await app.start()
    try:
        yield app
    finally:
        await app.stop(grace=0.2)


@pytest.fixture
async def app(tmp_path: Path, storage: Storage) -> AsyncIterator[App]:
    async with erasure_app(tmp_path, storage, TOKENS) as started:
        yield started


def connect(app: App, token: str) -> fencepost.AsyncClient:
    return fencepost.AsyncClient(f"127.0.0.1:{app.port}", token=token, timeout=30)


async def write_everything(c: fencepost.AsyncClient, agent: str) -> list[str]:
    """Data of one agent in every service; returns its session ids."""
    kv = author_kv(agent)
    await c.put(kv("setting"), b"author-kv", request_id=f"{agent}-kv")
    await c.put(f"plain/{agent}", b"tenant-kv", request_id=f"{agent}-plain")
    sid = (await c.open_session(agent, "chan")).session_id
    lease = await c.acquire_lease(sid, "holder", ttl=600)
    d = await c.deliver(b"event", session_id=sid, dedupe_key="d1")
    await c.commit(sid, lease.generation, 0, [b"r1", b"r2", b"r3"], consume=[d.inbox_id], commit_id="c1")
    await c.create_reminder(sid, lease.generation, "ping", after_seconds=3600)
    await c.deliver(b"B" * (70 * 1024), session_id=sid)  # pending, with a blob; the lease stays held
    child = (await c.fork(sid, 2, "child")).session_id
    for i in range(40):
        await c.append_turn(agent, {**TURN, "sessionId": f"t{i:02d}"})
    await c.read_journal(agent)  # flush-on-read rotates: archives
    assert [a async for a in c.list_archives(agent)]
    entry = await c.memory_append(agent, "a fact to forget", about=["Core"], trust="operator")
    await c.memory_pin(agent, entry.id)
    await c.put_eval_run(agent, "run-1", {"score": 1})
    await c.put_ab_sample(agent, "exp", sid, {"reward": 1.0})
    await c.put_ab_snapshot(agent, {"arms": 2})
    return [sid, child]


def naming(items: dict[str, bytes], needles: list[str]) -> dict[str, bytes]:
    return {k: v for k, v in items.items() if any(n in k or n.encode() in v for n in needles)}


def outside(items: dict[str, bytes], needles: list[str]) -> dict[str, bytes]:
    gone = naming(items, needles)
    return {k: v for k, v in data_only(items).items() if k not in gone and not k.startswith("#/ops/")}


def agent_needles(agent: str, sessions: list[str]) -> list[str]:
    tag = base64.urlsafe_b64encode(agent.encode()).decode().rstrip("=")
    return [f"/agentkit/v1/{agent}/", f".{tag}", *sessions]


async def test_agent_erasure_leaves_nothing_of_the_agent(storage: Storage, app: App) -> None:
    async with connect(app, "op-doomed") as op, connect(app, "svc-doomed") as svc, connect(app, "op-kept") as kept:
        doomed = await write_everything(op, "doomed-agent")
        await write_everything(op, "kept-agent")
        await write_everything(kept, "doomed-agent")  # same agent name, another tenant
        needles = agent_needles("doomed-agent", doomed)
        before = raw_items(storage)
        assert len(naming(before, needles)) > 20

        with pytest.raises(errors.PermissionDenied):
            await svc.erase_agent("doomed-agent")
        started = await op.erase_agent("doomed-agent", request_id="erase-1")
        assert started.name.startswith("operations/erase-") and started.agent == "doomed-agent"
        assert (await op.erase_agent("doomed-agent", request_id="erase-1")).name == started.name
        with pytest.raises(errors.OperationNotFound):
            await kept.get_operation(started.name)  # another tenant's operator sees nothing
        done = await op.wait_operation(started.name)
        assert done.done and done.phase == "done" and done.sessions_fenced == 2 and done.items_erased > 20

        after = raw_items(storage)
        # the other tenant's agent of the same name is matched by the session tags: compare by key prefix
        doomed_root = "doomed-tenant/"
        assert [k for k in naming(after, needles) if k.startswith(doomed_root) or "doomed-tenant" in k] == []
        assert [k for k in after if k.startswith("#/") and any(s in k for s in doomed)] == []
        assert outside(after, needles) == outside(before, needles)
        kept_same_name = {k: v for k, v in before.items() if k.startswith("kept-tenant/")}
        assert kept_same_name and {k: after[k] for k in kept_same_name} == kept_same_name

        for sid in doomed:
            with pytest.raises(errors.SessionNotFound):
                await op.get_session(sid)
        assert await op.read_journal("doomed-agent") is None
        assert [e async for e in op.memory_list_all("doomed-agent")] == []
        fresh = await op.open_session("doomed-agent", "chan")
        assert fresh.session_id not in doomed


async def test_tenant_erasure_leaves_nothing_of_the_tenant(storage: Storage, app: App) -> None:
    async with connect(app, "op-doomed") as op, connect(app, "op-kept") as kept:
        for agent in ("a1", "a2"):
            await write_everything(op, agent)
        await write_everything(kept, "a1")
        before = raw_items(storage)
        assert len(naming(before, ["doomed-tenant"])) > 40
        started = await op.erase_tenant(request_id="bye")
        done = await op.wait_operation(started.name)
        assert done.done and done.sessions_fenced == 4
        after = raw_items(storage)
        assert naming(after, ["doomed-tenant"]) == {}
        assert outside(after, ["doomed-tenant"]) == outside(before, ["doomed-tenant"])
        assert (await op.get_operation(started.name)).done  # still answerable, naming nothing
        assert [k async for k in op.list("")] == []


async def test_a_put_retried_after_an_agent_erasure_gets_its_first_answer(storage: Storage, app: App) -> None:
    """The agent's KV request-id markers outlive an agent erasure on every
    backend (docs/lifecycle.md): a retry within the window is answered from
    its marker and writes nothing, instead of creating the erased key again."""
    async with connect(app, "op-doomed") as op:
        key = author_kv("doomed-agent")("setting")
        first = await op.put(key, b"author-kv", request_id="put-1")
        done = await op.wait_operation((await op.erase_agent("doomed-agent")).name)
        assert done.done and await op.get_with_version(key) is None
        assert await op.put(key, b"author-kv", request_id="put-1") == first  # the first answer
        assert await op.get_with_version(key) is None, "the retry wrote the erased key again"


async def test_no_session_of_the_scope_is_created_while_an_erasure_runs(
    storage: Storage, app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSession, Deliver by key and Fork answer FAILED_PRECONDITION /
    ERASURE_IN_PROGRESS naming the operation, and write nothing; once the
    operation is done the same calls create whole sessions."""
    gate = asyncio.Event()
    real_step = Eraser._step

    async def held(self: Eraser, state: dict[str, object], *claim: object) -> None:
        await gate.wait()
        await real_step(self, state, *claim)  # type: ignore[arg-type]

    monkeypatch.setattr(Eraser, "_step", held)
    async with connect(app, "op-doomed") as op, connect(app, "svc-doomed") as svc:
        parent = (await svc.open_session("doomed-agent", "parent")).session_id
        started = await op.erase_agent("doomed-agent", request_id="erase-1")
        for call in (
            svc.open_session("doomed-agent", "chan"),
            svc.deliver(b"event", agent="doomed-agent", session_key="chan"),
            svc.fork(parent, 0, "child"),
        ):
            with pytest.raises(errors.ErasureInProgress) as info:
                await call
            assert info.value.code == "FAILED_PRECONDITION"
            assert info.value.metadata["operation"] == started.name
        assert not (await op.get_operation(started.name)).done
        assert (await svc.open_session("kept-agent", "chan")).session_id  # another agent is not in scope
        gate.set()
        assert (await op.wait_operation(started.name)).done
        fresh = (await svc.open_session("doomed-agent", "chan")).session_id
        lease = await svc.acquire_lease(fresh, "holder", ttl=600)
        await svc.commit(fresh, lease.generation, 0, [b"r1"])
        assert (await svc.get_session(fresh)).seq == 1
