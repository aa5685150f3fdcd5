"""The schedule/change v1 decoder and fold, as properties (no storage)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost_server.domain.schedule import Create, Delete, Dispatch, RecordError, decode, encode, fold
from fencepost_server.domain.schedule.records import MAX_AFTER_SECONDS, Fold, js_trim

FAST = settings(max_examples=60, deadline=None)

prompts = st.text(min_size=1, max_size=20).map(js_trim).filter(bool)
afters = st.integers(1, MAX_AFTER_SECONDS)


def create(n: int, prompt: str = "p", after: int = 1, at: int = 0) -> bytes:
    return encode(Create(f"rem_{n}", prompt, after, at))


def envelope(record: dict[str, object]) -> bytes:
    return json.dumps({"stream": "schedule/change", "record": record}).encode()


def as_log(records: list[bytes]) -> list[tuple[int, bytes]]:
    return list(enumerate(records, start=1))


# A random history: ops on a model, with the expected active set alongside.
ops = st.lists(
    st.tuples(st.sampled_from(["create", "delete", "dispatch", "other"]), st.integers(0, 30)), max_size=40
)


def build(history: list[tuple[str, int]]) -> tuple[list[bytes], dict[str, int], int]:
    """Valid records only (what the server writes): the log, the active ids
    (id -> create seq) and the number of creates."""
    log: list[bytes] = []
    active: dict[str, int] = {}
    created = 0
    for op, pick in history:
        if op == "create":
            created += 1
            log.append(create(created, f"p{created}"))
            active[f"rem_{created}"] = len(log)
        elif op == "other":
            log.append(b'{"stream":"chat/turn","text":"rem_1 schedule/change"}' if pick % 2 else b"\x00binary")
        elif active:
            rid = sorted(active)[pick % len(active)]
            log.append(encode(Delete(rid) if op == "delete" else Dispatch(rid)))
            del active[rid]
    return log, active, created


@FAST
@given(ops)
def test_fold_matches_the_model_and_skips_other_records(history: list[tuple[str, int]]) -> None:
    log, active, created = build(history)
    f = fold(as_log(log))
    assert {r.id: r.seq for r in f.reminders()} == active
    assert f.rejected == ()
    assert f.next_id() == f"rem_{created + 1}"


@FAST
@given(ops, st.data())
def test_incremental_fold_equals_whole_fold(history: list[tuple[str, int]], data: st.DataObject) -> None:
    log = as_log(build(history)[0])
    cut = data.draw(st.integers(0, len(log)))
    assert Fold().apply(log[:cut]).apply(log[cut:]).active == fold(log).active


@FAST
@given(st.one_of(st.integers().filter(lambda v: v != 1), st.just(True), st.just(1.0), st.just("1"), st.none()),
       st.sampled_from(["create", "delete", "dispatch"]))
def test_unknown_version_is_rejected(v: object, kind: str) -> None:
    record: dict[str, object] = json.loads(encode(Create("rem_1", "p", 1, 0)))["record"]
    if kind != "create":
        record = {"type": kind, "id": "rem_1"}
    record["v"] = v
    with pytest.raises(RecordError):
        decode(json.loads(envelope(record)))
    log = [create(1), envelope(record)] if kind != "create" else [envelope(record)]
    f = fold(as_log(log))
    assert len(f.rejected) == 1 and f.rejected[0].seq == len(log)
    assert [r.id for r in f.reminders()] == (["rem_1"] if kind != "create" else [])


@FAST
@given(st.sampled_from(["create", "delete", "dispatch"]),
       st.text(min_size=1, max_size=10).filter(lambda k: k not in {"v", "type", "id", "kind", "prompt",
                                                                   "after_seconds", "scheduled_at"}),
       st.one_of(st.none(), st.integers(), st.text(max_size=5)))
def test_extra_field_is_rejected(kind: str, key: str, value: object) -> None:
    good = json.loads(create(1) if kind == "create" else encode(Delete("rem_1")))
    good["record"]["type"] = kind
    good["record"][key] = value
    with pytest.raises(RecordError):
        decode(good)
    # an extra envelope field is refused too
    env = json.loads(create(1))
    env[key if key not in ("stream", "record") else key + "_"] = value
    with pytest.raises(RecordError):
        decode(env)


@FAST
@given(st.sampled_from(["v", "type", "id", "kind", "prompt", "after_seconds", "scheduled_at"]))
def test_missing_field_is_rejected(key: str) -> None:
    env = json.loads(create(1))
    del env["record"][key]
    with pytest.raises(RecordError):
        decode(env)


@FAST
@given(st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_AFTER_SECONDS + 1), st.just(True),
                 st.floats(allow_nan=False), st.text(max_size=3)),
       )
def test_after_seconds_must_be_one_positive_safe_integer(after: object) -> None:
    env = json.loads(create(1))
    env["record"]["after_seconds"] = after
    with pytest.raises(RecordError):
        decode(env)


@FAST
@given(ops, st.integers(1, 30), prompts, afters)
def test_reused_id_is_rejected(history: list[tuple[str, int]], pick: int, prompt: str, after: int) -> None:
    log, active, created = build([("create", 0), *history])
    reused = 1 + pick % created
    before = fold(as_log(log))
    after_fold = fold(as_log([*log, create(reused, prompt, after)]))
    assert after_fold.active == before.active  # nothing changed ...
    assert [r.seq for r in after_fold.rejected] == [len(log) + 1]  # ... and it is reported
    assert "reuses" in after_fold.rejected[0].reason


@FAST
@given(ops, st.sampled_from([Delete, Dispatch]), st.integers(1, 40))
def test_transition_of_an_inactive_id_is_rejected(history: list[tuple[str, int]], cls: type, n: int) -> None:
    log, active, _ = build(history)
    rid = f"rem_{n}"
    if rid in active:
        rid = f"rem_{n + 1000}"
    f = fold(as_log([*log, encode(cls(rid))]))
    assert {r.id for r in f.reminders()} == set(active)
    assert [r.seq for r in f.rejected] == [len(log) + 1]


@FAST
@given(ops, st.data())
def test_fork_folds_only_events_after_its_seed_length(history: list[tuple[str, int]], data: st.DataObject) -> None:
    parent, _, created = build(history)
    seed = data.draw(st.integers(0, len(parent)))
    suffix = [op for op in data.draw(ops) if op[0] != "create"] + [("create", 0)]
    # the child's own records: creates continue the numbering the prefix used
    prefix_fold = fold(as_log(parent[:seed]))
    child_log = list(parent[:seed])
    n = prefix_fold.max_id
    mine: set[str] = set()
    for op, pick in suffix:
        if op == "create":
            n += 1
            child_log.append(create(n))
            mine.add(f"rem_{n}")
        elif op in ("delete", "dispatch") and mine:
            rid = sorted(mine)[pick % len(mine)]
            child_log.append(encode(Delete(rid) if op == "delete" else Dispatch(rid)))
            mine.discard(rid)
    child = fold(as_log(child_log), seed_length=seed)
    assert {r.id for r in child.reminders()} == mine  # no parent reminder is active in the child
    assert all(r.seq > seed for r in child.reminders())
    assert child.rejected == ()
    # a parent's reminder (active in the parent at the fork) cannot be ended in the child
    parent_active = [r.id for r in prefix_fold.reminders()]
    if parent_active:
        again = fold(as_log([*child_log, encode(Dispatch(parent_active[0]))]), seed_length=seed)
        assert len(again.rejected) == 1


@FAST
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 10)), max_size=30))
def test_ids_are_never_reused_after_delete(steps: list[tuple[bool, int]]) -> None:
    log: list[bytes] = []
    issued: list[str] = []
    for make, pick in steps:
        f = fold(as_log(log))
        if make or not f.active:
            rid = f.next_id()
            assert rid not in issued
            issued.append(rid)
            log.append(encode(Create(rid, "p", 1, 0)))
        else:
            victim = sorted(f.active)[pick % len(f.active)]
            log.append(encode(Delete(victim)))
    assert fold(as_log(log)).rejected == ()


@pytest.mark.parametrize("tag", [rb"schedule\/change", rb"\u0073chedule/change", rb"schedule\u002Fchange"])
def test_a_record_tagged_with_json_escapes_is_ours(tag: bytes) -> None:
    """A record is ours when it *parses* as an object whose stream is
    "schedule/change": a writer whose JSON escapes `/` (PHP's json_encode
    does by default) or any letter writes the same record. Skipped by a
    byte search for the plain tag, its dispatch was silently lost (the
    reminder stayed due) and a bad one was never reported."""
    dispatch = b'{"record":{"v":1,"type":"dispatch","id":"rem_1"},"stream":"' + tag + b'"}'
    f = fold(as_log([create(1), dispatch]))
    assert f.active == {} and f.rejected == ()
    bad = b'{"record":{"v":2,"type":"dispatch","id":"rem_1"},"stream":"' + tag + b'"}'
    f = fold(as_log([create(1), bad]))
    assert list(f.active) == ["rem_1"] and [r.seq for r in f.rejected] == [2]


def test_trimmed_means_what_javascript_trim_means() -> None:
    """The seed's runtime (TypeScript) trims with String.prototype.trim: it
    keeps U+001C..U+001F and U+0085 (Python's str.strip removes them) and
    removes U+FEFF (str.strip keeps it). A create it wrote with a prompt
    ending in U+0085 decodes; so does one this server wrote before, trimmed
    by str.strip (a leading U+FEFF); an untrimmed one does not."""
    f = fold(as_log([create(1, prompt="\x1fnote\x85"), create(2, prompt="\ufeffnote"), create(3, prompt=" note")]))
    assert [r.prompt for r in f.reminders()] == ["\x1fnote\x85", "\ufeffnote"]
    assert [r.seq for r in f.rejected] == [3]


def test_create_trims_as_javascript_does() -> None:
    from fencepost_server.domain.schedule.service import check_prompt

    assert check_prompt("\ufeff\u3000 note \x85\ufeff") == "note \x85"
    assert check_prompt("\x1c") == "\x1c"
