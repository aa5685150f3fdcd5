"""The checkers can fail: hand-made bad histories, a deliberately broken
commit (the generation check skipped) caught by the ledger checker, and the
fault wrapper's chosen-step faults."""

from __future__ import annotations

import math

import pytest

from fencepost_server.domain.ledger import commits
from fencepost_server.storage import Check, Expect
from fencepost_server.storage.base import CasResult
from fencepost_server.storage.memory import MemoryStorage

from bench.load import BoundedLoad
from tests.conftest import running
from tests.faults import FaultyStorage

from .checks import LedgerState, check_journal, check_ledger, record_bytes
from .history import FAIL, OK, UNKNOWN, History, Op
from .linearizable import check_register
from .suite import read_back
from .workloads import Workload


def op(i: int, kind: str, invoke: float, complete: float, status: str = OK, result: object = None,
       **args: object) -> Op:
    return Op(i, f"p{i}", kind, {"key": "k", **args}, invoke, complete if status != UNKNOWN else math.inf,
              status, result)


# -- linearizability ----------------------------------------------------------------
def test_stale_read_after_acked_write_is_not_linearizable() -> None:
    history = [
        op(0, "kv.put_if_absent", 0, 1, result=CasResult(True, "v1"), value=b"a"),
        op(1, "kv.get", 2, 3, result=None),  # the write was acked before this read began
    ]
    verdict = check_register(history)
    assert not verdict.linearizable and not verdict.inconclusive and not verdict.replay_suspect


def test_two_winners_of_one_cas_are_not_linearizable() -> None:
    history = [
        op(0, "kv.put_if_absent", 0, 1, result=CasResult(True, "v1"), value=b"a"),
        op(5, "kv.get", 1.5, 1.8, result=(b"a", "v1")),
        op(1, "kv.put_if_version", 2, 4, result=CasResult(True, "v2"), value=b"b", expected="v1"),
        op(2, "kv.put_if_version", 2, 4, result=CasResult(True, "v3"), value=b"c", expected="v1"),
    ]
    verdict = check_register(history)
    assert not verdict.linearizable and not verdict.replay_suspect


def test_overlapping_ops_and_unknown_writes_are_linearizable() -> None:
    history = [
        op(0, "kv.put_if_absent", 0, 5, result=CasResult(True, "v1"), value=b"a"),
        op(1, "kv.get", 1, 2, result=None),  # overlaps the write: ordered before it
        op(2, "kv.put_if_version", 6, 0, status=UNKNOWN, value=b"b", expected="v1"),
        op(3, "kv.get", 7, 8, result=(b"b", "v2")),  # the unknown write took effect
        op(4, "kv.get", 9, 10, result=(b"b", "v2")),
    ]
    assert check_register(history).linearizable


def test_an_unknown_write_that_never_happened_is_allowed_but_a_refused_one_is_not() -> None:
    base = [op(0, "kv.put_if_absent", 0, 1, result=CasResult(True, "v1"), value=b"a")]
    unknown = op(1, "kv.put_if_version", 2, 0, status=UNKNOWN, value=b"b", expected="v1")
    read = op(2, "kv.get", 5, 6, result=(b"a", "v1"))
    assert check_register([*base, unknown, read]).linearizable
    wrong = op(3, "kv.put_if_version", 2, 3, result=CasResult(False, "v1"), value=b"b", expected="v1")
    verdict = check_register([*base, wrong, read])
    assert not verdict.linearizable and not verdict.replay_suspect  # refused though the version matched


def test_a_refusal_reporting_a_version_no_state_carried_is_not_linearizable() -> None:
    base = [op(0, "kv.put_if_absent", 0, 1, result=CasResult(True, "v1"), value=b"a")]
    delete = op(1, "kv.delete_if_version", 4, 5, result=CasResult(True, None), expected="v1")
    # refused while the key held v1 (before the delete): it must report v1
    honest = op(2, "kv.put_if_absent", 2, 3, result=CasResult(False, "v1"), value=b"b")
    assert check_register([*base, honest, delete]).linearizable
    # "not applied, key absent" while nothing had deleted it yet: no order allows it
    absent = op(2, "kv.put_if_absent", 2, 3, result=CasResult(False, None), value=b"b")
    assert not check_register([*base, absent, delete]).linearizable


