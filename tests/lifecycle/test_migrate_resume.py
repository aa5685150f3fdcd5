"""`fencepost migrate` as an operator runs it: a process, kill -9'd mid-copy,
run again: it resumes from its checkpoint and verifies clean."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fencepost_server.storage import Item, open_backend
from tests.dynamo_support import backend_url, new_dynamo_storage

ITEMS = 2000
PAGE = 25


def _migrate(source: str, target: str, work: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "migrate", "--from", source, "--to", target,
         "--work-dir", str(work), "--page", str(PAGE)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _copied(work: Path) -> int:
    try:
        return int(json.loads((work / "checkpoint.json").read_text())["copied"])
    except (OSError, ValueError, KeyError):
        return 0


async def _source(path: Path, items: int = ITEMS) -> str:
    url = f"sqlite://{path}"
    storage = open_backend(url)
    try:  # concurrent puts: the writer group-commits them
        await asyncio.gather(*(storage.put(f"t{i % 7}/kv/item-{i:05d}", os.urandom(i % 300)) for i in range(items)))
    finally:
        await storage.close()
    return url


@pytest.mark.backend("dynamodb")
async def test_kill_9_mid_copy_then_rerun_resumes_and_verifies(tmp_path: Path) -> None:
    source = await _source(tmp_path / "source.db")
    table = await new_dynamo_storage()
    await table.close()
    target = backend_url(table.table)
    work = tmp_path / "work"

    first = _migrate(source, target, work)
    deadline = time.monotonic() + 300
    while _copied(work) < ITEMS // 4:
        assert first.poll() is None, f"migrate ended before it could be killed: {first.communicate()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    killed_at = _copied(work)
    assert 0 < killed_at < ITEMS

    second = _migrate(source, target, work)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    assert f"resumed after {killed_at} items" in out
    assert f"verified: {ITEMS} items on both sides" in out
    assert not list(work.glob("source-snapshot.db*"))  # cleaned up once verified

    # the copy is exact, versions included
    src, dst = open_backend(source), open_backend(target)
    try:
        a: list[Item] = [i async for page in src.export_items() for i in page]
        b: list[Item] = [i async for page in dst.export_items() for i in page]
        assert a == b and len(a) == ITEMS
    finally:
        await src.close()
        await dst.close()

    # a third run only verifies again; a different migration's work dir is refused
    third = _migrate(source, target, work)
    out, _ = third.communicate(timeout=600)
    assert third.returncode == 0 and "already copied" in out
    other = _migrate(source, f"sqlite://{tmp_path / 'elsewhere.db'}", work)
    _, err = other.communicate(timeout=60)
    assert other.returncode == 3 and "belongs to the migration" in err


async def test_migrate_refuses_a_non_empty_target(tmp_path: Path) -> None:
    source = await _source(tmp_path / "source.db", 10)
    target_url = f"sqlite://{tmp_path / 'target.db'}"
    target = open_backend(target_url)
    await target.put("somebody/else", b"x")
    await target.close()
    proc = _migrate(source, target_url, tmp_path / "work")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "not empty" in err


async def test_a_missing_source_is_a_usage_error_that_leaves_nothing(tmp_path: Path) -> None:
    """A mistyped --from: exit 2, and neither an empty target file nor a
    checkpoint that would tie the work directory to the wrong source."""
    source = await _source(tmp_path / "source.db", 10)
    target = tmp_path / "target.db"
    proc = _migrate(source.replace("source.db", "sourse.db"), f"sqlite://{target}", tmp_path / "work")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "no SQLite file" in err
    assert not target.exists() and not (tmp_path / "work" / "checkpoint.json").exists()
    # the same store under two spellings is one store
    proc = _migrate(source, source.replace("source.db", "./source.db"), tmp_path / "work")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "same store" in err


async def test_a_work_dir_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    """--work-dir naming a file: exit 2 naming the flag, not "unexpected
    FileExistsError" (exit 1, a bug), and no target file made."""
    source = await _source(tmp_path / "source.db", 10)
    (tmp_path / "a-file").write_text("not a directory")
    target = tmp_path / "target.db"
    proc = _migrate(source, f"sqlite://{target}", tmp_path / "a-file")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "--work-dir" in err and "unexpected" not in err, err
    assert not target.exists()


