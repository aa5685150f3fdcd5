"""`fencepost.JournalMirror` through a real server: hydrate, append after the
ack only, never regress on a shorter download, line order = ack order,
rotation at the size cap."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost import errors
from fencepost.journal import compact_json
from fencepost_server.storage.memory import MemoryStorage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import running


def rec(n: int, **extra: Any) -> dict[str, Any]:
    return {"at": f"2025-01-01T00:00:{n:02d}Z", "sessionId": "s-1", "channelId": "c-1", "status": "completed",
            "title": f"turn {n}", **extra}


@pytest.fixture(params=["memory", "sqlite"])
async def fp(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[fencepost.AsyncClient]:
    storage = MemoryStorage() if request.param == "memory" else SqliteStorage(tmp_path / "m.db", synchronous="NORMAL")
    async with running(storage) as srv, srv.client(timeout=10.0) as client:
        yield client


class ShorterReads:
    """The client, except that `read_journal` returns only the first `keep`
    lines (a degraded or rotated server read)."""

    def __init__(self, client: fencepost.AsyncClient, keep: int) -> None:
        self.client, self.keep = client, keep

    async def read_journal(self, agent: str, **opts: Any) -> fencepost.JournalContent | None:
        full = await self.client.read_journal(agent, **opts)
        assert full is not None
        data = b"".join(line + b"\n" for line in full.data.splitlines()[: self.keep])
        return fencepost.JournalContent(data, len(data), self.keep)

    async def append_turn(self, agent: str, record: Any, **opts: Any) -> str:
        return await self.client.append_turn(agent, record, **opts)


async def test_hydrate_append_and_a_shorter_download_never_shrinks(fp: fencepost.AsyncClient, tmp_path: Path) -> None:
    for n in range(3):  # history written by other pods before this one starts
        await fp.append_turn("agent-a", rec(n))
    mirror = fencepost.JournalMirror(fp, tmp_path / "memory")
    assert await mirror.hydrate("agent-a") == "written"
    server = (await fp.read_journal("agent-a"))
    assert server is not None and mirror.path("agent-a").read_bytes() == server.data
    assert mirror.path("agent-a") == tmp_path / "memory" / "agent-a" / "journal.jsonl"

    record_id = await mirror.append("agent-a", rec(3, newField=[1, "two"]))
    assert record_id
    lines = mirror.lines("agent-a")
    assert len(lines) == 4 and json.loads(lines[-1]) == rec(3, newField=[1, "two"])
    server = await fp.read_journal("agent-a")
    assert server is not None and mirror.path("agent-a").read_bytes() == server.data  # byte for byte

    before = mirror.path("agent-a").read_bytes()
    degraded = fencepost.JournalMirror(ShorterReads(fp, keep=2), tmp_path / "memory")  # type: ignore[arg-type]
    assert await degraded.hydrate("agent-a") == "kept"
    assert mirror.path("agent-a").read_bytes() == before

    # a longer download (another pod's append) replaces the mirror
    await fp.append_turn("agent-a", rec(4))
    assert await mirror.hydrate("agent-a") == "written"
    assert len(mirror.lines("agent-a")) == 5


async def test_hydrate_absent_and_first_append_backstop(fp: fencepost.AsyncClient, tmp_path: Path) -> None:
    mirror = fencepost.JournalMirror(fp, tmp_path)
    assert await mirror.hydrate("fresh") == "absent"
    assert not mirror.path("fresh").exists()
    # another process journaled earlier; this one never hydrated: the first
    # append hydrates first, and the new line is not doubled
    await fp.append_turn("agent-b", rec(0))
    other = fencepost.JournalMirror(fp, tmp_path / "other")
    await other.append("agent-b", rec(1))
    assert [json.loads(line)["title"] for line in other.lines("agent-b")] == ["turn 0", "turn 1"]


async def test_a_failed_append_never_reaches_the_mirror(fp: fencepost.AsyncClient, tmp_path: Path) -> None:
    mirror = fencepost.JournalMirror(fp, tmp_path)
    await mirror.append("agent-c", rec(0))
    before = mirror.path("agent-c").read_bytes()
    # refused by the server (`at` is required)
    with pytest.raises(errors.InvalidArgument):
        await mirror.append("agent-c", {**rec(1), "at": ""})
    # refused by the SDK's size pre-check (never sent)
    with pytest.raises(errors.RecordTooLarge):
        await mirror.append("agent-c", rec(2, blob="x" * 17000))
    # the server is gone
    async with fencepost.AsyncClient("127.0.0.1:1", timeout=2.0, retry=fencepost.NO_RETRY) as dead:
        broken = fencepost.JournalMirror(dead, tmp_path)
        with pytest.raises(errors.Unavailable):
            await broken.append("agent-c", rec(3))
    assert mirror.path("agent-c").read_bytes() == before
    server = await fp.read_journal("agent-c")
    assert server is not None and server.data == before


class AckOrder:
    """Records the order in which the server acked appends."""

    def __init__(self, client: fencepost.AsyncClient) -> None:
        self.client = client
        self.acked: list[str] = []

    async def read_journal(self, agent: str, **opts: Any) -> Any:
        return await self.client.read_journal(agent, **opts)

    async def append_turn(self, agent: str, record: Any, **opts: Any) -> str:
        await asyncio.sleep(0)  # let the other appenders run in between
        record_id = await self.client.append_turn(agent, record, **opts)
        self.acked.append(record.title)
        return record_id


async def test_concurrent_appends_keep_line_order_equal_to_ack_order(fp: fencepost.AsyncClient, tmp_path: Path) -> None:
    acks = AckOrder(fp)
    mirror = fencepost.JournalMirror(acks, tmp_path)  # type: ignore[arg-type]
    await mirror.hydrate("agent-d")
    await asyncio.gather(*(mirror.append("agent-d", rec(n)) for n in range(30)),
                         mirror.append("agent-e", rec(99)))
    titles = [json.loads(line)["title"] for line in mirror.lines("agent-d")]
    assert sorted(titles) == sorted(f"turn {n}" for n in range(30))
    assert titles == [t for t in acks.acked if t != "turn 99"]
    server = await fp.read_journal("agent-d")
    assert server is not None and mirror.path("agent-d").read_bytes() == server.data  # = record id order
    assert [json.loads(line)["title"] for line in mirror.lines("agent-e")] == ["turn 99"]


async def test_hydration_and_appends_never_interleave(fp: fencepost.AsyncClient, tmp_path: Path) -> None:
    mirror = fencepost.JournalMirror(fp, tmp_path)
    await mirror.append("agent-f", rec(0))
    await asyncio.gather(*(mirror.append("agent-f", rec(n)) for n in range(1, 10)),
                         *(mirror.hydrate("agent-f") for _ in range(5)))
    server = await fp.read_journal("agent-f")
    assert server is not None and mirror.path("agent-f").read_bytes() == server.data
    assert len(mirror.lines("agent-f")) == 10


async def test_rotates_the_local_file_at_the_size_cap(fp: fencepost.AsyncClient, tmp_path: Path) -> None:
    line = len(compact_json(rec(0))) + 1
    mirror = fencepost.JournalMirror(fp, tmp_path, max_bytes=3 * line)
    for n in range(7):
        await mirror.append("agent-g", rec(n))
    rotated = mirror.rotated("agent-g")
    assert len(rotated) == 2
    chunks = [p.read_bytes().splitlines() for p in rotated] + [mirror.lines("agent-g")]
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert [json.loads(x)["title"] for c in chunks for x in c] == [f"turn {n}" for n in range(7)]


async def test_a_mirrored_line_is_the_server_line_byte_for_byte(fp: fencepost.AsyncClient, tmp_path: Path) -> None:
    # `extra` and `usage` are Structs, whose maps have no order: the mirror
    # wrote the client's iteration order, the journal the server's
    mirror = fencepost.JournalMirror(fp, tmp_path / "memory")
    extras = [
        {"extra": {"b": 1, "a": 2}},
        {"extra": {"z": [1e20, 0.5], "a": None, "m": {"y": True, "b": "x"}}},
        {"zeta": 1, "alpha": [2.5, {"y": True, "b": None}], "mu": "m", "beta": {"k2": 2, "k1": 1}},
        {"usage": {"output": 7, "input": 3, "cached": 1}},
    ]
    for n, extra in enumerate(extras):
        await mirror.append("agent-o", rec(n, **extra))
    server = await fp.read_journal("agent-o")
    assert server is not None and mirror.path("agent-o").read_bytes() == server.data


def test_a_struct_becomes_json_in_one_key_order_in_every_process() -> None:
    # a Struct's map iterates in an order of its own, which differs from process
    # to process: a mirror and the journal it mirrors wrote `extra` differently
    import string

    from google.protobuf import struct_pb2

    from fencepost.journal import struct_to_dict

    letters = string.ascii_lowercase
    s = struct_pb2.Struct()
    s.update({c: {c2: 1 for c2 in reversed(letters)} for c in reversed(letters)})
    out = struct_to_dict(s)
    assert list(out) == sorted(letters) and all(list(inner) == sorted(letters) for inner in out.values())
