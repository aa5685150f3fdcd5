"""An agent erasure cut short on SQLite (the replica died mid-operation),
then the store migrated to DynamoDB (or restored from a backup): a server on
the new store finishes the operation, and a raw read of the new store finds
nothing of the agent - its partition directory rows included - while
everything else is unchanged."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from fencepost_server.config import Settings
from fencepost_server.app import App
from fencepost_server.domain.erasure import Eraser
from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import Storage, open_backend
from fencepost_server.storage.dynamodb import DynamoStorage
from tests.conftest import running
from tests.dynamo_support import TEST_PARTITION_CACHE, moto_endpoint, REGION
from tests.raw_store import raw_items

from .test_erase_scopes import agent_needles, naming, outside, write_everything
from .test_restore_services import MOVES, cli, dynamo_url, move

TENANT = "default"  # unauthenticated local use
#: as test_erase_scopes' server: small journals, so a few appends rotate into archives
JOURNALS: dict[str, Any] = {"max_journal_bytes": 1500, "journal_flush_seconds": 3600}


def _data(items: dict[str, bytes], needles: list[str]) -> dict[str, bytes]:
    return {k: v for k, v in outside(items, needles).items() if not k.startswith("#/erasing/")}


class Crash(Exception):
    pass


def _open(url: str) -> Storage:
    if url.startswith("dynamodb://"):
        table = url.split("://", 1)[1].split("?", 1)[0]
        return DynamoStorage(table, endpoint_url=moto_endpoint(), region=REGION, **TEST_PARTITION_CACHE)
    return open_backend(url)


async def _crash_an_erasure(url: str, steps: int) -> str:
    """Start erasing `doomed-agent` as a replica whose clock says two minutes
    ago (its claim has long expired by the real clock), and die after `steps`
    (0: once the directory phase recorded the partition names it forgets)."""
    storage = _open(url)
    try:
        clock = lambda: time.time() - 120  # noqa: E731
        eraser = Eraser(storage, Ledger(storage, clock=clock), clock=clock, claim_seconds=30)
        op = await eraser.start(TENANT, "doomed-agent", "rid")
        real, done = eraser._step, [0]

        async def dies(state: dict[str, object], *held: Any) -> None:
            done[0] += 1
            in_directory = state["phase"] == "directory" and state.get("waited") is not None
            if (done[0] > steps) if steps else in_directory:
                raise Crash  # as kill -9: the claim stays, nothing else is written
            await real(state, *held)

        eraser._step = dies  # type: ignore[method-assign]
        with pytest.raises(Crash):
            await eraser.run_pending()
        assert not (await eraser.get(TENANT, op.name)).done
        return op.name
    finally:
        await storage.close()


@pytest.mark.parametrize(("route", "steps"), [
    pytest.param("migrate", 1, id="migrate-sqlite-dynamodb-fence", marks=pytest.mark.backend("dynamodb")),
    pytest.param("migrate", 4, id="migrate-sqlite-dynamodb-sweep", marks=pytest.mark.backend("dynamodb")),
    pytest.param("restore", 1, id="restore-sqlite-sqlite-fence"),
    pytest.param("restore", 4, id="restore-sqlite-sqlite-sweep"),
    pytest.param("migrate back", 0, id="migrate-dynamodb-sqlite-directory", marks=pytest.mark.backend("dynamodb")),
])
async def test_an_erasure_cut_short_is_finished_on_the_new_store(tmp_path: Path, route: str, steps: int) -> None:
    source_url = await dynamo_url() if route == "migrate back" else f"sqlite://{tmp_path / 'source.db'}"
    source = _open(source_url)
    try:
        async with running(source, **JOURNALS) as srv, srv.client(timeout=30) as c:
            doomed = await write_everything(c, "doomed-agent")
            await write_everything(c, "kept-agent")
    finally:
        await source.close()
    name = await _crash_an_erasure(source_url, steps)

    target_url = await move(route, source_url, tmp_path)

    needles = agent_needles("doomed-agent", doomed)
    target = _open(target_url)
    try:
        before = raw_items(target)
        assert naming(before, needles)
        app = App(Settings(listen="127.0.0.1:0", erasure_poll_seconds=0.2, **JOURNALS), storage=target)
        await app.start()
        try:
            import fencepost

            async with fencepost.AsyncClient(f"127.0.0.1:{app.port}", timeout=60) as c:
                finished = await c.wait_operation(name)
                assert finished.done and finished.sessions_fenced == 2
                after = raw_items(target)
                assert naming(after, needles) == {}, "the erasure left the agent's data on the new store"
                # the scope's erasure markers go with the operation; nothing else changed
                assert _data(after, needles) == _data(before, needles)
                assert [e async for e in c.memory_list_all("kept-agent")]
        finally:
            await app.stop(grace=0.2)
    finally:
        await target.close()


async def test_a_stale_erasure_marker_from_a_mixed_read_does_not_refuse_sessions_forever(tmp_path: Path) -> None:
    """A logical read of a live table can hold an erasure's markers read
    before it finished and its record read after, finished. A server
    starting on the restored store takes such markers out: the agent's
    sessions can be created again."""
    import fencepost
    from fencepost import errors

    source_url = f"sqlite://{tmp_path / 'source.db'}"
    storage = open_backend(source_url)
    try:
        eraser = Eraser(storage, Ledger(storage))
        op = await eraser.start(TENANT, "doomed-agent", "rid")
        markers = [i for page in [await storage.list("#/erasing/", None, 1000)] for i in page]
        assert markers
        await eraser.run_pending()
        assert (await eraser.get(TENANT, op.name)).done
        for item in markers:  # the mixed read: markers from before `done`
            await storage.put(item.key, item.value)
    finally:
        await storage.close()
    assert cli("backup", "--backend", source_url, "--out", str(tmp_path / "x.arch")).returncode == 0
    target_url = f"sqlite://{tmp_path / 'target.db'}"
    assert cli("restore", "--backend", target_url, "--in", str(tmp_path / "x.arch")).returncode == 0

    target = open_backend(target_url)
    try:
        async with running(target, erasure_poll_seconds=0.2) as srv, \
                fencepost.AsyncClient(srv.target, timeout=30) as c:
            for _ in range(100):
                try:
                    sid = (await c.open_session("doomed-agent", "chan")).session_id
                    break
                except errors.ErasureInProgress:  # until the start-up pass took the marker out
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the stale marker refuses the agent's sessions")
            assert (await c.get_session(sid)).session_id == sid
    finally:
        await target.close()


@pytest.mark.parametrize("route", MOVES)
async def test_a_delete_session_cut_short_is_swept_on_the_new_store(tmp_path: Path, route: str) -> None:
    """DeleteSession's tombstone landed, its sweep did not (the call was cut
    short); the store moved. The janitor on the new store finishes the sweep:
    every read says SESSION_NOT_FOUND, nothing names the session, and its key
    opens a new session."""
    import fencepost
    from fencepost import errors
    from tests.raw_store import raw_keys_naming

    source_url = f"sqlite://{tmp_path / 'source.db'}"
    source = open_backend(source_url)
    try:
        async with running(source) as srv, srv.client(timeout=30) as c:
            sid = (await c.open_session("agent", "chan")).session_id
            lease = await c.acquire_lease(sid, "h", ttl=60)
            await c.commit(sid, lease.generation, 0, [b"r%d" % i for i in range(50)], commit_id="c1")
            await c.deliver(b"B" * (70 * 1024), session_id=sid)  # pending, with a blob
            kept = (await c.open_session("agent", "other")).session_id
    finally:
        await source.close()
    source = open_backend(source_url)
    try:  # the tombstone alone, a minute ago
        await Ledger(source, clock=lambda: time.time() - 60).tombstone(TENANT, sid, force=True)
    finally:
        await source.close()

    target_url = await move(route, source_url, tmp_path)

    target = _open(target_url)
    try:
        assert raw_keys_naming(target, sid)
        async with running(target, ledger_janitor_seconds=0.2, ledger_orphan_grace_seconds=1) as srv, \
                fencepost.AsyncClient(srv.target, timeout=30) as c:
            with pytest.raises(errors.SessionNotFound):
                await c.get_session(sid)
            for _ in range(300):
                if not raw_keys_naming(target, sid):
                    break
                await asyncio.sleep(0.1)
            assert raw_keys_naming(target, sid) == [], "the janitor left the session on the new store"
            fresh = (await c.open_session("agent", "chan")).session_id
            assert fresh != sid
            assert (await c.get_session(kept)).session_id == kept
    finally:
        await target.close()
