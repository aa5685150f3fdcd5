"""The figures table printed at the end of a reliability session."""

from __future__ import annotations

from collections.abc import Sequence

from .suite import Figures

KINDS = ("fail", "timeout", "lose")
COLUMNS = ("backend", "run", "ops", "ok/unknown/fail", "faults fail/timeout/lose", "call kinds faulted",
           "kills", "races", "histories kv/ledger/journal", "inconclusive", "violations", "known defect", "secs")


def rows(figures: Sequence[Figures]) -> list[tuple[str, ...]]:
    out = []
    for f in figures:
        out.append((
            f.backend, f.run, f"{f.operations:,}",
            "/".join(str(f.outcomes[k]) for k in ("ok", "unknown", "fail")),
            "/".join(str(f.faults[k]) for k in KINDS) if f.run == "faults" else "-",
            f"{len(f.faulted_calls)}/{len(f.backend_calls)}" if f.run == "faults" else "-",
            str(f.kills), str(f.races),
            "/".join(str(f.histories[k]) for k in ("kv", "ledger", "journal")),
            str(f.inconclusive), str(len(f.violations)), str(len(f.known)), f"{f.seconds:.0f}",
        ))
    return out


def table(figures: Sequence[Figures]) -> str:
    body = [COLUMNS, *rows(figures)]
    widths = [max(len(r[i]) for r in body) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    totals = Figures("all", "total")
    for f in figures:
        totals.operations += f.operations
        totals.kills += f.kills
        totals.races += f.races
        totals.violations += f.violations
        totals.known += f.known
        totals.faults.update(f.faults)
    lines.append(f"total: {totals.operations:,} operations, faults {dict(totals.faults)}, "
                 f"{totals.kills} kill -9 restarts, {totals.races} paused-holder races, "
                 f"{len(totals.violations)} violations, {len(totals.known)} findings of the known KV replay defect")
    for f in figures:
        if f.run == "faults":
            lines.append(f"{f.backend}: backend call kinds faulted: {sorted(f.faulted_calls)} "
                         f"(of those called: {sorted(f.backend_calls)})")
    return "\n".join(lines)
