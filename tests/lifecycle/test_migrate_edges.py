"""`fencepost migrate` (a process, as an operator runs it) sqlite -> DynamoDB
and back, over the items at the edges of what the server accepts: the
longest keys, the largest values, binary values, non-ASCII and NUL-bearing
agent names (percent-encoded, or hashed when long), records and inbox
payloads at their size limit. Every one comes back byte for byte with its
version, and a version read before still applies after."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost_server.storage import open_backend
from tests.conftest import running
from tests.lifecycle.cli_support import exported

from .service_state import SERVER_SETTINGS
from .test_restore_services import cli, dynamo_url

MAX_VALUE = 256 * 1024
LONG_KEY = "é" * 512  # 1024 UTF-8 bytes: the longest key
KEYS = [LONG_KEY, "x" * 1023 + "/", "🙂/emoji", "a", "a/", "a/b", "sp ace/tab\there", "z" * 10]
AGENTS = ["ägënt " * 41, "nul\x00agent", "plain"]  # 246 characters, 369 bytes (hashed); a NUL; ASCII
LEDGER_AGENTS = ["ü" * 120, "plain"]  # the ledger takes agent names up to 256 bytes, without NUL
EVAL_AGENTS = [AGENTS[0], "plain"]  # evals take no NUL


async def write_edges(c: fencepost.AsyncClient) -> dict[str, Any]:
    versions: dict[str, str] = {}
    for i, key in enumerate(KEYS):
        versions[key] = await c.put(key, bytes((i + n) % 256 for n in range(i * 37)))
    versions["max/value"] = await c.put("max/value", os.urandom(MAX_VALUE))
    versions["max/empty"] = await c.put("max/empty", b"")
    versions[LONG_KEY] = await c.put(LONG_KEY, os.urandom(MAX_VALUE))  # longest key, largest value
    sessions = []
    for agent in AGENTS:
        await c.memory_append(agent, f"a fact of {agent!r}", about=["topic"])
        await c.append_turn(agent, {"at": "2026-01-01T00:00:00Z", "sessionId": "s", "channelId": "c",
                                    "status": "completed", "result": "r" * 1000})
    for agent in EVAL_AGENTS:
        await c.put_eval_run(agent, "run-" + "ü" * 100, {"score": 1})
    for agent in LEDGER_AGENTS:
        sid = (await c.open_session(agent, "k" * 200)).session_id
        lease = await c.acquire_lease(sid, "h", ttl=3600)
        await c.commit(sid, lease.generation, 0, [os.urandom(MAX_VALUE), b""])
        await c.deliver(os.urandom(MAX_VALUE), session_id=sid, dedupe_key="d" * 100)
        sessions.append(sid)
    return {"versions": versions, "sessions": sessions}


async def read_edges(c: fencepost.AsyncClient, w: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["kv"] = [e async for e in c.list("")]
    assert {e.key for e in out["kv"]} >= set(w["versions"])
    for key in w["versions"]:
        out[f"get {key[:20]}"] = await c.get_with_version(key)
    for agent in AGENTS:
        out[f"memory {agent[:10]}"] = [e async for e in c.memory_list_all(agent, all_validity=True)]
        out[f"journal {agent[:10]}"] = await c.read_journal(agent)
    for agent in EVAL_AGENTS:
        out[f"evals {agent[:10]}"] = [r async for r in c.list_eval_runs(agent)]
    for agent, sid in zip(LEDGER_AGENTS, w["sessions"], strict=True):
        out[f"session {agent[:10]}"] = await c.get_session(sid)
        out[f"log {agent[:10]}"] = [r async for r in c.read_log(sid)]
        out[f"inbox {agent[:10]}"] = [e async for e in c.list_inbox(sid)]
        out[f"resolve {agent[:10]}"] = await c.resolve_session(agent, "k" * 200)
    return out


async def serve_and_read(url: str, w: dict[str, Any]) -> dict[str, Any]:
    storage = open_backend(url)
    try:
        async with running(storage, **SERVER_SETTINGS) as srv, srv.client(timeout=60) as c:
            return await read_edges(c, w)
    finally:
        await storage.close()


@pytest.mark.backend("dynamodb")
async def test_edge_items_survive_sqlite_to_dynamodb_and_back(tmp_path: Path) -> None:
    first = f"sqlite://{tmp_path / 'first.db'}"
    storage = open_backend(first)
    try:
        async with running(storage, **SERVER_SETTINGS) as srv, srv.client(timeout=60) as c:
            w = await write_edges(c)
            before = await read_edges(c, w)
    finally:
        await storage.close()
    table, last = await dynamo_url(), f"sqlite://{tmp_path / 'last.db'}"

    for source, target, work in ((first, table, "w1"), (table, last, "w2")):
        done = cli("migrate", "--from", source, "--to", target, "--work-dir", str(tmp_path / work), "--page", "7")
        assert done.returncode == 0, done.stderr
        assert "identical" in done.stdout
        assert (tmp_path / work).stat().st_mode & 0o777 == 0o700  # its snapshot holds every item
        assert await serve_and_read(target, w) == before, target
    assert await exported(last) == await exported(first)

    storage = open_backend(table)
    try:
        async with running(storage, **SERVER_SETTINGS) as srv, srv.client(timeout=60) as c:
            for key, version in w["versions"].items():
                assert (await c.put_if_version(key, b"after", version)).applied, key
    finally:
        await storage.close()