async def test_an_unreadable_checkpoint_is_refused_clearly(tmp_path: Path) -> None:
    source = await _source(tmp_path / "source.db", 10)
    work = tmp_path / "work"
    work.mkdir()
    (work / "checkpoint.json").write_text('{"source": ')  # not one this command wrote
    proc = _migrate(source, f"sqlite://{tmp_path / 'target.db'}", work)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "checkpoint" in err and "unexpected" not in err


async def test_a_replaced_target_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """The target emptied or created anew after a run copied into it (the
    runbook's "empty the target" without "delete the work directory"): the
    checkpoint still said the items were there, so the command skipped the
    copy and failed verification (exit 5) on every run, without saying why."""
    source = await _source(tmp_path / "source.db", 10)
    target = tmp_path / "target.db"
    work = tmp_path / "work"
    proc = _migrate(source, f"sqlite://{target}", work)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    proc = _migrate(source, f"sqlite://{target}", work)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "empty" in err and "10 items" in err and str(work) in err


async def test_a_run_that_died_before_its_first_checkpoint_resumes_from_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages were written, but the process died before the first checkpoint
    said so (copied 0). The rerun must copy from the same snapshot: a fresh
    one, taken after the source changed, left the target a mix of two points
    in time (an item deleted since stayed, from the first run's pages)."""
    from fencepost_server.lifecycle.migrate import Checkpoint, migrate

    source = await _source(tmp_path / "source.db", 40)
    src = open_backend(source)
    try:
        at_first_run = [i async for page in src.export_items() for i in page]
    finally:
        await src.close()
    target, work = f"sqlite://{tmp_path / 'target.db'}", tmp_path / "work"

    real_save, saves = Checkpoint.save, []

    def dies_on_the_first_page(self: Checkpoint) -> None:
        saves.append(self.copied)
        if self.copied:  # the first checkpoint after a page: the process dies instead
            raise SystemExit("killed")
        real_save(self)

    monkeypatch.setattr(Checkpoint, "save", dies_on_the_first_page)
    with pytest.raises(SystemExit):
        await migrate(source, target, work_dir=work, page=10, stream=io.StringIO())
    monkeypatch.setattr(Checkpoint, "save", real_save)
    assert json.loads((work / "checkpoint.json").read_text())["copied"] == 0
    dst = open_backend(target)
    try:
        assert [i async for page in dst.export_items() for i in page]  # pages landed
    finally:
        await dst.close()

    src = open_backend(source)  # the source changes before the rerun (a server still writing)
    try:
        await src.delete(at_first_run[0].key)
        await src.put("t0/kv/new-since", b"new")
    finally:
        await src.close()
    report = await migrate(source, target, work_dir=work, page=10, stream=io.StringIO())
    dst = open_backend(target)
    try:
        assert [i async for page in dst.export_items() for i in page] == at_first_run  # one point in time
    finally:
        await dst.close()
    assert not report.verification.same  # the live source moved on: exit 5 says so


@pytest.mark.parametrize("side", ["source", "target"])
async def test_a_store_among_the_work_directorys_files_is_a_usage_error(tmp_path: Path, side: str) -> None:
    """The work directory's snapshot is written over and, once verified,
    deleted: a source stored under that name was deleted by a migration that
    said to keep it until satisfied (a target, replaced by the snapshot)."""
    work = tmp_path / "work"
    work.mkdir()
    inside, other = work / "source-snapshot.db", tmp_path / "other.db"
    source, target = (inside, other) if side == "source" else (other, inside)
    url = await _source(source, 10)
    proc = _migrate(url, f"sqlite://{target}", work)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and "--work-dir" in err, err
    assert source.exists() and not (work / "checkpoint.json").exists()
    storage = open_backend(url)
    try:
        assert len([i async for page in storage.export_items() for i in page]) == 10
    finally:
        await storage.close()
