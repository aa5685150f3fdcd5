"""Tenant B, authenticated, reaches nothing of tenant A's — whatever real ids,
keys and agent names of A's it sends, on every service (a fuzzed corpus)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost import errors
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage import Storage
from tests.api.security_support import write_tokens

TURN = {"at": "2026-11-29T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}


@pytest.fixture
async def two_tenants(tmp_path: Path, storage: Storage):  # type: ignore[no-untyped-def]
    settings = Settings(listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json"),
                        ledger_janitor_seconds=0.1, ledger_orphan_grace_seconds=0.1)
    app = App(settings, storage=storage)
    await app.start()
    target = f"127.0.0.1:{app.port}"
    async with fencepost.AsyncClient(target, token="token-tenant-a", timeout=20) as a, \
            fencepost.AsyncClient(target, token="token-tenant-b", timeout=20, retry=fencepost.NO_RETRY) as b:
        yield a, b
    await app.stop(grace=0.2)


async def _corpus_of_a(a: fencepost.AsyncClient) -> dict[str, list[Any]]:
    """Real ids of tenant A: sessions (one orphaned with an event pending),
    inbox ids, memory entries, journals, eval runs, KV keys."""
    c: dict[str, list[Any]] = {k: [] for k in ("agent", "session", "key", "inbox", "entry", "gen", "run")}
    for i in range(3):
        agent, key = f"agent-{i}", f"chan/{i}/é"
        c["agent"].append(agent)
        c["key"].append(key)
        info = await a.open_session(agent, key)
        c["session"].append(info.session_id)
        lease = await a.acquire_lease(info.session_id, "a-holder", ttl=30)
        c["gen"].append(lease.generation)
        await a.commit(info.session_id, lease.generation, 0, [b"a-secret-record"])
        c["inbox"].append((await a.deliver(b"a-secret-event", session_id=info.session_id)).inbox_id)
        c["entry"].append((await a.memory_append(agent, f"a secret fact {i}", about=["secret"])).id)
        await a.append_turn(agent, {**TURN, "title": "a secret turn"})
        await a.put_eval_run(agent, f"run-{i}", {"score": i})
        c["run"].append(f"run-{i}")
        await a.put(key, b"a-secret-value")
    # one orphan: lease released by force with its event still pending
    await a.release_lease(c["session"][0], c["gen"][0], force=True)
    return c


async def _leaked(call: Callable[[], Awaitable[Any]], *, empty: Callable[[Any], bool] = lambda r: not r) -> bool:
    """True when B got something of A's back (anything but NOT_FOUND / an empty answer)."""
    try:
        result = await call()
    except (errors.NotFound, errors.LeaseFenced, errors.InboxEntryGone, errors.SequenceMismatch):
        return False
    return not empty(result)


async def _collect(agen: Any) -> list[Any]:
    return [x async for x in agen]


async def test_tenant_b_reaches_nothing_of_tenant_a(two_tenants: Any, scaled: Callable[[int, int], int]) -> None:
    a, b = two_tenants
    c = await _corpus_of_a(a)
    rng = random.Random(11)
    attempts = scaled(1000, 240)
    leaks: list[str] = []

    def pick(kind: str) -> Any:
        return rng.choice(c[kind])

    probes: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
        ("get_session", lambda: _leaked(lambda: b.get_session(pick("session")))),
        ("resolve_session", lambda: _leaked(lambda: b.resolve_session(pick("agent"), pick("key")))),
        ("read_log", lambda: _leaked(lambda: _collect(b.read_log(pick("session"))))),
        ("list_inbox", lambda: _leaked(lambda: _collect(b.list_inbox(pick("session"))))),
        ("list_sessions", lambda: _leaked(lambda: _collect(b.list_sessions(pick("agent"))))),
        ("acquire", lambda: _leaked(lambda: b.acquire_lease(pick("session"), "b-holder", ttl=1))),
        ("commit", lambda: _leaked(lambda: b.commit(pick("session"), pick("gen"), 1, [b"b"],
                                                    consume=[pick("inbox")]))),
        ("release", lambda: _leaked(lambda: b.release_lease(pick("session"), pick("gen"), force=True),
                                    empty=lambda r: False)),
        ("deliver", lambda: _leaked(lambda: b.deliver(b"b", session_id=pick("session")))),
        ("fork", lambda: _leaked(lambda: b.fork(pick("session"), 1, "b-child"))),
        ("memory_search", lambda: _leaked(lambda: b.memory_search(pick("agent"), "secret"),
                                          empty=lambda r: not r.entries)),
        ("memory_list", lambda: _leaked(lambda: _collect(b.memory_list_all(pick("agent"))))),
        ("memory_forget", lambda: _leaked(lambda: b.memory_forget(pick("agent"), pick("entry")))),
        ("memory_pin", lambda: _leaked(lambda: b.memory_pin(pick("agent"), pick("entry")),
                                       empty=lambda r: not r.pinned)),
        ("memory_topics", lambda: _leaked(lambda: b.memory_topics(pick("agent")))),
        ("read_journal", lambda: _leaked(lambda: b.read_journal(pick("agent")))),
        ("list_eval_runs", lambda: _leaked(lambda: _collect(b.list_eval_runs(pick("agent"))))),
        ("get_eval_run", lambda: _leaked(lambda: b.get_eval_run(pick("agent"), pick("run")))),
        ("kv_get", lambda: _leaked(lambda: b.get(pick("key")))),
        ("kv_list", lambda: _leaked(lambda: _collect(b.list("")))),
    ]
    for i in range(attempts):
        name, probe = probes[i % len(probes)]
        if await probe():
            leaks.append(name)
    # The janitor runs every 0.1 s: B's long-poll must never be handed A's orphan.
    claimed = await b.claim_orphan("b-worker", ttl=5, wait=0.5)
    if claimed is not None:
        leaks.append("claim_orphan")
    assert leaks == []
    # A still sees its own data, untouched by B's attempts.
    s0 = await a.get_session(c["session"][0])
    assert s0.seq == 1 and [e.inbox_id async for e in a.list_inbox(c["session"][0])] == [c["inbox"][0]]
    assert len((await a.memory_search(c["agent"][0], "secret")).entries) == 1
    recovered = await a.claim_orphan("a-worker", ttl=5, wait=5)
    assert recovered is not None and recovered.session_id == c["session"][0]


async def test_service_role_cannot_import_memory(two_tenants: Any) -> None:
    _, b = two_tenants
    with pytest.raises(errors.PermissionDenied) as info:
        await b.memory_import("agent", [])
    assert info.value.code == "PERMISSION_DENIED"
    await asyncio.sleep(0)
