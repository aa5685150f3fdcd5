"""Every RPC of every service, fed hostile bytes on the wire.

Bounded in `make test` (a few hundred calls per backend, fewer on the
DynamoDB emulator); `FENCEPOST_RELIABILITY=long` (`make reliability`) runs
more than 100,000 calls. The counts per RPC and the statuses seen are
printed at the end of the session (conftest.py).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fencepost.v1 import journal_pb2, kv_pb2, ledger_pb2, memory_pb2, schedule_pb2

from .conftest import TALLIES
from .harness import Fuzzer, ServerThread, Tally
from .messages import WAITING, Rpc, all_rpcs, mutate, request_bytes

LONG = os.environ.get("FENCEPOST_RELIABILITY", "short") == "long"
#: calls per backend: (short, long); the long profile's total is over 100,000
CALLS = {"memory": (400, 50_000), "sqlite": (300, 50_000), "dynamodb": (100, 2_000)}
ROUND_CALLS = 2_000
#: byte-level mutants sent after each drawn request (counted in CALLS)
MUTANTS = 2
#: when set, the running tally is written here after every round (long runs)
TABLE_FILE = os.environ.get("FENCEPOST_FUZZ_TABLE")
RPCS = all_rpcs()


def _by_name(service: str, name: str) -> Rpc:
    return next(r for r in RPCS if r.service.endswith(service) and r.name == name)


def _seed(fuzz: Fuzzer) -> dict[str, list[object]]:
    """Names that exist on the server, so drawn calls get past the first check."""

    channel = fuzz.caller.channel
    ledger = ledger_pb2.OpenSessionResponse.FromString(
        channel.unary_unary("/fencepost.v1.LedgerService/OpenSession")(
            ledger_pb2.OpenSessionRequest(agent="a0", session_key="s0").SerializeToString(), timeout=30
        )
    )
    sid = ledger.session.session_id
    lease = ledger_pb2.AcquireLeaseResponse.FromString(
        channel.unary_unary("/fencepost.v1.LedgerService/AcquireLease")(
            ledger_pb2.AcquireLeaseRequest(session_id=sid, holder_id="h0").SerializeToString(), timeout=30
        )
    )
    gen = lease.lease.generation
    reminder = schedule_pb2.CreateReminderResponse.FromString(
        channel.unary_unary("/fencepost.v1.ScheduleService/CreateReminder")(
            schedule_pb2.CreateReminderRequest(
                session_id=sid, generation=gen, prompt="p", after_seconds=1
            ).SerializeToString(), timeout=30,
        )
    )
    entry = memory_pb2.MemoryServiceAppendResponse.FromString(
        channel.unary_unary("/fencepost.v1.MemoryService/Append")(
            memory_pb2.MemoryServiceAppendRequest(agent_id="a0", content="remember this").SerializeToString(),
            timeout=30,
        )
    )
    channel.unary_unary("/fencepost.v1.KvService/Put")(
        kv_pb2.PutRequest(key="k0", value=b"v").SerializeToString(), timeout=30
    )
    channel.unary_unary("/fencepost.v1.JournalService/AppendTurn")(
        journal_pb2.AppendTurnRequest(
            agent="a0", record=journal_pb2.TurnRecord(at="2026-01-01T00:00:00Z", session_id=sid, channel_id="c",
                                                      status=journal_pb2.TURN_STATUS_COMPLETED),
        ).SerializeToString(), timeout=30,
    )
    return {
        "session_id": [sid, sid, "s-unknown"], "parent_session_id": [sid], "generation": [gen, gen + 1],
        "holder_id": ["h0", "h1"], "agent": ["a0", "a1"], "agent_id": ["a0"], "sdk_agent_id": ["a0"],
        "key": ["k0", "k1"], "prefix": ["", "k"], "delete_key": ["k0"], "session_key": ["s0", "s1"],
        "child_session_key": ["c0"], "id": [reminder.reminder.id, "rem_2", entry.entry.id],
        "supersedes": [entry.entry.id], "run_id": ["r0"], "experiment": ["e0"], "request_id": ["rq0", "rq1"],
        "at": ["2026-01-01T00:00:00Z", "10000-01-01T00:00:00Z"], "channel_id": ["c"], "v": [1],
        "expected_seq": [0, 1, 2], "from_seq": [0, 1], "at_seq": [0, 1], "after_seconds": [1, 2**53 - 1],
        "try_lease": ["h0"], "query": ["remember"], "content": ["remember that"],
        "call": ["memory.append", "memory.read"],
    }


def _weights() -> list[Rpc]:
    """Each RPC equally often, except the ones that wait (each costs a deadline)."""
    return [r for r in RPCS for _ in range(1 if r.name in WAITING else 4)]


def _round(fuzzer: Fuzzer, count: int) -> None:
    """`count` drawn calls against one freshly seeded server."""
    pools = _seed(fuzzer)
    weighted = _weights()
    strategies = {r.path: request_bytes(r, pools) for r in RPCS}

    @settings(max_examples=count // (1 + MUTANTS), deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=not LONG)
    @given(st.data())
    def one_call(data: st.DataObject) -> None:
        rpc = data.draw(st.sampled_from(weighted), label="rpc")
        body, _how = data.draw(strategies[rpc.path], label="request")
        fuzzer.check(rpc, body)
        rng = random.Random(data.draw(st.integers(0, 2**32), label="mutants"))
        for _ in range(MUTANTS):  # the same request, corrupted on the wire
            fuzzer.check(rpc, mutate(body, rng))

    for rpc in RPCS:  # every RPC at least once, with the empty (all-default) request
        fuzzer.check(rpc, b"")
    one_call()
    assert fuzzer.caller.serving(), "the server stopped SERVING"


@pytest.mark.parametrize("backend", [pytest.param(b, id=b, marks=[pytest.mark.backend(b)]) for b in CALLS])
def test_hostile_requests_are_answered_exactly(backend: str, tmp_path: Path) -> None:
    count = CALLS[backend][1 if LONG else 0]
    rounds = max(1, count // ROUND_CALLS)  # a fresh server per round keeps the raw snapshots small
    tally = TALLIES[backend] = Tally()
    for n in range(rounds):
        server = ServerThread(backend, tmp_path)
        fuzzer = Fuzzer(server, tally)
        try:
            _round(fuzzer, count // rounds)
        finally:
            fuzzer.close()
            server.close()
        if TABLE_FILE:
            Path(f"{TABLE_FILE}.{backend}").write_text(f"after round {n + 1} of {rounds}\n{tally.table()}\n")
        problems = tally.problems
        assert not problems, f"{len(problems)} answers broke the oracle:\n" + "\n".join(problems[:30])
    assert set(tally.answers) == {r.path for r in RPCS}, "some RPC was never called"
