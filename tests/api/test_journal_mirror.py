"""`fencepost.JournalMirror` through a real server: hydrate, append after the
ack only, never regress on a shorter download, line order = ack order,
rotation at the size cap."""

from __future__ import annotations

import asyncio
import json
import math
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


#: doubles and what JavaScript's JSON.stringify writes for each
JS_NUMBERS = [
    (9007199254740992.0, "9007199254740992"), (-9007199254740992.0, "-9007199254740992"),
    (9007199254740993.0, "9007199254740992"), (2.0**60, "1152921504606847000"), (1e16, "10000000000000000"),
    (1e20, "100000000000000000000"), (1e21, "1e+21"), (1.5e300, "1.5e+300"), (1.7976931348623157e308, "1.7976931348623157e+308"),
    (1e-7, "1e-7"), (1.25e-7, "1.25e-7"), (-1e-7, "-1e-7"), (1e-6, "0.000001"), (1.5e-5, "0.000015"), (1e-5, "0.00001"),
    (5e-324, "5e-324"), (0.1, "0.1"), (123.456, "123.456"), (-0.0, "0"), (0.0, "0"), (5.0, "5"), (1e15 + 0.5, "1000000000000000.5"),
]


@pytest.mark.parametrize(("value", "js"), JS_NUMBERS, ids=[js for _, js in JS_NUMBERS])
def test_struct_numbers_are_written_as_json_stringify_writes_them(value: float, js: str) -> None:
    """A journal line is JSON.stringify's text: integral doubles up to 2^53
    without `.0`, exponents as `1e-7` / `1e+21`, not Python's `1e-07`."""
    from google.protobuf import struct_pb2

    from fencepost.journal import compact_json, struct_to_dict

    s = struct_pb2.Struct()
    s.update({"n": value, "in": [value, {"x": value}]})
    assert compact_json(struct_to_dict(s)) == ('{"in":[%s,{"x":%s}],"n":%s}' % (js, js, js)).encode()
    assert compact_json(value) == js.encode()


def test_numbers_match_node_json_stringify() -> None:
    """Random doubles of every magnitude, written here and by node (the
    polyglot suite needs node too: a missing node fails, never skips)."""
    import random
    import shutil
    import struct
    import subprocess

    from fencepost.journal import compact_json

    rng = random.Random(53)
    values = [v for v, _ in JS_NUMBERS]
    while len(values) < 3000:
        v = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(v):
            values.append(v)
    values += [rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30) for _ in range(3000)]
    values += [float(rng.randint(-2**60, 2**60)) for _ in range(500)]
    node = shutil.which("node")
    assert node, "node is needed (as by tests/polyglot)"
    script = "const v = JSON.parse(require('fs').readFileSync(0, 'utf8')); process.stdout.write(JSON.stringify(v));"
    # node parses the exact values from repr (round-trip) and writes them its way
    src = "[" + ",".join(repr(v) for v in values) + "]"
    out = subprocess.run([node, "-e", script], input=src, capture_output=True, text=True, check=True, timeout=60)
    assert compact_json(values).decode() == out.stdout
