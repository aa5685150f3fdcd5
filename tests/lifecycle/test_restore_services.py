"""`fencepost backup` then `fencepost restore` (or `fencepost migrate`), run
as an operator runs them (processes), over a store holding every service's data: served by a real
server on each side, every read RPC answers the same, and what the move must
keep keeps its meaning - versions, lease generations, commit ids, dedupe
keys, request ids (a retry answers the first outcome) and page tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import fencepost
from fencepost_server.storage import open_backend
from tests.conftest import running
from tests.dynamo_support import backend_url, new_dynamo_storage

from .service_state import AGENT, SERVER_SETTINGS, populate, read_everything
from .test_migrate_services import _all_versions, _check_after_move


def cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`fencepost ...` as a process, the way an operator runs it."""
    return subprocess.run([sys.executable, "-m", "fencepost_server", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def dynamo_url() -> str:
    storage = await new_dynamo_storage()
    await storage.close()
    return backend_url(storage.table)


#: the routes `move` takes, SQLite to DynamoDB and SQLite to SQLite
MOVES = [
    pytest.param("migrate", id="migrate-sqlite-dynamodb", marks=pytest.mark.backend("dynamodb")),
    pytest.param("restore", id="restore-sqlite-sqlite"),
]


async def move(route: str, source_url: str, work: Path) -> str:
    """Move the store at `source_url` by `route` ("migrate": into a new
    DynamoDB table; "migrate back": into a new SQLite file; else a backup
    restored into a new SQLite file), as processes; the target's URL."""
    if route.startswith("migrate"):
        target_url = await dynamo_url() if route == "migrate" else f"sqlite://{work / 'target.db'}"
        done = cli("migrate", "--from", source_url, "--to", target_url, "--work-dir", str(work / "work"))
    else:
        target_url = f"sqlite://{work / 'target.db'}"
        assert cli("backup", "--backend", source_url, "--out", str(work / "x.arch")).returncode == 0
        done = cli("restore", "--backend", target_url, "--in", str(work / "x.arch"))
    assert done.returncode == 0, done.stderr
    return target_url


@dataclass
class Requests:
    """Writes made with a request id, and their first outcomes."""

    puts: dict[str, tuple[str, bytes, str]] = field(default_factory=dict)  # request id -> (key, value, version)
    deleted: tuple[str, str] = ("", "")  # (request id, key) of a delete that found its key
    superseded: str = ""  # a memory entry superseded before the move
    pages: dict[str, object] = field(default_factory=dict)  # listing -> (first page token, second page)


async def with_request_ids(c: fencepost.AsyncClient) -> Requests:
    r = Requests()
    for n in range(3):
        rid = str(uuid.uuid4())
        key, value = f"rid/{n}", f"first outcome {n}".encode()
        r.puts[rid] = (key, value, await c.put(key, value, request_id=rid))
    # the marker of rid/2's write moves out of its row (SQLite) when the item is overwritten
    (key, _, _), = [p for p in r.puts.values() if p[0] == "rid/2"]
    overwritten = await c.put(key, b"overwritten since")
    for rid, (k, v, _) in list(r.puts.items()):
        if k == key:
            r.puts[rid] = (k, v, overwritten)  # what a read shows; the retry answers its own version
    await c.put("rid/del", b"to delete")
    r.deleted = (str(uuid.uuid4()), "rid/del")
    assert await c.delete(r.deleted[1], request_id=r.deleted[0])
    entries = [e async for e in c.memory_list_all(AGENT)]
    r.superseded = entries[1].id
    await c.memory_append(AGENT, "deploys go through canary now", supersedes=r.superseded)
    return r


async def page_twice(c: fencepost.AsyncClient) -> dict[str, object]:
    """The first page token of a few listings, and the page it leads to."""
    pages: dict[str, object] = {}
    _, token = await c.list_page("app/", page_size=7)
    pages["kv"] = (token, await c.list_page("app/", page_size=7, page_token=token))
    _, token = await c.list_keys_page("app/", page_size=5)
    pages["kv keys"] = (token, await c.list_keys_page("app/", page_size=5, page_token=token))
    _, token = await c.list_sessions_page(AGENT, page_size=1)
    pages["sessions"] = (token, await c.list_sessions_page(AGENT, page_size=1, page_token=token))
    first = await c.memory_list(AGENT, page_size=2, all_validity=True)
    token = first.next_page_token
    pages["memory"] = (token, await c.memory_list(AGENT, page_size=2, all_validity=True, page_token=token))
    _, token = await c.list_eval_runs_page(AGENT, page_size=1)
    pages["evals"] = (token, await c.list_eval_runs_page(AGENT, page_size=1, page_token=token))
    assert all(token for token, _ in pages.values())  # type: ignore[misc]
    return pages


async def _continue_pages(c: fencepost.AsyncClient, pages: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, (token, _) in pages.items():  # type: ignore[misc]
        if name == "kv":
            out[name] = (token, await c.list_page("app/", page_size=7, page_token=token))
        elif name == "kv keys":
            out[name] = (token, await c.list_keys_page("app/", page_size=5, page_token=token))
        elif name == "sessions":
            out[name] = (token, await c.list_sessions_page(AGENT, page_size=1, page_token=token))
        elif name == "memory":
            out[name] = (token, await c.memory_list(AGENT, page_size=2, all_validity=True, page_token=token))
        elif name == "evals":
            out[name] = (token, await c.list_eval_runs_page(AGENT, page_size=1, page_token=token))
    return out


def _seen(pages: dict[str, object]) -> dict[str, object]:
    """What a page shows (tokens are sealed with a fresh nonce each time: only whether there is one)."""
    out: dict[str, object] = {}
    for name, (_, page) in pages.items():  # type: ignore[misc]
        if isinstance(page, tuple):
            out[name] = (page[0], bool(page[1]))
        else:
            out[name] = (list(page.entries), bool(page.next_page_token))  # type: ignore[attr-defined]
    return out


async def check_request_ids(c: fencepost.AsyncClient, r: Requests) -> None:
    """A retry with the same request id after the move answers the first outcome, once."""
    for rid, (key, value, shown) in r.puts.items():
        first = await c.put(key, value, request_id=rid)
        entry = await c.get_with_version(key)
        assert entry is not None and entry.version == shown, f"the retry of {key} applied again"
        if key != "rid/2":
            assert first == shown
    rid, key = r.deleted
    assert await c.delete(key, request_id=rid), "a retried delete must report that it found the key"


async def restore_round(source_url: str, target_url: str, tmp_path: Path, how: str = "restore") -> None:
    source = open_backend(source_url)
    try:
        async with running(source, **SERVER_SETTINGS) as srv, srv.client(timeout=30) as c:
            w = await populate(c)
            r = await with_request_ids(c)
            before = await read_everything(c, w)
            r.pages = await page_twice(c)
    finally:
        await source.close()
    before_versions = await _all_versions(source_url)

    if how == "migrate":
        done = cli("migrate", "--from", source_url, "--to", target_url, "--work-dir", str(tmp_path / "work"))
    else:
        archive = tmp_path / "backup.arch.gz"
        done = cli("backup", "--backend", source_url, "--out", str(archive))
        assert done.returncode == 0, done.stderr
        assert "items" in done.stdout and ("snapshot" in done.stdout or "quiesced" in done.stdout)
        assert archive.stat().st_mode & 0o777 == 0o600  # it holds every tenant's data
        done = cli("restore", "--backend", target_url, "--in", str(archive))
    assert done.returncode == 0, done.stderr
    assert "verified" in done.stdout and "identical" in done.stdout and "warning" not in done.stderr

    target = open_backend(target_url)
    try:
        async with running(target, **SERVER_SETTINGS) as srv, srv.client(timeout=30) as c:
            after = await read_everything(c, w)
            recalls = "memory.search recall counts"
            for name in before:
                if name != recalls:
                    assert after[name] == before[name], name
            assert after[recalls] == [n + 1 for n in before[recalls]]
            # a page token from before still opens, on the same next page
            assert _seen(await _continue_pages(c, r.pages)) == _seen(r.pages)
            await check_request_ids(c, r)
            await _check_after_move(c, w, before_versions)
    finally:
        await target.close()


@pytest.mark.backend("dynamodb")
async def test_sqlite_backup_restores_into_dynamodb_with_every_answer(tmp_path: Path) -> None:
    await restore_round(f"sqlite://{tmp_path / 'source.db'}", await dynamo_url(), tmp_path)


@pytest.mark.backend("dynamodb")
async def test_dynamodb_backup_restores_into_sqlite_with_every_answer(tmp_path: Path) -> None:
    await restore_round(await dynamo_url(), f"sqlite://{tmp_path / 'target.db'}", tmp_path)


async def test_sqlite_backup_restores_into_sqlite_with_every_answer(tmp_path: Path) -> None:
    await restore_round(f"sqlite://{tmp_path / 'source.db'}", f"sqlite://{tmp_path / 'target.db'}", tmp_path)


@pytest.mark.backend("dynamodb")
async def test_sqlite_migrated_into_dynamodb_keeps_request_ids_and_page_tokens(tmp_path: Path) -> None:
    await restore_round(f"sqlite://{tmp_path / 'source.db'}", await dynamo_url(), tmp_path, "migrate")


@pytest.mark.backend("dynamodb")
async def test_dynamodb_migrated_into_sqlite_keeps_request_ids_and_page_tokens(tmp_path: Path) -> None:
    await restore_round(await dynamo_url(), f"sqlite://{tmp_path / 'target.db'}", tmp_path, "migrate")
