"""The memory rules as pure functions: no storage, no server."""

from __future__ import annotations

import math
import unicodedata
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencepost_server.domain.errors import InvalidArgument
from fencepost_server.domain.memory import ranking, rules
from fencepost_server.domain.memory.fold import Fold, entry_record
from fencepost_server.domain.memory.rules import Entry


def E(eid: str, at: int = 0, content: str = "x", **kw: object) -> Entry:
    return Entry(id=eid, content=content, created_at=at, **kw)  # type: ignore[arg-type]


# -- caps --------------------------------------------------------------------------
def test_content_cap_counts_utf8_bytes() -> None:
    rules.check_content("é" * 2048)  # 4096 bytes: at the cap
    with pytest.raises(InvalidArgument) as err:
        rules.check_content("é" * 2048 + "a")
    assert err.value.reason == "CONTENT_TOO_LARGE"
    assert err.value.metadata == {"limit": "4096", "size": "4097"}


def test_about_caps_keys_and_bytes() -> None:
    rules.check_about([f"k{i}" for i in range(12)])
    with pytest.raises(InvalidArgument) as err:
        rules.check_about([f"k{i}" for i in range(13)])
    assert err.value.reason == "ABOUT_TOO_LARGE" and err.value.metadata["limit"] == "12"
    rules.check_about(["a" * 512])
    with pytest.raises(InvalidArgument) as err:
        rules.check_about(["a" * 256, "b" * 257])
    assert err.value.reason == "ABOUT_TOO_LARGE" and err.value.metadata["size"] == "513"


def test_about_cleaning() -> None:
    assert rules.clean_about(["  Deploy ", "", "   ", "deploy", "DEPLOY", "db", "Db "]) == ("Deploy", "db")
    assert rules.clean_about("deploy") == ()  # malformed: contributes nothing
    assert rules.clean_about(["ok", 3, None]) == ("ok",)


@given(st.lists(st.text(max_size=8), max_size=20))
def test_about_cleaning_properties(keys: list[str]) -> None:
    cleaned = rules.clean_about(keys)
    folded = [k.casefold() for k in cleaned]
    assert len(set(folded)) == len(folded)
    assert all(k and k == k.strip() for k in cleaned)
    assert rules.clean_about(list(cleaned)) == cleaned  # idempotent
    # first spelling kept: each cleaned key is the first input with that folding
    for k in cleaned:
        first = next(x.strip() for x in keys if x.strip().casefold() == k.casefold())
        assert k == first


# -- tokenizer --------------------------------------------------------------------
def test_tokenizer_nfc_casefold_unicode() -> None:
    assert rules.tokenize("Straße, CAFÉ-au-lait! 42x") == ["strasse", "café", "au", "lait", "42x"]
    decomposed = unicodedata.normalize("NFD", "Café")
    assert rules.tokenize(decomposed) == rules.tokenize("café")
    assert rules.tokenize("日本語 テキスト") == ["日本語", "テキスト"]
    assert rules.tokenize("snake_case") == ["snake", "case"]
    assert rules.tokenize("?!... -- ;") == []


def test_punctuation_only_query_matches_nothing() -> None:
    entry = E("a", content="anything at all ...")
    assert not rules.query_matches(entry, rules.tokenize("..."))
    assert not rules.query_matches(entry, [])


def test_query_matches_whole_tokens_of_content_or_about() -> None:
    entry = E("a", content="it now uses Postgres", about=("deploy pipeline",))
    assert rules.query_matches(entry, rules.tokenize("DEPLOY postgres"))
    assert not rules.query_matches(entry, rules.tokenize("post"))  # not a whole token
    assert not rules.query_matches(entry, rules.tokenize("deploy mysql"))  # every token must match


@given(st.text(max_size=40))
def test_tokens_are_normalized_alnum(text: str) -> None:
    for token in rules.tokenize(text):
        assert token and token == unicodedata.normalize("NFC", token)
        assert all(ch.isalnum() for ch in token)
        assert rules.tokenize(token) == [token]


@given(st.text(max_size=30), st.text(max_size=30))
def test_entry_matches_every_token_of_its_own_content(content: str, about: str) -> None:
    entry = E("a", content=content, about=rules.clean_about([about]))
    tokens = rules.tokenize(content)
    assert rules.query_matches(entry, tokens) == bool(tokens)


