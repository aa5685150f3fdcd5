"""`fencepost ledger sessions|show|log|inbox|deliver|claim|delete`."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from .._ledger import Lease, SessionInfo
from ..client import AsyncClient
from .args import non_negative_int, non_negative_seconds, positive_int, positive_seconds
from ._common import Exit, Miss, Out, UsageError, add_command, blob, clip, read_input, show_bytes, stamp


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], parser_class: type) -> None:
    ledger = sub.add_parser("ledger", help="inspect and drive sessions (LedgerService)",
                            description="inspect and drive sessions")
    cmds = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND", parser_class=parser_class)

    p = add_command(cmds, "sessions", _sessions, "an agent's recent sessions, newest activity first", parents)
    p.add_argument("agent")
    p.add_argument("--max", type=non_negative_int, default=0, dest="max_sessions",
                   help="at most N sessions (0: server default)")

    p = add_command(cmds, "show", _show, "a session's head: seq, lease, pending events", parents)
    _target(p)

    p = add_command(cmds, "log", _log, "a session's committed records, in seq order", parents)
    _target(p)
    p.add_argument("--from", type=positive_int, default=1, dest="from_seq", help="first seq (default 1)")
    p.add_argument("--limit", type=non_negative_int, default=0, help="at most N records (0: all)")

    p = add_command(cmds, "inbox", _inbox, "a session's pending inbox events, in arrival order", parents)
    _target(p)

    p = add_command(cmds, "deliver", _deliver, "park an event in a session's inbox (the output is the ack)",
                    parents)
    p.add_argument("agent")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--key", dest="session_key", help="the session's continuation key (opened if needed)")
    where.add_argument("--session", dest="session_id", help="an existing session id")
    p.add_argument("payload", nargs="?", help="the event; '-' reads stdin")
    p.add_argument("--file", type=Path, help="read the event from a file")
    p.add_argument("--dedupe-key", default="", help="redeliveries with this key park nothing new")
    p.add_argument("--try-lease", default="", metavar="HOLDER", help="also try to take the lease for HOLDER")
    p.add_argument("--ttl", type=positive_seconds, help="lease ttl in seconds (with --try-lease)")

    p = add_command(cmds, "claim", _claim, "claim an orphaned session with a fresh lease (exit 3 when none)",
                    parents)
    p.add_argument("holder", help="the holder id the lease is granted to")
    p.add_argument("--agent", default="", help="only this agent's sessions")
    p.add_argument("--ttl", type=positive_seconds, help="lease ttl in seconds")
    p.add_argument("--wait", type=non_negative_seconds, default=0.0, help="long-poll up to this many seconds")

    p = add_command(cmds, "delete", _delete,
                    "erase a session and every item of it (docs/lifecycle.md); exit 5 while events are "
                    "pending or forks live", parents)
    _target(p)
    p.add_argument("--force", action="store_true", help="erase pending inbox events with it")
    p.add_argument("--descendants", action="store_true", help="erase its forks (and theirs) too")


def _target(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", help="the session id (or --agent with --key)")
    p.add_argument("--agent", help="resolve the session by agent ...")
    p.add_argument("--key", dest="session_key", help="... and continuation key")


async def _resolve(fp: AsyncClient, args: argparse.Namespace) -> str:
    if args.session and (args.agent or args.session_key):
        raise UsageError("give a session id or --agent/--key, not both")
    if args.session:
        return str(args.session)
    if not (args.agent and args.session_key is not None):
        raise UsageError("give a session id, or --agent and --key")
    return (await fp.resolve_session(args.agent, args.session_key)).session_id


def lease_doc(lease: Lease) -> dict[str, Any]:
    return {"holder_id": lease.holder_id, "generation": lease.generation, "expires_at": stamp(lease.expires_at),
            "live": lease.live, "released": lease.released}


def session_doc(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.session_id, "agent": info.agent, "session_key": info.session_key, "seq": info.seq,
        "pending": info.pending, "lease": lease_doc(info.lease), "parent_session_id": info.parent_session_id or None,
        "seed_length": info.seed_length, "create_time": stamp(info.create_time),
        "last_activity_time": stamp(info.last_activity_time), "metadata": info.metadata,
    }


def _session_text(doc: dict[str, Any]) -> str:
    lease = doc["lease"]
    if lease["live"]:
        state = "live"
    elif not lease["generation"]:
        state = "never leased"  # generation 0: no holder has ever had it (not "released")
    else:
        state = "released" if lease["released"] else "expired"
    rows = [
        ("session", doc["session_id"]), ("agent", doc["agent"]), ("key", doc["session_key"]),
        ("seq", doc["seq"]), ("pending", doc["pending"]),
        ("lease", f"{state} holder={lease['holder_id'] or '-'} generation={lease['generation']} "
                  f"expires={lease['expires_at'] or '-'}"),
        ("created", doc["create_time"]), ("last activity", doc["last_activity_time"]),
    ]
    if doc["parent_session_id"]:
        rows.append(("fork of", f"{doc['parent_session_id']} at seq {doc['seed_length']}"))
    for k, v in sorted(doc["metadata"].items()):
        rows.append((f"metadata.{k}", v))
    return "\n".join(f"{k:<14} {v}" for k, v in rows)


async def _sessions(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    rows = []
    async for s in fp.list_sessions(args.agent, max_sessions=args.max_sessions):
        doc = {**dataclasses.asdict(s), "last_activity_time": stamp(s.last_activity_time)}
        if out.json:
            out.line(doc)
        else:
            rows.append([s.session_id, clip(s.session_key, 32), s.seq, doc["last_activity_time"], s.total_bytes])
    if not out.json:
        out.table(["SESSION", "KEY", "SEQ", "LAST ACTIVITY", "BYTES"], rows)
    return Exit.OK


async def _show(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    sid = await _resolve(fp, args)
    doc = session_doc(await fp.get_session(sid))
    out.emit(doc, text=_session_text(doc))
    return Exit.OK


async def _log(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    if args.from_seq < 1 or args.limit < 0:
        raise UsageError("--from must be >= 1 and --limit >= 0")
    sid = await _resolve(fp, args)
    head = await fp.get_session(sid)
    total = max(0, head.seq - args.from_seq + 1)
    if args.limit:
        total = min(total, args.limit)
    progress = out.progress("reading log", total, " records")
    rows = []
    try:
        async for rec in fp.read_log(sid, from_seq=args.from_seq, limit=args.limit, timeout=None):
            progress.advance()
            if out.json:
                out.line({"seq": rec.seq, **blob(rec.data, "data")})
            else:
                rows.append([rec.seq, show_bytes(rec.data)])
    finally:
        progress.finish()
    if not out.json:
        out.table(["SEQ", "DATA"], rows)
    return Exit.OK


async def _inbox(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    sid = await _resolve(fp, args)
    rows = []
    async for e in fp.list_inbox(sid):
        if out.json:
            out.line({"inbox_id": e.inbox_id, "dedupe_key": e.dedupe_key, "deliver_time": stamp(e.deliver_time),
                      **blob(e.payload, "payload")})
        else:
            rows.append([e.inbox_id, e.dedupe_key or "-", stamp(e.deliver_time), clip(show_bytes(e.payload), 50)])
    if not out.json:
        out.table(["INBOX ID", "DEDUPE KEY", "DELIVERED", "PAYLOAD"], rows)
    return Exit.OK


async def _deliver(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    payload = read_input(args.payload, args.file)
    d = await fp.deliver(payload, agent=args.agent, session_key=args.session_key or "",
                         session_id=args.session_id or "", dedupe_key=args.dedupe_key, try_lease=args.try_lease,
                         ttl=args.ttl)
    doc = {"session_id": d.session_id, "inbox_id": d.inbox_id, "duplicate": d.duplicate,
           "lease_granted": d.lease_granted, "lease": lease_doc(d.lease) if d.lease else None}
    text = f"parked {d.inbox_id} in session {d.session_id}" + (" (duplicate)" if d.duplicate else "")
    if args.try_lease:
        text += (f"\nlease granted to {args.try_lease}, generation {d.lease.generation}"
                 if d.lease_granted and d.lease else "\nlease held by another holder: it drains the event")
    out.emit(doc, text=text)
    return Exit.OK


async def _claim(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    info = await fp.claim_orphan(args.holder, ttl=args.ttl, wait=args.wait, agent=args.agent)
    if info is None:
        raise Miss("no orphaned session to claim")
    doc = session_doc(info)
    out.emit(doc, text=_session_text(doc))
    return Exit.OK


async def _delete(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    sid = await _resolve(fp, args)
    gone = await fp.delete_session(sid, force=args.force, delete_descendants=args.descendants)
    doc = {"deleted_session_ids": gone.session_ids, "erased_items": gone.erased_items}
    out.emit(doc, text="\n".join(f"deleted {s}" for s in gone.session_ids) + f"\n{gone.erased_items} items erased")
    return Exit.OK
