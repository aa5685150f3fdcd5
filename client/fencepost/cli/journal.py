"""`fencepost journal append|read|archives` (the server-owned turn journal)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..client import AsyncClient
from ..v1 import journal_pb2
from ._common import Exit, Miss, Out, UsageError, add_command, clip, read_input, stamp


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], parser_class: type) -> None:
    journal = sub.add_parser("journal", help="append to and read an agent's turn journal (JournalService)",
                             description="append to and read an agent's turn journal")
    cmds = journal.add_subparsers(dest="journal_command", required=True, metavar="COMMAND",
                                  parser_class=parser_class)

    p = add_command(cmds, "append", _append, "journal one turn record; prints its record id", parents)
    p.add_argument("agent")
    p.add_argument("record", nargs="?",
                   help="the record as a JSON object ('-' reads stdin); the flags below fill or override fields")
    p.add_argument("--file", type=Path, help="read the record JSON from a file")
    p.add_argument("--session", dest="sessionId", help="sessionId")
    p.add_argument("--channel", dest="channelId", help="channelId")
    p.add_argument("--status", choices=("completed", "failed"), help="status (default completed)")
    p.add_argument("--title", help="title")
    p.add_argument("--at", help="at (default: now, UTC ISO 8601)")

    p = add_command(cmds, "read", _read, "print an agent's live journal (or one archive)", parents)
    p.add_argument("agent")
    p.add_argument("--archive", metavar="NAME", help="read this rotated archive instead of the live journal")
    p.add_argument("--raw", action="store_true", help="print the JSONL bytes verbatim")

    p = add_command(cmds, "archives", _archives, "an agent's rotated journals, oldest first", parents)
    p.add_argument("agent")


async def _append(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    record: dict[str, Any] = {}
    if args.record is not None or args.file is not None:
        raw = read_input(args.record, args.file)
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise UsageError(f"the record is not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise UsageError("the record must be a JSON object")
    for name in ("sessionId", "channelId", "status", "title", "at"):
        if getattr(args, name) is not None:
            record[name] = getattr(args, name)
    record.setdefault("status", "completed")
    record.setdefault("at", datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"))
    try:
        record_id = await fp.append_turn(args.agent, record)
    except ValueError as exc:  # the record's JSON form does not convert (status, usage)
        raise UsageError(str(exc)) from exc
    out.emit({"agent": args.agent, "record_id": record_id}, text=record_id)
    return Exit.OK


async def _read(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    progress = out.progress("reading journal", None, " bytes")
    parts: list[bytes] = []
    try:
        if args.archive:
            req = journal_pb2.ReadArchiveRequest(agent=args.agent, name=args.archive)
            stream = fp._caller.stream(fp._journal.ReadArchive, req)
        else:
            stream = fp._caller.stream(fp._journal.ReadJournal, journal_pb2.ReadJournalRequest(agent=args.agent))
        async for msg in stream:
            if not args.archive and not msg.found:
                raise Miss(f"agent {args.agent!r} has no journal")
            progress.total = int(msg.size_bytes) or None
            parts.append(msg.chunk)
            progress.advance(len(msg.chunk))
    finally:
        progress.finish()
    data = b"".join(parts)
    lines = [line for line in data.splitlines() if line]
    if args.raw:
        out.stdout.write(data.decode("utf-8"))
        return Exit.OK
    if out.json:
        for line in lines:
            out.line(json.loads(line))
        return Exit.OK
    rows = []
    for line in lines:
        rec = json.loads(line)
        # a record without a title shows "-" there; the user's message has its own column
        rows.append([rec.get("at"), clip(str(rec.get("sessionId", "")), 24), rec.get("status"),
                     clip(str(rec["title"]), 40) if rec.get("title") else None,
                     clip(str(rec["userMessage"]), 40) if rec.get("userMessage") else None])
    out.table(["AT", "SESSION", "STATUS", "TITLE", "USER MESSAGE"], rows)
    return Exit.OK


async def _archives(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    rows = []
    async for archive in fp.list_archives(args.agent):
        doc = {"name": archive.name, "size_bytes": archive.size_bytes, "record_count": archive.record_count,
               "rotate_time": stamp(archive.rotate_time.timestamp())}
        if out.json:
            out.line(doc)
        else:
            rows.append(list(doc.values()))
    if not out.json:
        out.table(["NAME", "BYTES", "RECORDS", "ROTATED"], rows)
    return Exit.OK