# -- order -------------------------------------------------------------------------
def test_recall_order_newest_first_ties_by_id() -> None:
    entries = [E("b", 5), E("a", 5), E("c", 9), E("d", 1)]
    assert [e.id for e in sorted(entries, key=rules.recall_key)] == ["c", "a", "b", "d"]
    assert [e.id for e in sorted(entries, key=rules.chronology_key)] == ["d", "a", "b", "c"]


# -- validity and supersession ----------------------------------------------------------
def test_validity_bounds_inclusive_from_exclusive_until() -> None:
    e = E("a", valid_from=10, valid_until=20)
    assert rules.validity_at(e, 9) == rules.NOT_YET_VALID
    assert rules.validity_at(e, 10) == rules.CURRENT
    assert rules.validity_at(e, 19) == rules.CURRENT
    assert rules.validity_at(e, 20) == rules.EXPIRED
    assert rules.validity_at(E("open"), -(10**15)) == rules.CURRENT


@given(st.one_of(st.none(), st.integers(-100, 100)), st.one_of(st.none(), st.integers(-100, 100)),
       st.integers(-150, 150))
def test_validity_is_one_rule(vf: int | None, vu: int | None, at: int) -> None:
    got = rules.validity_at(E("a", valid_from=vf, valid_until=vu), at)
    expected = (
        rules.NOT_YET_VALID if vf is not None and at < vf
        else rules.EXPIRED if vu is not None and at >= vu else rules.CURRENT
    )
    assert got == expected


def test_future_successor_does_not_retire_until_it_is_current() -> None:
    old, new = E("old", 1), E("new", 2, supersedes="old", valid_from=100)
    assert rules.superseded_at([old, new], 99) == set()
    assert rules.superseded_at([old, new], 100) == {"old"}


def test_expired_successor_retires_nothing() -> None:
    old, new = E("old", 1), E("new", 2, supersedes="old", valid_until=50)
    assert rules.superseded_at([old, new], 49) == {"old"}
    assert rules.superseded_at([old, new], 50) == set()


def test_two_successors_both_retire_and_forgetting_one_keeps_it_retired() -> None:
    old, s1, s2 = E("old", 1), E("s1", 2, supersedes="old"), E("s2", 3, supersedes="old")
    assert rules.superseded_at([old, s1, s2], 5) == {"old"}
    assert rules.superseded_at([old, s2], 5) == {"old"}  # s1 forgotten: s2 still retires it
    assert rules.superseded_at([old], 5) == set()  # both forgotten: released


# -- pins ---------------------------------------------------------------------------------
def test_pin_budget_is_a_prefix_rule_in_append_order() -> None:
    sizes = {"a": 1000, "b": 1000, "c": 100, "d": 10}
    budget = rules.apply_pin_budget(["a", "b", "c", "d"], sizes.get)
    assert budget.effective == ("a", "b") and budget.inert == ("c", "d") and budget.bytes == 2000
    # unknown / tombstoned ids hold nothing
    budget = rules.apply_pin_budget(["x", "a", "c"], sizes.get)
    assert budget.effective == ("a", "c") and budget.bytes == 1100


@given(st.lists(st.tuples(st.sampled_from("abcdefghij"), st.integers(0, 2100)), max_size=12, unique_by=lambda t: t[0]))
def test_pin_budget_properties(pins: list[tuple[str, int]]) -> None:
    sizes = dict(pins)
    order = [p for p, _ in pins]
    budget = rules.apply_pin_budget(order, sizes.get)
    assert budget.bytes == sum(sizes[p] for p in budget.effective) <= rules.PINNED_MAX_BYTES
    assert list(budget.effective) + list(budget.inert) == order  # a prefix, then the rest
    if budget.inert:
        assert budget.bytes + sizes[budget.inert[0]] > rules.PINNED_MAX_BYTES


