"""The exit codes of `fencepost backup | restore | migrate` (docs/lifecycle.md,
"Exit codes"; docs/cli.md), each case run as a process the way an operator
types it: one `fencepost: ...` line on stderr, no traceback, and for the
refusals nothing written."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.lifecycle.cli_support import fill

from .test_restore_services import cli


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    fill(f"sqlite://{tmp_path / 'a.db'}", 12)
    done = cli("backup", "--backend", f"sqlite://{tmp_path / 'a.db'}", "--out", str(tmp_path / "a.arch"))
    assert done.returncode == 0, done.stderr
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    fill(f"sqlite://{tmp_path / 'full.db'}", 1)
    return tmp_path


CASES = [
    # usage (2): decided before the store is read or anything is written
    (2, ["backup", "--backend", "memory://", "--out", "{t}/o.arch"], "memory://"),
    (2, ["backup", "--backend", "sqlite://{t}/nope.db", "--out", "{t}/o.arch"], "no SQLite file"),
    (2, ["backup", "--backend", "sqlite://{t}/dir", "--out", "{t}/o.arch"], "is a directory"),
    (2, ["backup", "--backend", "sqlite://{t}/a.db", "--out", "{t}/a.db"], "itself"),
    (2, ["backup", "--backend", "sqlite://{t}/a.db", "--out", "{t}/dir"], "is a directory"),
    (2, ["backup", "--backend", "sqlite://{t}/a.db", "--out", "{t}/no/such/o.arch"], "does not exist"),
    (2, ["backup", "--backend", "postgres://x", "--out", "{t}/o.arch"], "postgres"),
    (2, ["restore", "--backend", "sqlite://{t}/new.db", "--in", "{t}/missing.arch"], "no archive file"),
    (2, ["restore", "--backend", "sqlite://{t}/new.db", "--in", "{t}/dir"], "is a directory"),
    (2, ["restore", "--backend", "sqlite://{t}/dir", "--in", "{t}/a.arch"], "is a directory"),
    (2, ["migrate", "--from", "sqlite://{t}/a.db", "--to", "sqlite://{t}/new.db", "--work-dir", "{t}/file"],
     "--work-dir"),
    (2, ["migrate", "--from", "sqlite://{t}/a.db", "--to", "sqlite://{t}/./a.db", "--work-dir", "{t}/w"],
     "same store"),
    (2, ["migrate", "--from", "sqlite://{t}/a.db", "--to", "sqlite://{t}/new.db", "--page", "0"], "--page"),
    # refused (3)
    (3, ["restore", "--backend", "sqlite://{t}/full.db", "--in", "{t}/a.arch"], "not empty"),
    (3, ["migrate", "--from", "sqlite://{t}/a.db", "--to", "sqlite://{t}/full.db", "--work-dir", "{t}/w"],
     "not empty"),
    # damaged (4)
    (4, ["restore", "--backend", "sqlite://{t}/new.db", "--in", "{t}/file"], "not a fencepost archive"),
    # a backend that does not answer (1)
    (1, ["backup", "--backend", "dynamodb://tbl?endpoint=http://127.0.0.1:{port}&region=us-east-1",
         "--out", "{t}/o.arch"], "cannot reach"),
]


@pytest.mark.parametrize(("code", "argv", "says"), CASES, ids=[f"{c[0]}-{c[1][0]}-{i}" for i, c in enumerate(CASES)])
def test_exit_code(tmp: Path, code: int, argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    before = sorted(p.name for p in tmp.iterdir())
    done = cli(*(a.format(t=tmp, port=_closed_port()) for a in argv), timeout=120)
    assert done.returncode == code, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr and "unexpected" not in done.stderr
    if code != 0:
        assert sorted(p.name for p in tmp.iterdir()) == before  # nothing written, nothing left behind


def test_migrate_work_dir_of_another_migration_and_a_replaced_target(tmp: Path) -> None:
    work = str(tmp / "w")
    first = ["migrate", "--from", f"sqlite://{tmp / 'a.db'}", "--to", f"sqlite://{tmp / 'b.db'}", "--work-dir", work]
    assert cli(*first).returncode == 0
    other = cli("migrate", "--from", f"sqlite://{tmp / 'a.db'}", "--to", f"sqlite://{tmp / 'c.db'}", "--work-dir", work)
    assert other.returncode == 3 and "belongs to the migration" in other.stderr
    assert not (tmp / "c.db").exists()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp / 'b.db'}{suffix}").unlink(missing_ok=True)
    replaced = cli(*first)
    assert replaced.returncode == 3 and "replaced" in replaced.stderr
    assert json.loads((tmp / "w" / "checkpoint.json").read_text())["phase"] == "done"


def test_a_source_written_after_the_copy_exits_5(tmp: Path) -> None:
    """Verification reads the live source: a write after the snapshot is a difference."""
    work = tmp / "w"
    argv = ["migrate", "--from", f"sqlite://{tmp / 'a.db'}", "--to", f"sqlite://{tmp / 'b.db'}",
            "--work-dir", str(work)]
    assert cli(*argv).returncode == 0
    fill(f"sqlite://{tmp / 'a.db'}", 13)  # one more item: a server still writing
    done = cli(*argv)
    assert done.returncode == 5 and "VERIFICATION FAILED" in done.stderr and str(work) in done.stderr


@pytest.mark.parametrize("source", ["missing table", "no endpoint"])
def test_a_source_that_does_not_answer_is_named_before_anything_is_written(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 1 names a missing source table or an endpoint that does not answer
    "before anything is read or written": no target file, no work directory
    (a checkpoint and an empty SQLite file were left behind)."""
    from tests.dynamo_support import backend_url, unique_table

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    url = (backend_url(unique_table()) if source == "missing table" else
           f"dynamodb://tbl?endpoint=http://127.0.0.1:{_closed_port()}&region=us-east-1&attempts=1")
    done = cli("migrate", "--from", url, "--to", f"sqlite://{tmp_path / 'b.db'}", "--work-dir", str(tmp_path / "w"))
    assert done.returncode == 1, done.stderr
    assert url in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_verification_names_only_the_ranges_that_differ(tmp_path: Path) -> None:
    """docs/lifecycle.md, Verification: ranges of 1000 source items; a
    different item and an extra one each change only their own range, and
    the command prints those ranges with their counts (exit 5)."""
    import asyncio

    from fencepost_server.storage import open_backend

    source, target = f"sqlite://{tmp_path / 'a.db'}", f"sqlite://{tmp_path / 'b.db'}"

    async def put(url: str, items: dict[str, bytes]) -> None:
        storage = open_backend(url)
        try:
            for key, value in items.items():
                await storage.put(key, value)
        finally:
            await storage.close()

    asyncio.run(put(source, {f"t/kv/item-{i:04d}": b"v" for i in range(3500)}))  # four ranges
    argv = ["migrate", "--from", source, "--to", target, "--work-dir", str(tmp_path / "w")]
    assert cli(*argv).returncode == 0
    # in the target: one item changed (range 2), one extra (range 4)
    asyncio.run(put(target, {"t/kv/item-1500": b"changed", "t/kv/item-3000x": b"extra"}))
    done = cli(*argv)
    assert done.returncode == 5, done.stderr
    assert "3500 items on the source, 3501 on the target; 2 of 4 key ranges differ" in done.stderr
    ranges = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("range (")]
    assert len(ranges) == 2, done.stderr
    assert ranges[0].startswith("range ('t/kv/item-0999', 't/kv/item-1999']: 1000 items")
    assert ranges[1].startswith("range ('t/kv/item-2999', end]: 500 items") and "vs 501 items" in ranges[1]
