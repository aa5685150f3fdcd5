"""Checkers over a recorded history plus the state read back after the run.

KV:      every key's CAS history is linearizable (linearizable.check_register).
Ledger:  no two commits at one (session, seq); no commit applied twice; every
         acked commit is in the log where it was acked, no refused one is;
         no commit by a generation older than one already granted (in log
         order, and in real time after the grant was acked); every acked
         Deliver is pending or consumed by exactly one applied commit.
Journal: every acked append is read back exactly once, an unknown one at
         most once, a refused one never.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from .history import FAIL, OK, UNKNOWN, History, Op, Violation
from .linearizable import check_register, describe


@dataclass
class CheckReport:
    histories: int = 0
    inconclusive: int = 0
    violations: list[Violation] = field(default_factory=list)
    #: findings of a known, tracked defect (test_known_defects.py), reported apart
    known: list[Violation] = field(default_factory=list)

    def add(self, check: str, detail: str) -> None:
        self.violations.append(Violation(check, detail))

    def merge(self, other: CheckReport) -> None:
        self.histories += other.histories
        self.inconclusive += other.inconclusive
        self.violations += other.violations
        self.known += other.known


# -- KV ---------------------------------------------------------------------
def check_kv(history: History) -> CheckReport:
    report = CheckReport()
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in history.of("kv."):
        by_key[op.args["key"]].append(op)
    for key, ops in sorted(by_key.items()):
        verdict = check_register(ops)
        report.histories += 1
        report.inconclusive += verdict.inconclusive
        if verdict.replay_suspect:
            report.known.append(Violation("kv.replay_version", f"key {key}: linearizable only if writes' "
                                          f"reported versions are not trusted\n{describe(ops)}"))
        elif not verdict.linearizable:
            report.add("kv.linearizable", f"key {key}: {verdict.detail}\n{describe(ops)}")
        for op in verdict.replays:
            report.known.append(Violation("kv.replay_version", f"key {key}: {op.kind} {op.args} reported "
                                          f"{op.result} (not its own version)"))
    return report


# -- ledger -----------------------------------------------------------------
def record_bytes(commit_id: str, generation: int, index: int) -> bytes:
    """A commit's record: who wrote it, so the log can be traced back."""
    return json.dumps({"c": commit_id, "g": generation, "i": index}).encode()


@dataclass
class LedgerState:
    """Read back after the run: each session's log and pending inbox."""

    logs: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    pending: dict[str, set[str]] = field(default_factory=dict)


def check_ledger(history: History, state: LedgerState) -> CheckReport:
    report = CheckReport()
    commits = history.of("ledger.commit")
    by_id = {op.args["commit_id"]: op for op in commits}
    applied: dict[str, list[int]] = defaultdict(list)  # commit id -> seqs its records sit at
    for sid, log in state.logs.items():
        report.histories += 1
        _check_log(report, sid, log, applied)
    for cid, seqs in applied.items():
        op = by_id.get(cid)
        if op is None:
            report.add("ledger.foreign", f"log holds records of unknown commit {cid}")
            continue
        n = len(op.args["records"])
        if len(seqs) > n or len(set(seqs)) != len(seqs):
            report.add("ledger.double_applied", f"commit {cid} ({n} records) sits at seqs {sorted(seqs)}")
        if op.status == FAIL:
            report.add("ledger.refused_applied", f"commit {cid} was refused ({op.error}) yet is at seqs {seqs}")
    for op in commits:
        if op.status != OK:
            continue
        cid, n = op.args["commit_id"], len(op.args["records"])
        want = list(range(op.result.seq - n + 1, op.result.seq + 1))
        if sorted(applied.get(cid, [])) != want:
            report.add("ledger.lost_commit", f"acked commit {cid} at seqs {want} is at {applied.get(cid, [])}")
    _check_overlaps(report, commits)
    _check_fence_in_time(report, history, applied)
    _check_inbox(report, history, state, applied, by_id)
    return report


