"""`fencepost kv get|put|del|ls|cas`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..client import AsyncClient
from .args import non_negative_int
from ._common import Exit, Miss, Out, UsageError, add_command, blob, clip, read_input, show_bytes


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], parser_class: type) -> None:
    kv = sub.add_parser("kv", help="read and write keys (KvService)", description="read and write keys")
    cmds = kv.add_subparsers(dest="kv_command", required=True, metavar="COMMAND", parser_class=parser_class)

    p = add_command(cmds, "get", _get, "write a key's value, its exact bytes, to stdout or --out FILE "
                    "(exit 3 when absent); --json prints a document with the value base64-encoded", parents)
    p.add_argument("key")
    p.add_argument("--out", type=Path, metavar="FILE", help="write the value's bytes to FILE instead of stdout")

    p = add_command(cmds, "put", _put, "write a key; prints the new version", parents)
    p.add_argument("key")
    p.add_argument("value", nargs="?", help="the value; '-' reads stdin")
    p.add_argument("--file", type=Path, help="read the value from a file ('-': stdin)")

    p = add_command(cmds, "del", _del, "delete a key (exit 3 when it was absent)", parents)
    p.add_argument("key")

    p = add_command(cmds, "ls", _ls, "list keys under a prefix, in key order", parents)
    p.add_argument("prefix", nargs="?", default="")
    p.add_argument("--keys-only", action="store_true", help="list keys only (no values fetched)")
    p.add_argument("--limit", type=non_negative_int, default=0, help="stop after N entries (0: all)")

    p = add_command(cmds, "cas", _cas, "compare-and-set: write (or delete) only if the key is at a version "
                    "(exit 4 when not applied)", parents)
    p.add_argument("key")
    p.add_argument("value", nargs="?", help="the new value; '-' reads stdin")
    p.add_argument("--file", type=Path, help="read the new value from a file ('-': stdin)")
    cond = p.add_mutually_exclusive_group(required=True)
    cond.add_argument("--expect", metavar="VERSION", help="apply only if the key's version is VERSION")
    cond.add_argument("--absent", action="store_true", help="apply only if the key does not exist")
    p.add_argument("--delete", action="store_true", help="delete instead of write (needs --expect)")


async def _get(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    entry = await fp.get(args.key)
    if entry is None:
        raise Miss(f"key {args.key!r} not found")
    if args.out is not None:
        args.out.write_bytes(entry.value)
        if out.json:
            out.emit({"key": entry.key, "version": entry.version, "bytes": len(entry.value), "out": str(args.out)})
    elif out.json:
        out.emit({"key": entry.key, "version": entry.version, **blob(entry.value)})
    else:
        out.raw(entry.value)
    return Exit.OK


async def _put(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    version = await fp.put(args.key, read_input(args.value, args.file))
    out.emit({"key": args.key, "version": version}, text=version)
    return Exit.OK


async def _del(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    existed = await fp.delete(args.key)
    out.emit({"key": args.key, "deleted": existed}, text="deleted" if existed else f"{args.key}: absent")
    return Exit.OK if existed else Exit.NOT_FOUND


async def _ls(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    if args.limit < 0:
        raise UsageError("--limit must be >= 0")
    rows: list[list[object]] = []
    count = 0
    if args.keys_only:
        async for key in fp.list_keys(args.prefix):
            if args.limit and count >= args.limit:
                break
            count += 1
            if out.json:
                out.line({"key": key})
            else:
                rows.append([key])
        if not out.json:
            out.table(["KEY"], rows)
        return Exit.OK
    async for entry in fp.list(args.prefix):
        if args.limit and count >= args.limit:
            break
        count += 1
        if out.json:
            out.line({"key": entry.key, "version": entry.version, **blob(entry.value)})
        else:
            rows.append([entry.key, entry.version, len(entry.value), clip(show_bytes(entry.value), 40)])
    if not out.json:
        out.table(["KEY", "VERSION", "BYTES", "VALUE"], rows)
    return Exit.OK


async def _cas(fp: AsyncClient, args: argparse.Namespace, out: Out) -> int:
    if args.delete:
        if args.expect is None:
            raise UsageError("--delete needs --expect VERSION")
        if args.value is not None or args.file is not None:
            raise UsageError("--delete takes no value")
        res = await fp.delete_if_version(args.key, args.expect)
    elif args.absent:
        res = await fp.put_if_absent(args.key, read_input(args.value, args.file))
    else:
        res = await fp.put_if_version(args.key, read_input(args.value, args.file), args.expect)
    doc = {"key": args.key, "applied": res.applied, "version": res.version}
    if res.applied:
        out.emit(doc, text=res.version or "deleted")
        return Exit.OK
    current = res.version or "(absent)"
    out.emit(doc, text=f"not applied: {args.key} is at version {current}")
    return Exit.NOT_APPLIED
