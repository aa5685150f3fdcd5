"""AIP-155 request ids across a move: a mutation retried with its request id
after a backup / restore or a migration (run as processes) answers its first
outcome and applies nothing again - in every service that takes one, also
where running the request again would answer differently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost_server.storage import open_backend
from tests.conftest import running

from .service_state import SERVER_SETTINGS
from .test_restore_services import cli, dynamo_url

AGENT = "agent-r"


async def first_outcomes(c: fencepost.AsyncClient) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["put_if_absent"] = await c.put_if_absent("r/absent", b"first", request_id="rid-absent")
    v = await c.put("r/cas", b"v0")
    out["put_if_version"] = (v, await c.put_if_version("r/cas", b"v1", v, request_id="rid-cas"))
    out["txn"] = await c.txn([fencepost.compare("r/txn", exists=False)], [fencepost.put_op("r/txn", b"t")],
                             request_id="rid-txn")
    entry = await c.memory_append(AGENT, "the first fact", request_id="rid-append")
    out["memory_append"] = entry.id
    other = await c.memory_append(AGENT, "a fact to forget")
    out["memory_forget"] = (other.id, await c.memory_forget(AGENT, other.id, request_id="rid-forget"))
    out["memory_pin"] = (entry.id, (await c.memory_pin(AGENT, entry.id, request_id="rid-pin")).pinned)
    out["append_turn"] = await c.append_turn(AGENT, {"at": "2026-01-01T00:00:00Z", "sessionId": "s",
                                                     "channelId": "c", "status": "completed"},
                                             request_id="rid-turn")
    await c.put_eval_run(AGENT, "run-1", {"score": 1})
    out["delete_eval_run"] = await c.delete_eval_run(AGENT, "run-1", request_id="rid-del-run")
    out["erase_agent"] = (await c.erase_agent("agent-gone", request_id="rid-erase")).name
    return out


async def state(c: fencepost.AsyncClient) -> dict[str, Any]:
    return {
        "kv": [e async for e in c.list("r/")],
        "memory": [e async for e in c.memory_list_all(AGENT, all_validity=True)],
        "pinned": await c.memory_pinned(AGENT),
        "journal": await c.read_journal(AGENT),
        "runs": [r async for r in c.list_eval_runs(AGENT)],
    }


async def retried(c: fencepost.AsyncClient, first: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["put_if_absent"] = await c.put_if_absent("r/absent", b"first", request_id="rid-absent")
    v = first["put_if_version"][0]  # no longer the key's version: run again, the CAS would fail
    out["put_if_version"] = (v, await c.put_if_version("r/cas", b"v1", v, request_id="rid-cas"))
    out["txn"] = await c.txn([fencepost.compare("r/txn", exists=False)], [fencepost.put_op("r/txn", b"t")],
                             request_id="rid-txn")
    out["memory_append"] = (await c.memory_append(AGENT, "the first fact", request_id="rid-append")).id
    other_id = first["memory_forget"][0]
    out["memory_forget"] = (other_id, await c.memory_forget(AGENT, other_id, request_id="rid-forget"))
    entry_id = first["memory_pin"][0]
    out["memory_pin"] = (entry_id, (await c.memory_pin(AGENT, entry_id, request_id="rid-pin")).pinned)
    out["append_turn"] = await c.append_turn(AGENT, {"at": "2026-01-01T00:00:00Z", "sessionId": "s",
                                                     "channelId": "c", "status": "completed"},
                                             request_id="rid-turn")
    out["delete_eval_run"] = await c.delete_eval_run(AGENT, "run-1", request_id="rid-del-run")
    out["erase_agent"] = (await c.erase_agent("agent-gone", request_id="rid-erase")).name
    return out


@pytest.mark.parametrize("route", [
    pytest.param("restore sqlite-sqlite", id="restore-sqlite-sqlite"),
    pytest.param("migrate sqlite-dynamodb", id="migrate-sqlite-dynamodb", marks=pytest.mark.backend("dynamodb")),
    pytest.param("restore dynamodb-sqlite", id="restore-dynamodb-sqlite", marks=pytest.mark.backend("dynamodb")),
])
async def test_a_retry_after_the_move_answers_the_first_outcome(tmp_path: Path, route: str) -> None:
    how, kinds = route.split(" ")
    urls = [await dynamo_url() if kind == "dynamodb" else f"sqlite://{tmp_path / (kind + str(n) + '.db')}"
            for n, kind in enumerate(kinds.split("-"))]
    source = open_backend(urls[0])
    try:
        async with running(source, **SERVER_SETTINGS) as srv, srv.client(timeout=30) as c:
            first = await first_outcomes(c)
            await c.wait_operation(first["erase_agent"])
            before = await state(c)
            assert await retried(c, first) == first  # the retry before the move, for reference
            assert await state(c) == before
    finally:
        await source.close()

    if how == "migrate":
        done = cli("migrate", "--from", urls[0], "--to", urls[1], "--work-dir", str(tmp_path / "work"))
    else:
        archive = tmp_path / "x.arch"
        done = cli("backup", "--backend", urls[0], "--out", str(archive))
        assert done.returncode == 0, done.stderr
        done = cli("restore", "--backend", urls[1], "--in", str(archive))
    assert done.returncode == 0, done.stderr

    target = open_backend(urls[1])
    try:
        async with running(target, **SERVER_SETTINGS) as srv, srv.client(timeout=30) as c:
            again = await retried(c, first)
            for name in first:
                assert again[name] == first[name], name
            assert await state(c) == before, "a retry applied again"
    finally:
        await target.close()
