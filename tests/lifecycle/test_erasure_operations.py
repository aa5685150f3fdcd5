"""Erasure operations survive a replica dying mid-way and several replicas at once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fencepost_server.domain.erasure import Eraser
from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import Storage
from tests.domain.test_ledger import FakeClock
from tests.raw_store import raw_keys_naming

T = "tenant"


async def _agent_with_sessions(ledger: Ledger, agent: str, n: int) -> list[str]:
    sids = []
    for i in range(n):
        sid = (await ledger.open(T, agent, f"k{i}"))[0].session_id
        lease = await ledger.acquire(T, sid, "h", ttl=30)
        await ledger.commit(T, sid, lease.generation, 0, [b"r%d" % j for j in range(3)])
        sids.append(sid)
    return sids


class Crash(Exception):
    pass


async def test_a_replica_dying_mid_operation_leaves_it_to_another(storage: Storage) -> None:
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sids = await _agent_with_sessions(ledger, "doomed", 6)
    kept = await _agent_with_sessions(ledger, "kept", 1)
    first = Eraser(storage, ledger, clock=clock, claim_seconds=30)
    op = await first.start(T, "doomed", "rid")
    steps = 0
    real_step = first._step

    async def dies_after_three(state, *held):  # type: ignore[no-untyped-def]
        nonlocal steps
        steps += 1
        if steps > 3:
            raise Crash  # as kill -9: the claim stays, nothing else is written
        await real_step(state, *held)

    first._step = dies_after_three  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await first.run_pending()
    partial = await first.get(T, op.name)
    assert not partial.done and partial.sessions_fenced == 3

    second = Eraser(storage, ledger, clock=clock, claim_seconds=30)
    assert await second.run_pending() == 0  # the claim is still live: hands off
    clock.now += 31
    assert await second.run_pending() == 1
    done = await second.get(T, op.name)
    assert done.done and done.sessions_fenced == 6 and done.agent == ""
    assert raw_keys_naming(storage, "/agentkit/v1/doomed/", *sids) == []
    assert (await ledger.get(T, kept[0])).seq == 3
    # the first replica comes back: nothing left to do, and it records nothing
    first._step = real_step  # type: ignore[method-assign]
    assert await first.run_pending() == 0


async def test_several_replicas_at_once(storage: Storage) -> None:
    ledger = Ledger(storage)
    sids = await _agent_with_sessions(ledger, "doomed", 4)
    replicas = [Eraser(storage, Ledger(storage)) for _ in range(3)]
    op = await replicas[0].start(T, None, "")
    await asyncio.gather(*(r.run_pending() for r in replicas))
    await asyncio.gather(*(r.run_pending() for r in replicas))  # whoever lost a race finishes now
    assert (await replicas[1].get(T, op.name)).done
    assert raw_keys_naming(storage, "tenant/", *sids) == []


async def test_agent_names_that_look_like_the_layout(storage: Storage) -> None:
    ledger = Ledger(storage)
    odd = {name: await _agent_with_sessions(ledger, name, 2) for name in ("durable-session", "s", "journal")}
    eraser = Eraser(storage, ledger)
    op = await eraser.start(T, "durable-session")
    await eraser.run_pending()
    assert (await eraser.get(T, op.name)).sessions_fenced == 2
    assert raw_keys_naming(storage, *odd["durable-session"]) == []
    for name in ("s", "journal"):
        for sid in odd[name]:
            assert (await ledger.get(T, sid)).seq == 3
    op = await eraser.start(T, None)
    await eraser.run_pending()
    assert (await eraser.get(T, op.name)).sessions_fenced == 4
    assert raw_keys_naming(storage, "tenant/") == []


async def test_a_request_id_never_returns_another_scopes_operation(storage: Storage) -> None:
    """An agent named "None" and the whole tenant, started with one request id:
    two operations, and the tenant's erasure runs."""
    ledger = Ledger(storage)
    eraser = Eraser(storage, ledger)
    await _agent_with_sessions(ledger, "other", 1)
    agent_op = await eraser.start(T, "None", request_id="r1")
    tenant_op = await eraser.start(T, None, request_id="r1")
    assert tenant_op.name != agent_op.name and tenant_op.agent == ""
    await eraser.run_pending()
    assert (await eraser.get(T, tenant_op.name)).sessions_fenced == 1
    assert raw_keys_naming(storage, "tenant/") == []


async def test_the_log_says_when_an_erasure_starts_and_ends_without_naming_its_scope(
        storage: Storage, caplog: pytest.LogCaptureFixture) -> None:
    # an operator's audit trail had only metrics; the lines name the operation, never the agent
    caplog.set_level(logging.INFO, logger="fencepost.erasure")
    ledger = Ledger(storage)
    await _agent_with_sessions(ledger, "secret-agent-name", 2)
    eraser = Eraser(storage, ledger)
    op = await eraser.start(T, "secret-agent-name", "")
    await eraser.run_pending()
    lines = [r.getMessage() for r in caplog.records if r.name == "fencepost.erasure"]
    assert f"erasure {op.name} started (agent scope)" in lines
    assert any(line.startswith(f"erasure {op.name} done: 2 sessions fenced, ") for line in lines)
    assert not any("secret-agent-name" in line for line in lines)


async def test_an_agent_name_holding_nul_is_erased(storage: Storage) -> None:
    """The journal (and memory) accept an agent name with NUL; EraseAgent
    refused it (AGENT_NAME_INVALID), so that agent's data could not be erased."""
    from fencepost_server.domain.journal import Journal
    from fencepost_server.domain.limits import Limits

    journal = Journal(storage, Limits())
    record = {"at": "2025-01-01T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}
    for agent in ("a\x00b", "a", "\x00"):
        await journal.append(T, agent, record, {"tag": agent})
    eraser = Eraser(storage, Ledger(storage))
    for agent in ("a\x00b", "\x00"):
        op = await eraser.start(T, agent)
        assert op.agent == agent
    await eraser.run_pending()
    assert await journal.read(T, "a\x00b") is None and await journal.read(T, "\x00") is None
    assert raw_keys_naming(storage, "/agentkit/v1/a%00b/", "/agentkit/v1/%00/") == []
    kept = await journal.read(T, "a")
    assert kept is not None and kept.records == 1


async def test_request_ids_keep_nul_holding_scopes_apart(storage: Storage) -> None:
    """One operation per (scope, request id) even when a name or request id
    holds NUL, which the operation id's seed used as its separator (and as
    the tenant scope's name)."""
    eraser = Eraser(storage, Ledger(storage))
    ops = [
        await eraser.start(T, None, request_id="r1"),
        await eraser.start(T, "\x00", request_id="r1"),
        await eraser.start(T, "a\x00b", request_id="r"),
        await eraser.start(T, "a", request_id="b\x00r"),
    ]
    assert len({op.name for op in ops}) == 4
    again = await eraser.start(T, "a\x00b", request_id="r")
    assert again.name == ops[2].name
