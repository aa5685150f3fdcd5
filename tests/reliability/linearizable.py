"""Linearizability of KV CAS histories on one key: a Wing–Gong search (with
Lowe's memo of visited (linearized set, state) pairs) against a register
model of get / put / delete / put_if_absent / put_if_version /
delete_if_version.

Values written by the workload are unique, so the model state is just the
current value (None when absent). Version tokens are opaque and server-made:
the search learns version -> value from every response that carries both (an
applied write, a get). Whether a token never seen with a value (e.g. from an
unknown write) is the current one is undecided when the current value's own
token was never seen either: a CAS on it may then succeed or be refused.

A refused CAS reports the version that refused it, read by the backend in
the same atomic step as the refusal, so it is part of the model: the state
the refusal is linearized at must carry that version ("" = absent).

An op with an unknown outcome may take effect at any point after its invoke,
or never (it is never required to be linearized). Failed writes applied
nothing and are left out, as are reads that got no answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .history import OK, UNKNOWN, Op

GET, PUT, DELETE = "kv.get", "kv.put", "kv.delete"
PUT_IF_ABSENT, PUT_IF_VERSION, DELETE_IF_VERSION = "kv.put_if_absent", "kv.put_if_version", "kv.delete_if_version"
DEFAULT_BUDGET = 200_000  # search nodes per history before giving up (inconclusive)


@dataclass(frozen=True)
class Verdict:
    linearizable: bool
    inconclusive: bool = False
    explored: int = 0
    detail: str = ""
    replays: tuple[Op, ...] = ()  # writes that reported another write's version (see _Versions)
    #: not linearizable when writes' reported versions are trusted, linearizable
    #: when only versions seen by gets are: explained by the replay defect
    replay_suspect: bool = False


class _Versions:
    """What the history revealed about version tokens.

    A version reported by two applied writes (or an applied write reporting
    none) is the known KV request-id replay defect: a retried write whose
    first attempt applied reports the key's *current* version, which may be
    a later write's. Those reports are listed in `replays` and not trusted;
    the rest of the history is still checked."""

    def __init__(self, ops: Sequence[Op], trust_writes: bool = True) -> None:
        self.value_of: dict[str, bytes] = {}
        self.version_of: dict[bytes, str] = {}
        self.conflict = ""
        self.replays: list[Op] = []
        claims: dict[str, list[Op]] = defaultdict(list)
        for op in ops:
            if op.status != OK:
                continue
            if op.kind == GET and op.result is not None:
                self._learn(op.result[1], op.result[0])
            elif op.kind == PUT:
                claims[op.result].append(op)
            elif op.kind in (PUT_IF_ABSENT, PUT_IF_VERSION) and op.result.applied:
                claims[op.result.version].append(op)
            elif op.kind == DELETE_IF_VERSION and op.result.applied and op.result.version:
                self.replays.append(op)  # an applied delete leaves no version to report
        for version, writers in claims.items():
            observed = self.value_of.get(version)  # seen by a get: that pins the owner
            owners = [w for w in writers if version and (observed is None or w.args["value"] == observed)
                      and self.version_of.get(w.args["value"], version) == version]  # a get may pin it elsewhere
            if len(owners) == 1 and trust_writes:
                self._learn(version, owners[0].args["value"])
            self.replays += [w for w in writers if len(owners) != 1 or w is not owners[0]]

    def _learn(self, version: str, value: bytes) -> None:
        if self.value_of.setdefault(version, value) != value or self.version_of.setdefault(value, version) != version:
            self.conflict = f"version {version!r} seen with two values, or value {value!r} with two versions"

    def matches(self, state: bytes | None, version: str) -> bool | None:
        """Does the register in `state` carry `version` ("" = absent)? None
        when the history cannot tell (neither token nor value pinned)."""
        if not version:
            return state is None
        if version in self.value_of:
            return state == self.value_of[version]
        if state is None or state in self.version_of:
            return False
        return None


def _step(op: Op, state: bytes | None, versions: _Versions) -> list[bytes | None]:
    """The states `op` may leave `state` in (none: `op` cannot be next)."""
    if op.kind == GET:
        seen = op.result
        legal = state is None if seen is None else state == seen[0]
        return [state] if legal else []
    if op.kind == PUT:
        return [op.args["value"]]
    if op.kind == DELETE:
        return [None] if op.status == UNKNOWN or op.result == (state is not None) else []
    if op.kind == PUT_IF_ABSENT:
        holds: bool | None = state is None
    elif op.kind in (PUT_IF_VERSION, DELETE_IF_VERSION):
        holds = versions.matches(state, op.args["expected"])
    else:
        raise ValueError(f"not a register op: {op.kind}")
    written = None if op.kind == DELETE_IF_VERSION else op.args["value"]
    if op.status == OK:
        if holds is not None and op.result.applied != holds:
            return []
        if not op.result.applied and versions.matches(state, op.result.version) is False:
            return []  # refused by a version this state does not carry
        return [written] if op.result.applied else [state]
    if holds is None:
        return [written, state]
    return [written] if holds else [state]


def check_register(ops: Sequence[Op], initial: bytes | None = None, budget: int = DEFAULT_BUDGET) -> Verdict:
    """Is this one-key history linearizable? Unknown ops may be left out.
    When it is not, it is searched again trusting only the versions gets saw
    (a replayed write may report another write's version): passing then is
    reported as `replay_suspect`, not as linearizable."""
    verdict = _search(ops, initial, budget, trust_writes=True)
    if verdict.linearizable:
        return verdict
    relaxed = _search(ops, initial, budget, trust_writes=False)
    if relaxed.linearizable and not relaxed.inconclusive:
        return Verdict(False, explored=verdict.explored + relaxed.explored, detail=verdict.detail,
                       replays=verdict.replays, replay_suspect=True)
    return verdict


def _search(ops: Sequence[Op], initial: bytes | None, budget: int, trust_writes: bool) -> Verdict:
    relevant = [op for op in ops if op.status == OK or (op.status == UNKNOWN and op.kind != GET)]
    relevant.sort(key=lambda op: (op.complete, op.invoke))  # try the earliest-finished first
    versions = _Versions(relevant, trust_writes)
    replays = tuple(versions.replays)
    if versions.conflict:
        return Verdict(False, detail=versions.conflict, replays=replays)
    n = len(relevant)
    required = sum(1 << i for i, op in enumerate(relevant) if op.status == OK)
    visited: set[tuple[int, bytes | None]] = set()
    stack: list[tuple[int, bytes | None]] = [(0, initial)]
    explored = 0
    deepest = 0
    while stack:
        done, state = stack.pop()
        if done & required == required:
            return Verdict(True, explored=explored, replays=replays)
        if (done, state) in visited:
            continue
        visited.add((done, state))
        explored += 1
        if explored > budget:
            return Verdict(True, inconclusive=True, explored=explored, detail="search budget exhausted",
                           replays=replays)
        deepest = max(deepest, bin(done & required).count("1"))
        pending = [i for i in range(n) if not done >> i & 1]
        horizon = min(relevant[i].complete for i in pending)
        for i in reversed(pending):  # reversed: the stack pops the earliest-finished first
            op = relevant[i]
            if op.invoke >= horizon:
                continue
            for after in _step(op, state, versions):
                stack.append((done | 1 << i, after))
    return Verdict(False, explored=explored, replays=replays,
                   detail=f"no linearization: at most {deepest} of {bin(required).count('1')} acked ops ordered")


def describe(ops: Sequence[Op]) -> str:
    """A short dump of a history for a violation message."""
    def show(op: Op) -> str:
        res: Any = op.result
        if op.kind not in (GET, PUT, DELETE) and res is not None:
            res = (res.applied, res.version)
        args = {k: v for k, v in op.args.items() if k != "key"}
        error = f" ({op.error})" if op.error is not None else ""
        return f"{op.process} {op.kind}{args} -> {op.status} {res}{error} [{op.invoke:.4f}, {op.complete:.4f}]"
    return "\n".join(show(op) for op in sorted(ops, key=lambda o: o.invoke))
