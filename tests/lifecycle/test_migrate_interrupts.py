"""`fencepost migrate` interrupted again and again (Ctrl-C after a
checkpoint, or in the middle of a page's writes), from SQLite (with
request-id markers kept in rows) and from DynamoDB: the same command, run
again each time, finishes with an exact copy, versions included."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from fencepost_server.cli import main
from fencepost_server.lifecycle import Exit
from fencepost_server.lifecycle.migrate import Checkpoint
from fencepost_server.storage import Item, open_backend
from fencepost_server.storage.dynamodb import DynamoStorage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import running
from tests.lifecycle.cli_support import exported

from .test_restore_services import dynamo_url

INTERRUPTED = 130


async def _fill(url: str) -> list[Item]:
    """Items in many partitions (tenants, services, global indexes), some
    written with a request id (on SQLite their markers live in the item's row)."""
    storage = open_backend(url)
    try:
        async with running(storage) as srv, srv.client(timeout=30) as c:
            for i in range(40):
                await c.put(f"k/{i:03d}", f"v{i}".encode(), request_id=f"req-{i}" if i % 3 else "")
            for i in range(4):
                sid = (await c.open_session(f"agent-{i}", "chan")).session_id
                lease = await c.acquire_lease(sid, "h", ttl=60)
                await c.commit(sid, lease.generation, 0, [b"r1", b"r2"], commit_id=f"c{i}")
                await c.memory_append(f"agent-{i}", "a fact")
            for i in range(40):
                await storage.put(f"t{i % 5}/sys/x/{i:03d}", b"raw")
    finally:
        await storage.close()
    return await exported(url)


def ctrl_c() -> None:
    """What the operator's Ctrl-C does: SIGINT to the process (asyncio.run cancels the command)."""
    signal.raise_signal(signal.SIGINT)


def _run_until_done(argv: list[str], interrupt: Any, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run `argv` with `interrupt` patched in until it exits 0; how many runs it took."""
    for run in range(1, 200):
        with monkeypatch.context() as patch:
            interrupt(patch, run)
            code = main(argv)
        if code == 0:
            return run
        assert code == INTERRUPTED, code
    raise AssertionError("never finished")


def _after_every_third_checkpoint(patch: pytest.MonkeyPatch, run: int) -> None:
    real, saves = Checkpoint.save, [0]

    def save(self: Checkpoint) -> None:
        real(self)
        saves[0] += 1
        if self.phase == "copy" and self.copied and saves[0] % 3 == 0:
            ctrl_c()

    patch.setattr(Checkpoint, "save", save)


def _in_the_middle_of_a_page(patch: pytest.MonkeyPatch, run: int) -> None:
    """Half of the third page of this run is written, then Ctrl-C (the first is checkpointed by then)."""
    for cls in (SqliteStorage, DynamoStorage):
        real, calls = cls.import_items, [0]

        async def import_items(self: Any, items: Any, real: Any = real, calls: list[int] = calls) -> None:
            calls[0] += 1
            if calls[0] == 3 and len(items) > 1:
                await real(self, items[: len(items) // 2])
                ctrl_c()
                await asyncio.sleep(60)  # the interrupt cancels the command meanwhile
            await real(self, items)

        patch.setattr(cls, "import_items", import_items)


@pytest.mark.parametrize("interrupt", [_after_every_third_checkpoint, _in_the_middle_of_a_page])
@pytest.mark.parametrize("route", [
    pytest.param("sqlite->sqlite", id="sqlite-sqlite"),
    pytest.param("sqlite->dynamodb", id="sqlite-dynamodb", marks=pytest.mark.backend("dynamodb")),
    pytest.param("dynamodb->sqlite", id="dynamodb-sqlite", marks=pytest.mark.backend("dynamodb")),
])
def test_interrupted_again_and_again_then_exact(
    tmp_path: Path, route: str, interrupt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def url(kind: str, name: str) -> str:
        return asyncio.run(dynamo_url()) if kind == "dynamodb" else f"sqlite://{tmp_path / name}"

    kinds = route.split("->")
    source, target = url(kinds[0], "source.db"), url(kinds[1], "target.db")
    expected = asyncio.run(_fill(source))
    assert any(i.key.startswith("#/req/") for i in expected)
    argv = ["migrate", "--from", source, "--to", target, "--work-dir", str(tmp_path / "work"), "--page", "9"]
    runs = _run_until_done(argv, interrupt, monkeypatch)
    assert runs > 3
    assert asyncio.run(exported(target)) == expected
    assert main(argv) == Exit.OK  # once more: it only verifies again


@pytest.mark.parametrize("route", [
    pytest.param("sqlite->sqlite", id="sqlite-sqlite"),
    pytest.param("dynamodb->sqlite", id="dynamodb-sqlite", marks=pytest.mark.backend("dynamodb")),
])
async def test_a_source_that_fails_mid_copy_exits_1_and_the_rerun_resumes(
    tmp_path: Path, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's read fails after some pages (an outage, a throttled
    table past its retries): the command ends with exit 1 and says to run it
    again - it used to wait forever for the next page - and the rerun
    resumes and verifies."""
    from fencepost_server.lifecycle import LifecycleError, migrate
    from fencepost_server.storage import BackendUnavailable

    source = await dynamo_url() if route.startswith("dynamodb") else f"sqlite://{tmp_path / 'source.db'}"
    target = f"sqlite://{tmp_path / 'target.db'}"
    expected = await _fill(source)
    cls = DynamoStorage if route.startswith("dynamodb") else SqliteStorage
    real = cls.export_items

    async def fails_after_three_pages(self: Any, start_after: Any = None, page: int = 1000) -> Any:
        n = 0
        async for items in real(self, start_after, page):
            if n == 3:
                raise BackendUnavailable("the source stopped answering")
            n += 1
            yield items

    monkeypatch.setattr(cls, "export_items", fails_after_three_pages)
    with pytest.raises(LifecycleError) as failed:
        await asyncio.wait_for(migrate(source, target, work_dir=tmp_path / "work", page=9), 20)
    assert failed.value.code == Exit.FAILED and "run the same command again" in str(failed.value)
    monkeypatch.setattr(cls, "export_items", real)
    report = await migrate(source, target, work_dir=tmp_path / "work", page=9)
    assert report.verification.same and report.resumed_after >= 9
    assert await exported(target) == expected