def test_decide_pin_refusals_and_repin() -> None:
    full = rules.PinBudget(("a",), (), 2000)
    d = rules.decide_pin(full, "b", 100)
    assert not d.pinned and not d.record and "2048-byte cap" in d.reason
    assert rules.decide_pin(full, "a", 2000) == rules.PinDecision(True, False)  # re-pin: no record, no move
    blocked = rules.PinBudget(("a",), ("big",), 10)
    d = rules.decide_pin(blocked, "tiny", 1)
    assert not d.pinned and d.blocking_id == "big" and "big" in d.reason
    assert rules.decide_pin(rules.PinBudget((), (), 0), "a", 2048) == rules.PinDecision(True, True)


def test_fold_repin_does_not_move_and_unpin_then_pin_goes_last() -> None:
    f = Fold()
    for i, eid in enumerate(["a", "b"], start=1):
        f.apply(i, entry_record(E(eid, i)))
    for pos, rec in enumerate(
        [{"t": "p", "id": "a"}, {"t": "p", "id": "b"}, {"t": "p", "id": "a"}], start=3
    ):
        f.apply(pos, rec)
    assert list(f.pins) == ["a", "b"]
    f.apply(6, {"t": "u", "id": "a"})
    f.apply(7, {"t": "p", "id": "a"})
    assert list(f.pins) == ["b", "a"]
    f.apply(7, {"t": "u", "id": "a"})  # a position already applied is ignored
    assert list(f.pins) == ["b", "a"]


def test_fold_tolerates_bad_records() -> None:
    f = Fold()
    f.apply(1, None)
    f.apply(2, {"t": "e", "id": "a", "c": "ok", "at": 1, "a": "not-a-list", "k": "bogus", "tr": 7})
    f.apply(3, {"t": "e", "id": "b"})  # missing required fields: skipped
    f.apply(4, {"t": "f", "id": "nope"})
    assert list(f.entries) == ["a"] and f.head == 4
    assert f.entries["a"].about == () and f.entries["a"].kind is None and f.entries["a"].trust_label == "unknown"


# -- topics and injection ------------------------------------------------------------
def test_topics_order_first_spelling_and_least_trust() -> None:
    entries = [
        E("1", 1, about=("Deploy",), trust="own"),
        E("2", 2, about=("deploy", "db"), trust="external"),
        E("3", 3, about=("DB",), trust="operator"),
        E("4", 4, about=("alpha",)),
    ]
    topics = rules.collect_topics(entries)
    assert [(t.name, t.count, t.last_updated_at, t.trust) for t in topics] == [
        ("Deploy", 2, 2, "external"),
        ("db", 2, 3, "external"),
        ("alpha", 1, 4, "unknown"),
    ]


@given(st.lists(st.tuples(st.integers(1, 1500), st.booleans()), max_size=30), st.integers(0, 120))
def test_injection_blocks_disjoint_and_within_budget(spec: list[tuple[int, bool]], n_topics: int) -> None:
    entries = [E(f"e{i}", i, content="x" * size) for i, (size, _) in enumerate(spec)]
    budget = rules.apply_pin_budget([e.id for e, (_, p) in zip(entries, spec) if p],
                                    {e.id: e.content_bytes for e in entries}.get)
    pinned = [e for e in entries if e.id in budget.effective]
    topics = [rules.Topic(f"topic number {i}", 1, i, "own") for i in range(n_topics)]
    inj = rules.select_injection(pinned, topics, entries)
    assert [e.id for e in inj.pinned] == [e.id for e in pinned]  # never pushed out
    assert sum(e.content_bytes for e in inj.pinned) <= rules.PINNED_MAX_BYTES
    assert {e.id for e in inj.pinned}.isdisjoint(e.id for e in inj.recent)
    assert len(inj.recent) <= rules.RECENT_MAX_ENTRIES
    assert sum(e.content_bytes for e in inj.recent) <= rules.RECENT_MAX_BYTES
    assert len(inj.topics_text.encode()) <= rules.TOPICS_MAX_BYTES
    assert inj.topics == topics[: len(inj.topics)]
    assert [e.created_at for e in inj.recent] == sorted(e.created_at for e in inj.recent)
    # the tail is the newest unpinned entries
    unpinned = [e for e in entries if e.id not in budget.effective]
    assert inj.recent == unpinned[len(unpinned) - len(inj.recent):]


