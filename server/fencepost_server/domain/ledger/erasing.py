"""Erasure markers: while an agent or tenant erasure runs, no session of its
scope can be created, so none is ever half erased.

    #/erasing/{hh}/{sha256(tenant)}/{sha256(agent) | *}/{shard}   {"ops": [operation id, ...]}

(`hh`: the first two hex digits of the tenant's hash.) A scope's marker is
SHARDS items holding the same value, always written together. The erasure
(domain/erasure.py) writes its id into every shard of its scope in the same
transaction that records the operation, and takes it out (deleting a shard
when no other operation of the scope is left) in the step that reaches
`done`, before `done` is saved. Every write that creates a session
(OpenSession, Deliver by key, Fork) checks, in its own transaction, that
one shard of the agent's marker and one of the tenant's are absent: two
condition checks in the one backend call it makes anyway.

Why no session is half erased. A creating transaction and the marker's
write both name the shard it checks, so the backend orders them (SQLite:
one writer; DynamoDB: TransactWriteItems are serializable against every
other write of the items they name). A creation ordered before the marker
is committed before the operation exists, hence before any list of the
fence phase, which walks from the start of the scope: the fence finds it
and tombstones it whole, as DeleteSession does. A creation ordered after the
marker fails its check and writes nothing, until the marker goes, which is
after the sweep and directory phases. Under the scope's prefixes there is
then nothing left for the operation to delete.

Why shards: DynamoDB cancels a transaction that names an item another
ongoing transaction names (a condition check included), and serves one item
at a bounded rate. The shard a creation checks follows its agent and session
key, so concurrent creations of one tenant or agent seldom name the same
item. The markers live under `#/`, not under the scope (the sweep does not
remove them), name the scope only by hashes, and spread over 256 DynamoDB
partitions by tenant.
"""

from __future__ import annotations

import json

from fencepost import reasons

from ...storage import Check, Expect, Item, TxnResult
from ..errors import FailedPrecondition
from .layout import digest

ERASING_PREFIX = "#/erasing/"
OPERATION_NAME_PREFIX = "operations/erase-"
#: items per scope's marker; an operation writes them all, with its record, in
#: one transaction (65 of DynamoDB's 100 items). Concurrent creations of one
#: tenant conflict when they pick the same shard within a transaction's
#: ~10-30 ms: at 100 creations a second about 1 in 16 is retried by the
#: backend (a conflict is retried, never an error); at 16 shards, 1 in 4.
SHARDS = 64
_ABSENT = Expect(exists=False)


def marker_prefix(tenant: str, agent: str | None) -> str:
    """The marker's shards of an agent's scope, or (agent None) of the whole tenant's."""
    scope = digest(tenant)
    return f"{ERASING_PREFIX}{scope[:2]}/{scope}/{'*' if agent is None else digest(agent)}/"


def marker_keys(tenant: str, agent: str | None) -> list[str]:
    prefix = marker_prefix(tenant, agent)
    return [f"{prefix}{n:02x}" for n in range(SHARDS)]


def creation_checks(tenant: str, agent: str, session_key: str) -> list[Check]:
    """The checks a session-creating transaction carries (two indexes, in this
    order): the shard of the agent's and of the tenant's marker that the
    session's (agent, session_key) picks."""
    shard = f"{int(digest(agent + chr(0) + session_key)[:8], 16) % SHARDS:02x}"
    return [
        Check(marker_prefix(tenant, agent) + shard, _ABSENT),
        Check(marker_prefix(tenant, None) + shard, _ABSENT),
    ]


def marker_ops(item: Item | None) -> list[str]:
    """The operation ids a marker names (none when it is absent)."""
    return list(json.loads(item.value)["ops"]) if item is not None else []


def marker_value(ops: list[str]) -> bytes:
    return json.dumps({"ops": ops}, separators=(",", ":")).encode()


def refusal(res: TxnResult, first: int) -> FailedPrecondition | None:
    """ERASURE_IN_PROGRESS when one of the checks at `first`, `first + 1`
    (`creation_checks`) failed: it names the first operation of the marker
    the backend found in the same atomic step (no read of its own)."""
    for index in (first, first + 1):
        if index in res.failed:
            ops = marker_ops((res.found or {}).get(index))
            name = OPERATION_NAME_PREFIX + ops[0] if ops else ""
            return FailedPrecondition(
                reasons.ERASURE_IN_PROGRESS,
                f"an erasure of this {'agent' if index == first else 'tenant'} is running ({name}): "
                "no session can be created until it is done",
                {"operation": name},
            )
    return None