def _check_log(report: CheckReport, sid: str, log: Sequence[tuple[int, bytes]],
               applied: dict[str, list[int]]) -> None:
    newest_gen, newest_at = 0, 0
    for seq, data in log:
        rec = json.loads(data)
        applied[rec["c"]].append(seq)
        if rec["g"] < newest_gen:
            report.add("ledger.fencing", f"session {sid} seq {seq}: a commit by generation {rec['g']} after "
                       f"generation {newest_gen} committed at seq {newest_at}")
        if rec["g"] > newest_gen:
            newest_gen, newest_at = rec["g"], seq


def _check_overlaps(report: CheckReport, commits: Sequence[Op]) -> None:
    """No two acked commits claim one (session, seq)."""
    owner: dict[tuple[str, int], str] = {}
    for op in commits:
        if op.status != OK:
            continue
        n = len(op.args["records"])
        for seq in range(op.result.seq - n + 1, op.result.seq + 1):
            cid = owner.setdefault((op.args["session"], seq), op.args["commit_id"])
            if cid != op.args["commit_id"]:
                report.add("ledger.two_commits_one_seq",
                           f"session {op.args['session']} seq {seq}: acked to {cid} and {op.args['commit_id']}")


def _check_fence_in_time(report: CheckReport, history: History, applied: dict[str, list[int]]) -> None:
    """A commit invoked after a later generation's grant was acked must not land."""
    grants: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for op in history.of("ledger.acquire"):
        if op.status == OK:
            grants[op.args["session"]].append((op.complete, op.result.generation))
    for op in history.of("ledger.commit"):
        landed = op.status == OK or (op.status == UNKNOWN and op.args["commit_id"] in applied)
        if not landed:
            continue
        for acked_at, gen in grants.get(op.args["session"], ()):
            if gen > op.args["generation"] and acked_at < op.invoke:
                report.add("ledger.fencing", f"commit {op.args['commit_id']} by generation {op.args['generation']} "
                           f"landed though generation {gen} was granted before it was sent")
                break


def _check_inbox(report: CheckReport, history: History, state: LedgerState,
                 applied: dict[str, list[int]], by_id: dict[str, Op]) -> None:
    consumed: Counter[str] = Counter()
    for cid in applied:
        if cid in by_id:
            consumed.update(by_id[cid].args["consume"])
    for inbox_id, times in consumed.items():
        if times > 1:
            report.add("ledger.double_consume", f"inbox id {inbox_id} consumed by {times} applied commits")
    pending = {i for ids in state.pending.values() for i in ids}
    for op in history.of("ledger.deliver"):
        if op.status != OK:
            continue
        inbox_id = op.result.inbox_id
        count = consumed[inbox_id] + (inbox_id in pending)
        if count != 1:
            report.add("ledger.lost_event", f"acked event {inbox_id} is pending {inbox_id in pending} and "
                       f"consumed {consumed[inbox_id]} times")


# -- journal ----------------------------------------------------------------
def check_journal(history: History, read_back: dict[str, list[str]]) -> CheckReport:
    """`read_back`: agent -> the tags (sessionId) of every record read back
    (archives then the live journal)."""
    report = CheckReport(histories=len(read_back))
    seen: Counter[tuple[str, str]] = Counter(
        (agent, tag) for agent, tags in read_back.items() for tag in tags
    )
    recorded = set()
    for op in history.of("journal.append"):
        key = (op.args["agent"], op.args["tag"])
        recorded.add(key)
        times = seen[key]
        if op.status == OK and times != 1:
            report.add("journal.acked_append", f"acked append {key} read back {times} times")
        elif op.status == UNKNOWN and times > 1:
            report.add("journal.duplicate", f"unknown append {key} read back {times} times")
        elif op.status == FAIL and times:
            report.add("journal.refused_applied", f"refused append {key} read back {times} times")
    for key in seen.keys() - recorded:
        report.add("journal.foreign", f"record {key} was never appended")
    return report