def test_bounded_list_is_newest_presented_oldest_first() -> None:
    chrono = [E(str(i), i, content="x" * 5000 if i == 1 else "y") for i in range(5)]
    assert [e.id for e in rules.bound_newest(chrono, 3)[0]] == ["2", "3", "4"]
    picked, truncated = rules.bound_newest(chrono, 10, max_bytes=5002)
    assert [e.id for e in picked] == ["2", "3", "4"] and truncated


def test_mint_skips_taken_ids() -> None:
    taken = {"mem-3", "mem-4"}
    assert rules.mint_id(3, taken.__contains__) == ("mem-5", 6)
    assert rules.minted_number("mem-12") == 12 and rules.minted_number("mem-x") is None
    assert rules.minted_number("mem-" + "9" * 19) == 10**19 - 1
    assert rules.minted_number("mem-" + "9" * 4001) is None  # longer than any id a mint reaches


def test_search_limit_and_strategy() -> None:
    assert rules.clamp_search_limit(0) == 10 and rules.clamp_search_limit(-3) == 10
    assert rules.clamp_search_limit(500) == 50 and rules.clamp_search_limit(7) == 7
    assert rules.applied_strategy("relevance") == "relevance" and rules.applied_strategy("hybrid") == "hybrid"
    assert rules.applied_strategy(None) == "recency" and rules.applied_strategy("semantic") == "recency"


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("e"), st.integers(0, 7), st.integers(0, 50), st.one_of(st.none(), st.integers(0, 7)),
                  st.one_of(st.none(), st.integers(0, 60))),
        st.tuples(st.sampled_from(["f", "p", "u"]), st.integers(0, 7)),
    ),
    max_size=30,
)


def _record(op: tuple) -> dict:  # type: ignore[type-arg]
    if op[0] == "e":
        _, n, at, sup, vf = op
        return entry_record(E(f"id{n}", at, content="w" * (n * 300), supersedes=f"id{sup}" if sup is not None else None,
                              valid_from=vf, about=(f"t{n % 3}",)))
    return {"t": op[0], "id": f"id{op[1]}"}


@given(_ops, st.integers(0, 30), st.integers(0, 70))
def test_incremental_fold_equals_replay(ops: list, split: int, at: int) -> None:  # type: ignore[type-arg]
    """A cached fold that applied the lane in two steps (reading in between)
    reads exactly like a fold that replayed it in one go."""
    records = [_record(op) for op in ops]
    warm, cold = Fold(), Fold()
    for pos, rec in enumerate(records[:split], start=1):
        warm.apply(pos, rec)
    warm.view(at), warm.pin_budget(), warm.all_chrono()
    for pos, rec in enumerate(records[split:], start=split + 1):
        warm.apply(pos, rec)
    for pos, rec in enumerate(records, start=1):
        cold.apply(pos, rec)
    vw, vc = warm.view(at), cold.view(at)
    assert [e.id for e in vw.live_chrono] == [e.id for e in vc.live_chrono]
    assert [e.id for e in vw.current_chrono] == [e.id for e in vc.current_chrono]
    assert vw.superseded == vc.superseded and vw.topics == vc.topics
    assert warm.pin_budget() == cold.pin_budget()
    assert [e.id for e in warm.all_chrono()] == [e.id for e in cold.all_chrono()]
    assert warm.search_candidates(["t1"]) == cold.search_candidates(["t1"])


def test_bm25_is_the_okapi_formula() -> None:
    class Corpus:
        def terms(self, entry_id: str) -> ranking.Terms:
            raise AssertionError

        def doc_freq(self, token: str) -> int:
            return {"rare": 1, "common": 8}[token]

        def size(self) -> int:
            return 10

        def average_length(self) -> float:
            return 4.0

    entry = ranking.Terms(Counter({"rare": 2, "common": 1, "pad": 3}), 6)
    norm = 1.2 * (1 - 0.75 + 0.75 * 6 / 4)  # k1 = 1.2, b = 0.75
    expected = (math.log(1 + (10 - 1 + 0.5) / (1 + 0.5)) * 2 * 2.2 / (2 + norm)
                + math.log(1 + (10 - 8 + 0.5) / (8 + 0.5)) * 1 * 2.2 / (1 + norm))
    assert ranking.bm25(entry, ["rare", "common", "rare"], Corpus()) == pytest.approx(expected)
    assert ranking.bm25(entry, ["absent"], Corpus()) == 0.0
