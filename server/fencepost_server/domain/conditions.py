"""Helpers that turn per-key conditions into one valid `transact` call.

A backend transaction names each key at most once, so conditions and writes on
the same key are merged: the condition rides on the write.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..storage import Check, Delete, Expect, Put, Write


class Unsatisfiable(Exception):
    """Two conditions on one key contradict each other: the branch can never apply."""


def merge_expect(a: Expect | None, b: Expect | None) -> Expect | None:
    if a is None:
        return b
    if b is None:
        return a

    def pick(x: object, y: object) -> object:
        if x is not None and y is not None and x != y:
            raise Unsatisfiable
        return x if x is not None else y

    merged = Expect(
        exists=pick(a.exists, b.exists),  # type: ignore[arg-type]
        version=pick(a.version, b.version),  # type: ignore[arg-type]
        value=pick(a.value, b.value),  # type: ignore[arg-type]
    )
    if merged.exists is False and (merged.version is not None or merged.value is not None):
        raise Unsatisfiable
    return merged


def plan(conditions: Iterable[tuple[str, Expect]], writes: Sequence[Write]) -> tuple[list[Check], list[Write]]:
    """Fold `conditions` into `writes` on the same key; the rest become checks.
    Raises Unsatisfiable when conditions on one key contradict."""
    by_key: dict[str, Expect | None] = {}
    for key, expect in conditions:
        by_key[key] = merge_expect(by_key.get(key), expect)
    planned: list[Write] = []
    for w in writes:
        expect = merge_expect(w.expect, by_key.pop(w.key, None))
        planned.append(Put(w.key, w.value, expect) if isinstance(w, Put) else Delete(w.key, expect))
    checks = [Check(k, e) for k, e in by_key.items() if e is not None]
    return checks, planned