# -- ledger and journal ---------------------------------------------------------------
def _commit(i: int, sid: str, gen: int, seq: int, status: str, at: float = 0.0) -> Op:
    cid = f"c{i}"
    records = [record_bytes(cid, gen, 0)]
    result = type("R", (), {"seq": seq + 1})() if status == OK else None
    return Op(i, "h", "ledger.commit", {"session": sid, "generation": gen, "expected_seq": seq, "records": records,
                                        "consume": [], "commit_id": cid}, at, at + 1, status, result)


def test_ledger_checker_catches_double_apply_lost_commit_and_stale_generation() -> None:
    h = History()
    h.ops += [_commit(0, "s", 2, 0, OK), _commit(1, "s", 1, 1, UNKNOWN), _commit(2, "s", 2, 1, OK)]
    state = LedgerState(logs={"s": [(1, h.ops[0].args["records"][0]), (2, h.ops[1].args["records"][0]),
                                    (3, h.ops[0].args["records"][0])]}, pending={"s": set()})
    found = {v.check for v in check_ledger(h, state).violations}
    assert {"ledger.double_applied", "ledger.lost_commit", "ledger.fencing"} <= found


def test_ledger_checker_catches_a_lost_acked_delivery() -> None:
    h = History()
    h.ops.append(Op(0, "d", "ledger.deliver", {"session": "s", "payload": b"x"}, 0, 1, OK,
                    type("D", (), {"inbox_id": "i1"})()))
    report = check_ledger(h, LedgerState(logs={"s": []}, pending={"s": set()}))
    assert [v.check for v in report.violations] == ["ledger.lost_event"]


def test_journal_checker_catches_lost_and_duplicated_appends() -> None:
    h = History()
    h.ops += [Op(0, "j", "journal.append", {"agent": "a", "tag": "t0"}, 0, 1, OK),
              Op(1, "j", "journal.append", {"agent": "a", "tag": "t1"}, 0, 1, OK),
              Op(2, "j", "journal.append", {"agent": "a", "tag": "t2"}, 0, 1, FAIL)]
    found = [v.check for v in check_journal(h, {"a": ["t1", "t1", "t2"]}).violations]
    assert found == ["journal.acked_append", "journal.acked_append", "journal.refused_applied"]


# -- a deliberately broken server -------------------------------------------------------
async def test_a_commit_that_skips_the_generation_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused-holder races against a ledger whose commit checks nothing on
    the generation item: the stale holder's commits land, the checker says so."""
    monkeypatch.setattr(commits, "Check", lambda key, expect: Check(key, Expect()))
    async with running(MemoryStorage(), ledger_janitor=False) as srv, srv.client(timeout=10.0) as client:
        w = Workload(client, History(), seed=5)
        races = await w.open_sessions("race", 2)
        await BoundedLoad(max_steps=20, max_seconds=20).run([w.race_worker(sid, f"race{i}")
                                                              for i, sid in enumerate(races)])
        state, _ = await read_back(client, w.history)
    found = {v.check for v in check_ledger(w.history, state).violations}
    assert "ledger.fencing" in found, found


async def test_the_same_races_pass_on_the_real_commit() -> None:
    async with running(MemoryStorage(), ledger_janitor=False) as srv, srv.client(timeout=10.0) as client:
        w = Workload(client, History(), seed=5)
        races = await w.open_sessions("race", 2)
        await BoundedLoad(max_steps=20, max_seconds=20).run([w.race_worker(sid, f"race{i}")
                                                              for i, sid in enumerate(races)])
        state, _ = await read_back(client, w.history)
    assert check_ledger(w.history, state).violations == []
    assert w.races == 20


# -- the fault wrapper at a chosen step -------------------------------------------------
async def test_a_chosen_step_gets_the_chosen_fault() -> None:
    faulty = FaultyStorage(MemoryStorage(), seed=1, fail=0, timeout=0, lose=0, schedule={1: "lose", 2: "fail"})
    await faulty.put("a", b"1")
    with pytest.raises(Exception, match="lost response"):
        await faulty.put_if_absent("b", b"2")  # applied, response lost
    with pytest.raises(Exception, match="failure before"):
        await faulty.get("b")
    assert (await faulty.get("b")) is not None
    assert faulty.injected == {"lose": 1, "fail": 1}
    assert faulty.injected_by_call == {("lose", "put_if_absent"): 1, ("fail", "get"): 1}
