"""`JournalMirror`: the client half of the journal lane (seed 000).

A runtime that reads an agent's turn journal from a local file
(`<root>/<agent>/journal.jsonl`) keeps that file live without ever reading
the journal per append:

- `hydrate(agent)` once per session start: one `memory.read` (flush-on-read,
  so every append acked before it is included) rewrites the mirror — unless
  the download is *shorter* than the mirror, which then stays as it is (every
  mirrored line was acked, so a shorter download is a degraded or rotated
  read; rewriting would hide records the agent has already seen);
- `append(agent, record)`: `memory.append` first, and only once the server
  acked it, the same line (byte for byte the server's journal line) is
  appended locally. A failed append raises and never reaches the mirror;
- work on one agent is serialized by an asyncio lock per agent, so hydration
  and appends never interleave and the mirror's line order is the ack order;
- the local file rotates at `max_bytes` to `journal-<ms>-<n>.jsonl` beside it.

The mirror is advisory: a local write that fails after the server acked is
logged (the record is durable) and the call still returns the record id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from ._journal import JournalMethods
from .errors import FencepostError
from .journal import MAX_RECORD_BYTES, agent_name_problem, check_record_size, compact_json, record_from_dict, record_to_dict
from .v1 import journal_pb2

log = logging.getLogger("fencepost.mirror")

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
Hydration = Literal["written", "kept", "absent", "failed"]


class JournalMirror:
    """Local JSONL mirrors of agents' server-owned journals (one file per agent).

        mirror = fencepost.JournalMirror(client, state_root / "memory")
        await mirror.hydrate("agent-1")                 # at session start
        await mirror.append("agent-1", {"at": ..., "sessionId": ..., ...})
    """

    def __init__(
        self,
        client: JournalMethods,
        root: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        path_for: Callable[[str], Path] | None = None,
        fsync: bool = False,
    ) -> None:
        self.client = client
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._path_for = path_for
        self._locks: dict[str, asyncio.Lock] = {}
        self._hydrated: set[str] = set()
        self._rotations = 0

    # -- paths ----------------------------------------------------------------
    def path(self, agent: str) -> Path:
        """The agent's live mirror file."""
        if self._path_for is not None:
            return self._path_for(agent)
        problem = agent_name_problem(agent)
        if problem:
            raise ValueError(problem)
        return self.root / agent / "journal.jsonl"

    def rotated(self, agent: str) -> list[Path]:
        """The agent's rotated mirror files, oldest first."""
        live = self.path(agent)
        return sorted(live.parent.glob("journal-*.jsonl"), key=_rotation_order)

    def lines(self, agent: str) -> list[bytes]:
        """The live mirror's lines (without newlines); [] when there is none."""
        try:
            return self.path(agent).read_bytes().splitlines()
        except FileNotFoundError:
            return []

    def lock(self, agent: str) -> asyncio.Lock:
        """The lock that serializes every mirror step of `agent`."""
        lock = self._locks.get(agent)
        if lock is None:
            lock = self._locks[agent] = asyncio.Lock()
        return lock

    # -- session start ----------------------------------------------------------
    async def hydrate(self, agent: str) -> Hydration:
        """Bring the mirror up to the server's journal (call once per session start).

        Returns "written" (mirror replaced by the download), "kept" (the
        download was shorter than the mirror), "absent" (the agent has no
        journal yet) or "failed" (the read failed; logged, mirror unchanged)."""
        async with self.lock(agent):
            return await self._hydrate(agent)

    async def _hydrate(self, agent: str) -> Hydration:
        path = self.path(agent)
        try:
            content = await self.client.read_journal(agent)
        except FencepostError as exc:
            log.warning("journal mirror: hydration of %r failed (keeping the existing mirror): %s", agent, exc)
            return "failed"
        self._hydrated.add(agent)
        if content is None:
            return "absent"
        mirrored = await asyncio.to_thread(_size, path)
        if len(content.data) < mirrored:
            return "kept"
        await asyncio.to_thread(_replace, path, content.data, self.fsync)
        return "written"

    # -- per turn -----------------------------------------------------------------
    async def append(self, agent: str, record: Mapping[str, Any] | journal_pb2.TurnRecord, **opts: Any) -> str:
        """Journal `record` on the server, then mirror it; returns the record id.

        Raises what `append_turn` raises (the mirror is then untouched). When
        this process never hydrated the agent and there is no mirror file yet,
        it hydrates first (before the append, so the new line is not doubled)."""
        pb = record if isinstance(record, journal_pb2.TurnRecord) else record_from_dict(record)
        check_record_size(pb, MAX_RECORD_BYTES)
        line = compact_json(record_to_dict(pb)) + b"\n"
        async with self.lock(agent):
            path = self.path(agent)
            if agent not in self._hydrated and not path.exists():
                await self._hydrate(agent)
            record_id = await self.client.append_turn(agent, pb, **opts)
            try:
                await asyncio.to_thread(self._append_line, path, line)
            except OSError as exc:
                log.warning("journal mirror: local append for %r failed (the record is durable): %s", agent, exc)
            return str(record_id)

    def _append_line(self, path: Path, line: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if _size(path) >= self.max_bytes:
            self._rotations += 1
            path.rename(path.with_name(f"journal-{int(time.time() * 1000)}-{self._rotations}.jsonl"))
        with open(path, "ab") as f:
            f.write(line)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())


def _rotation_order(p: Path) -> tuple[int, int]:
    parts = p.stem.split("-")
    try:
        return int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        return 0, 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _replace(path: Path, data: bytes, fsync: bool) -> None:
    """Write `data` to `path` atomically (a reader sees the old or the new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
