"""Progress lines of the operator commands in a log (no terminal)."""

from __future__ import annotations

import io
from pathlib import Path

from fencepost_server.lifecycle import backup, migrate, restore
from fencepost_server.lifecycle.progress import Progress
from fencepost_server.storage import open_backend


def test_a_short_run_logs_its_final_line_only() -> None:
    # the first advance printed at once and finish() printed the same count
    # again: two lines for every run shorter than the interval
    out = io.StringIO()
    progress = Progress("migrate", 16, stream=out, interval=5.0)
    progress.advance(16)
    progress.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("migrate: 16/16 items")


def test_a_long_run_logs_a_line_per_interval() -> None:
    out = io.StringIO()
    progress = Progress("backup", stream=out, interval=0.0)
    for _ in range(3):
        progress.advance(1)
    progress.finish()
    assert [line.split(" items")[0] for line in out.getvalue().splitlines()] == [
        "backup: 1", "backup: 2", "backup: 3", "backup: 3"]


async def test_restore_and_migrate_show_their_verification_pass_too(tmp_path: Path) -> None:
    """The comparison reads every item again (on DynamoDB as long as the
    copy): a finished bar followed by silence looks like a hang."""
    source = f"sqlite://{tmp_path / 'a.db'}"
    storage = open_backend(source)
    try:
        for i in range(25):
            await storage.put(f"t/kv/{i:02d}", b"v")
    finally:
        await storage.close()
    archive = tmp_path / "backup.arch"
    await backup(source, archive, page=10, stream=io.StringIO())

    out = io.StringIO()
    await restore(f"sqlite://{tmp_path / 'b.db'}", archive, stream=out)
    assert "verify: 25/25 items" in out.getvalue()

    out = io.StringIO()
    await migrate(source, f"sqlite://{tmp_path / 'c.db'}", work_dir=tmp_path / "work", page=10, stream=out)
    assert "verify: 25/25 items" in out.getvalue()
