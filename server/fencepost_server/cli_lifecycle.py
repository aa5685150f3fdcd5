"""`fencepost backup | restore | migrate`: operator commands that work on a
backend directly (not over gRPC). The logic lives in lifecycle/."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from fencepost.cli.args import positive_int

from .lifecycle.stores import EMPTY_TARGET
from .storage import EXPORT_PAGE

_EXIT_CODES = """exit codes: 0 done (and verified), 1 a backend failed (migrate: run it again to resume),
2 usage, 3 refused (target not empty), 4 archive corrupt or incomplete, 5 verification found differences,
130 interrupted (what the store holds now and the next step are printed)"""

_URLS = "backend URLs: sqlite:///path.db, dynamodb://TABLE?endpoint=URL&region=R"


def register(subparsers: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "backup", help="write a checksummed archive of every stored item", formatter_class=fmt,
        description="Archive every item (key, value, version token) of a backend. On SQLite it is an online, "
                    "point-in-time snapshot: the server may keep serving. On DynamoDB it is a logical read; the "
                    "archive's trailer says whether a second read found the table unchanged (quiesced); prefer "
                    "the table's point-in-time recovery for disaster recovery.",
        epilog=f"{_URLS}\n{_EXIT_CODES}",
    )
    p.add_argument("--backend", required=True, metavar="URL", help="the store to back up")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="archive file to write (.gz: compressed)")
    p.add_argument("--page", type=positive_int, default=EXPORT_PAGE, metavar="N",
                   help="items per read and per chunk (default %(default)s)")
    p.set_defaults(func=_cmd_backup)

    p = subparsers.add_parser(
        "restore", help="restore an archive into an empty store", formatter_class=fmt,
        description="Check every checksum of the archive, then write its items, version tokens included, into an "
                    "EMPTY store (a non-empty one is refused) and compare the store with the archive.",
        epilog=f"{_URLS}\n{_EXIT_CODES}",
    )
    p.add_argument("--backend", required=True, metavar="URL", help="the empty store to restore into")
    p.add_argument("--in", dest="archive", required=True, type=Path, metavar="FILE",
                   help="archive file written by backup")
    p.add_argument("--create-table", action="store_true", help="create the DynamoDB table if missing")
    p.set_defaults(func=_cmd_restore)

    p = subparsers.add_parser(
        "migrate", help="copy every item to another backend, resumably, then verify", formatter_class=fmt,
        description="Copy every item, version tokens included, from one backend into an empty other one, with a "
                    "progress bar; a checkpoint in the work directory lets the same command resume after an "
                    "interruption (kill -9 included). A SQLite source is copied from an online snapshot; a "
                    "DynamoDB source must be quiesced (no server writing). Then both sides are compared "
                    "(counts and a digest per key range): any difference exits 5.",
        epilog=f"{_URLS}\n{_EXIT_CODES}",
    )
    p.add_argument("--from", dest="source", required=True, metavar="URL", help="the store to copy")
    p.add_argument("--to", dest="target", required=True, metavar="URL", help="the empty store to copy into")
    p.add_argument("--work-dir", type=Path, default=None, metavar="DIR",
                   help="checkpoint and snapshot directory (default .fencepost-migrate/<hash of the URLs>)")
    p.add_argument("--page", type=positive_int, default=EXPORT_PAGE, metavar="N",
                   help="items per read and per checkpoint (default %(default)s)")
    p.add_argument("--create-table", action="store_true", help="create the DynamoDB table if missing")
    p.set_defaults(func=_cmd_migrate)


def _run(coro: Any, interrupted: str) -> tuple[int, Any]:
    """Run a command; on Ctrl-C say what state it left (`interrupted`) and the next step."""
    from .lifecycle import Exit, LifecycleError

    try:
        return 0, asyncio.run(coro)
    except LifecycleError as exc:
        print(f"fencepost: {exc}", file=sys.stderr)
        return int(exc.code), None
    except KeyboardInterrupt:
        end_bar = "\n" if sys.stderr.isatty() else ""  # a progress bar may be half drawn
        print(f"{end_bar}fencepost: interrupted: {interrupted}", file=sys.stderr)
        return int(Exit.INTERRUPTED), None


def _cmd_backup(args: argparse.Namespace) -> int:
    from .lifecycle import backup

    code, report = _run(backup(args.backend, args.out, page=args.page),
                        f"no archive was written ({args.out} is only renamed into place when complete)")
    if report is not None:
        state = "point-in-time snapshot" if report.consistency == "snapshot" else (
            "logical; source quiesced (unchanged on a second read)" if report.quiesced
            else "logical; the source CHANGED while it was read (not quiesced)")
        print(f"backup {args.out}: {report.items} items in {report.chunks} chunks, {state}, "
              f"{report.seconds:.1f}s")
    return code


def _cmd_restore(args: argparse.Namespace) -> int:
    from .lifecycle import Exit, restore

    code, report = _run(restore(args.backend, args.archive, create_table=args.create_table),
                        f"{args.backend} may now hold part of the archive: {EMPTY_TARGET}, "
                        "then run the same command again")
    if report is None:
        return code
    h = report.header
    print(f"restore {args.archive} -> {args.backend}: {report.items} items, {report.seconds:.1f}s "
          f"(a {h.consistency} archive of a {h.source} store, made {h.created})")
    if not report.quiesced:
        print("fencepost: warning: the archive's source was not quiesced (it changed while backup read it): "
              "the store may hold a mix of two points in time", file=sys.stderr)
    code = _verdict(report.verification, int(Exit.DIFFERENT), ("in the archive", "in the store"))
    if not code:
        print(f"next: serve it (fencepost serve --backend '{args.backend}' ...)")
    else:
        print(f"the store was written while the restore wrote it (a server serving it?): stop every server on "
              f"{args.backend}, {EMPTY_TARGET}, and run the command again", file=sys.stderr)
    return code


def _cmd_migrate(args: argparse.Namespace) -> int:
    from .lifecycle import Exit, migrate, work_dir_for

    work = args.work_dir or work_dir_for(args.source, args.target)
    code, report = _run(migrate(args.source, args.target, work_dir=work, page=args.page,
                                create_table=args.create_table),
                        f"run the same command again to resume (the checkpoint is in {work})")
    if report is None:
        return code
    resumed = f" (resumed after {report.resumed_after} items)" if report.resumed_after else ""
    if report.already_done:
        print(f"migrate {args.source} -> {args.target}: already copied ({report.resumed_after} items); verified again")
    else:
        print(f"migrate {args.source} -> {args.target}: copied {report.copied} items{resumed} in "
              f"{report.copy_seconds:.1f}s ({report.rate:,.0f} items/s) from a {report.consistency} read; "
              f"verified in {report.verify_seconds:.1f}s")
    code = _verdict(report.verification, int(Exit.DIFFERENT))
    if not code:
        print(f"next (docs/lifecycle.md, Runbook): with the source's servers stopped, serve the target "
              f"(fencepost serve --backend '{args.target}' ...); keep the source, unserved, until satisfied")
    else:
        print(f"the source changed after the copy read it (a server still writing to it?), or the target was "
              f"written meanwhile: stop every writer, empty the target (a new file or table), delete {work} "
              "and run the command again (docs/lifecycle.md, Quiescence)", file=sys.stderr)
    return code


def _verdict(verification: Any, different: int, sides: tuple[str, str] = ("on the source", "on the target")) -> int:
    v = verification
    if v.same:
        print(f"verified: {v.reference_items} items on both sides, {v.ranges} key ranges, identical")
        return 0
    print(f"VERIFICATION FAILED: {v.reference_items} items {sides[0]}, {v.other_items} {sides[1]}; "
          f"{v.mismatched} of {v.ranges} key ranges differ:", file=sys.stderr)
    for difference in v.differences:
        print(f"  {difference}", file=sys.stderr)
    return different
