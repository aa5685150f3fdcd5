"""Progress lines of the operator commands in a log (no terminal)."""

from __future__ import annotations

import io

from fencepost_server.lifecycle.progress import Progress


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
