"""`fencepost memory append|list|search|pin|unpin|pinned|forget|topics` (agent memory)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .._memory import KINDS, STRATEGIES, TRUST
from ..client import AsyncClient
from ..v1 import memory_pb2 as pb
from .args import non_negative_int
from ._common import Exit, Miss, Out, UsageError, add_command, clip, message_dict, read_input


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], parser_class: type) -> None:
    memory = sub.add_parser("memory", help="write and inspect an agent's memory (MemoryService)",
                            description="write and inspect an agent's memory")
    cmds = memory.add_subparsers(dest="memory_command", required=True, metavar="COMMAND", parser_class=parser_class)

    p = add_command(cmds, "append", _append, "remember a fact; prints the new entry's id", parents)
    p.add_argument("agent")
    p.add_argument("content", nargs="?", help="the fact (UTF-8 text); '-' reads stdin")
    p.add_argument("--file", type=Path, help="read the fact from a file")
    p.add_argument("--kind", choices=sorted(KINDS), help="what sort of fact it is")
    p.add_argument("--about", action="append", default=[], metavar="ENTITY",
                   help="an entity the fact concerns (repeatable)")
    p.add_argument("--supersedes", metavar="ENTRY_ID", help="the entry this one replaces")
    p.add_argument("--valid-from", type=_when, metavar="TIME", help="when the fact starts holding (ISO 8601)")
    p.add_argument("--valid-until", type=_when, metavar="TIME", help="when the fact stops holding (ISO 8601)")
    p.add_argument("--trust", choices=sorted(TRUST), help="where the fact came from (default: the server's)")
    p.add_argument("--metadata", type=_json_object, metavar="JSON", help="a JSON object to attach")

    p = add_command(cmds, "list", _list, "live entries, oldest first", parents)
    p.add_argument("agent")
    p.add_argument("--limit", type=non_negative_int, default=0, help="at most N entries (0: all)")
    p.add_argument("--all-validity", action="store_true", help="include entries outside their validity window")

    p = add_command(cmds, "search", _search, "live entries matching every query token (newest first, or --strategy)", parents)
    p.add_argument("agent")
    p.add_argument("query")
    p.add_argument("--limit", type=non_negative_int, default=0, help="at most N entries (0: the server default)")
    p.add_argument("--strategy", choices=sorted(STRATEGIES))

    p = add_command(cmds, "pin", _pin, "pin an entry (exit 4 when the pin is refused)", parents)
    p.add_argument("agent")
    p.add_argument("entry_id")

    p = add_command(cmds, "unpin", _unpin, "unpin an entry (exit 4 when it was not pinned)", parents)
    p.add_argument("agent")
    p.add_argument("entry_id")

    p = add_command(cmds, "pinned", _pinned, "the pinned set in pin order, with the budget used", parents)
    p.add_argument("agent")
    p.add_argument("--allocated", action="store_true",
                   help="every pin holding budget (also superseded or out-of-window ones)")

    p = add_command(cmds, "forget", _forget, "tombstone a live entry (exit 3 when there is none)", parents)
    p.add_argument("agent")
    p.add_argument("entry_id")

    p = add_command(cmds, "topics", _topics, "the agent's topic index", parents)
    p.add_argument("agent")


def _when(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time (2026-01-31T12:00:00Z), got {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _json_object(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object ({{\"k\": \"v\"}}), got {text!r}")
    return doc


async def _append(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    data = read_input(args.content, args.file)
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError("a memory entry is UTF-8 text; the content is not") from None
    entry = await fp.memory_append(
        args.agent, content, kind=args.kind, about=args.about, supersedes=args.supersedes,
        valid_from=args.valid_from, valid_until=args.valid_until, trust=args.trust, metadata=args.metadata,
    )
    out.emit(message_dict(entry), text=entry.id)
    return Exit.OK


def _kind(entry: pb.MemoryEntry) -> str:
    name = pb.MemoryKind.Name(entry.kind)
    return name.removeprefix("MEMORY_KIND_").lower() if entry.kind else "-"


def _row(entry: pb.MemoryEntry) -> list[Any]:
    created = entry.created_at.ToJsonString() if entry.HasField("created_at") else None
    return [entry.id, _kind(entry), created, list(entry.about), clip(entry.content, 60)]


_HEADERS = ["ID", "KIND", "CREATED", "ABOUT", "CONTENT"]


async def _list(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    if args.limit < 0:
        raise UsageError("--limit must be >= 0")
    rows = []
    count = 0
    async for entry in fp.memory_list_all(args.agent, all_validity=args.all_validity):
        if args.limit and count >= args.limit:
            break
        count += 1
        if out.json:
            out.line(message_dict(entry))
        else:
            rows.append(_row(entry))
    if not out.json:
        out.table(_HEADERS, rows)
    return Exit.OK


async def _search(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    res = await fp.memory_search(args.agent, args.query, limit=args.limit, strategy=args.strategy)
    strategy = pb.MemoryStrategy.Name(res.strategy).removeprefix("MEMORY_STRATEGY_").lower()
    if out.json:
        out.emit({"entries": [message_dict(e) for e in res.entries], "truncated": res.truncated,
                  "strategy": strategy})
    else:
        out.table(_HEADERS, [_row(e) for e in res.entries])
        out.note(f"(ordered by {strategy})")
        if res.truncated:
            out.note("(truncated: raise --limit for more)")
    return Exit.OK


async def _pin(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    res = await fp.memory_pin(args.agent, args.entry_id)
    doc = {"entry_id": args.entry_id, "pinned": res.pinned, "reason": res.reason, "bytes": res.bytes,
           "blocking_id": res.blocking_id or None}
    if res.pinned:
        out.emit(doc, text=f"pinned {args.entry_id} ({res.bytes} bytes)")
        return Exit.OK
    text = f"not pinned: {res.reason}" + (f" (blocked by {res.blocking_id})" if res.blocking_id else "")
    out.emit(doc, text=text)
    return Exit.NOT_APPLIED


async def _unpin(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    unpinned = await fp.memory_unpin(args.agent, args.entry_id)
    out.emit({"entry_id": args.entry_id, "unpinned": unpinned},
             text=f"unpinned {args.entry_id}" if unpinned else f"{args.entry_id} was not pinned")
    return Exit.OK if unpinned else Exit.NOT_APPLIED


async def _pinned(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    res = await fp.memory_pinned(args.agent, allocated=args.allocated)
    if out.json:
        out.emit({"entries": [message_dict(e) for e in res.entries], "allocated_bytes": res.allocated_bytes})
    else:
        out.table(_HEADERS, [_row(e) for e in res.entries])
        out.note(f"({res.allocated_bytes} of 2048 pin-budget bytes allocated)")
    return Exit.OK


async def _forget(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    if not await fp.memory_forget(args.agent, args.entry_id):
        raise Miss(f"agent {args.agent!r} has no live entry {args.entry_id!r}")
    out.emit({"entry_id": args.entry_id, "forgotten": True}, text=f"forgot {args.entry_id}")
    return Exit.OK


async def _topics(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    topics = await fp.memory_topics(args.agent)
    if out.json:
        out.emit({"topics": [message_dict(t) for t in topics]})
        return Exit.OK
    rows = [[t.name, t.count, t.last_updated_at.ToJsonString() if t.HasField("last_updated_at") else None,
             pb.MemoryTrust.Name(t.trust).removeprefix("MEMORY_TRUST_").lower() if t.trust else "-"]
            for t in topics]
    out.table(["TOPIC", "ENTRIES", "LAST UPDATED", "TRUST"], rows)
    return Exit.OK
