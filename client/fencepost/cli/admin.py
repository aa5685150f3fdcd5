"""`fencepost admin erase-agent|erase-tenant|operation`: erasure (AdminService).

An erasure is a long-running operation on the server: the command starts it,
prints its name on stderr at once (so an interrupted wait can be picked up
with `admin operation NAME --wait`), then polls it until it is done unless
`--no-wait`. Each poll is one call bounded by `--timeout`; the wait itself is
not (a tenant's erasure takes as long as its data does).
"""

from __future__ import annotations

import argparse
import asyncio

from .._admin import Operation
from ..client import AsyncClient
from ._common import Exit, Out, UsageError, add_command

#: seconds between two polls of a running operation
POLL_SECONDS = 0.5


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], parser_class: type) -> None:
    admin = sub.add_parser("admin", help="erase an agent or the tenant (AdminService, operator role)",
                           description="erase an agent or the whole tenant (docs/lifecycle.md)")
    cmds = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND", parser_class=parser_class)

    p = add_command(cmds, "erase-agent", _erase_agent,
                    "erase every key of one agent of the caller's tenant, in every service; waits until done", parents)
    p.add_argument("agent")
    _start_flags(p)

    p = add_command(cmds, "erase-tenant", _erase_tenant,
                    "erase every key of the caller's tenant (the one its token maps to), in every service; "
                    "needs --confirm; waits until done", parents)
    p.add_argument("--confirm", action="store_true", help="yes: erase the whole tenant")
    _start_flags(p)

    p = add_command(cmds, "operation", _operation, "an erasure's state (exit 3 when there is no such operation)",
                    parents)
    p.add_argument("name", help="operations/erase-..., as the erase command printed it")
    p.add_argument("--wait", action="store_true", help="poll until it is done")


def _start_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--request-id", default=None,
                   help="run again with the same id to get the same operation back instead of a new one")
    p.add_argument("--no-wait", action="store_true", help="print the operation's name and return at once")


async def _erase_agent(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    return await _started(fp, await fp.erase_agent(args.agent, request_id=args.request_id), args, out)


async def _erase_tenant(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    if not args.confirm:
        raise UsageError("erase-tenant erases every key of the tenant your token maps to: add --confirm")
    return await _started(fp, await fp.erase_tenant(request_id=args.request_id), args, out)


async def _operation(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    op = await fp.get_operation(args.name)
    if args.wait:
        op = await _wait(fp, op, out)
    _show(op, out)
    return Exit.OK


async def _started(fp: AsyncClient, op: Operation, args: argparse.Namespace, out: Out) -> int:
    if not out.json:
        out.note(f"erasure started: {op.name}")
    if not args.no_wait:
        op = await _wait(fp, op, out)
    _show(op, out)
    return Exit.OK


async def _wait(fp: AsyncClient, op: Operation, out: Out) -> Operation:
    progress = out.progress("erasing", None, " items")
    try:
        while not op.done:
            await asyncio.sleep(POLL_SECONDS)
            op = await fp.get_operation(op.name)
            progress.label = f"erasing ({op.phase}, {op.sessions_fenced} sessions fenced)"
            progress.advance(op.items_erased - progress.done)
    finally:
        progress.finish()
    return op


def _show(op: Operation, out: Out) -> None:
    out.emit({"name": op.name, "done": op.done, "phase": op.phase,
              "sessions_fenced": op.sessions_fenced, "items_erased": op.items_erased})
