"""The ledger's hot-path encodings are spelled out (activity.py, layout.py):
they are the canonical ones byte for byte. And the superseded entries a
session keeps stay bounded and derivable from its act/ item."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fencepost_server.domain.ledger import Ledger, LedgerConfig
from fencepost_server.domain.ledger.activity import MAX_KEPT, Activity
from fencepost_server.domain.ledger.layout import (
    LeaseState,
    agent_root,
    decode_event,
    dumps,
    encode_event,
    encode_inline_event,
    index_prefix,
    new_session_id,
)
from fencepost_server.storage.memory import MemoryStorage

T = "tenant"
A = "agent"

_ints = st.integers(min_value=0, max_value=10**17)


def _reference_act(a: Activity) -> bytes:
    d: dict[str, object] = {"t": a.micros / 1e6, "u": a.micros, "s": a.seq}
    if a.size is not None:
        d["b"] = a.size
    if a.key is not None:
        d["k"] = a.key
    if a.kept:
        d["p"] = list(a.kept)
    if a.owed:
        d["w"] = {"s": a.owed[0], "b": a.owed[1], "u": a.owed[2]}
    return dumps(d)


def _reference_entry(a: Activity, superseded_at: int | None) -> bytes:
    d: dict[str, object] = {"s": a.seq}
    if a.size is not None:
        d["b"] = a.size
    if a.key is not None:
        d["k"] = a.key
    if superseded_at is not None:
        d["n"] = superseded_at
    return dumps(d)


@given(
    micros=_ints, seq=_ints, size=st.none() | _ints, key=st.none() | st.text(max_size=40),
    kept=st.lists(_ints, max_size=5).map(tuple), owed=st.none() | st.tuples(_ints, _ints, _ints),
    superseded=st.none() | _ints,
)
def test_encodings_are_the_canonical_dumps(
    micros: int, seq: int, size: int | None, key: str | None, kept: tuple[int, ...],
    owed: tuple[int, int, int] | None, superseded: int | None,
) -> None:
    a = Activity(micros, seq, size, key, kept, owed)
    assert a.act_value() == _reference_act(a)
    assert a.entry_value(superseded) == _reference_entry(a, superseded)
    assert Activity.decode(a.act_value()) == a


@given(
    kept=st.lists(st.integers(min_value=1, max_value=10**6), max_size=MAX_KEPT + 3, unique=True).map(sorted),
    horizon=st.sampled_from([0.0, 0.0001, 300.0]),
    steps=st.lists(st.tuples(st.integers(min_value=0, max_value=300), st.integers(min_value=-1, max_value=4)),
                   min_size=1, max_size=80),
)
def test_advancing_activity_writes_the_canonical_act_value(
    kept: list[int], horizon: float, steps: list[tuple[int, int]]
) -> None:
    """advance_writes cuts the kept list's text from the previous one (not
    formatted anew): the value it writes is still the canonical dumps, step
    after step, whatever it drops (expired, past MAX_KEPT, or every entry)."""
    now = [0.0]
    ledger = Ledger(MemoryStorage(), clock=lambda: now[0], config=LedgerConfig(listing_horizon=horizon))
    sk = ledger.keys(T, new_session_id(A))
    old = Activity((kept[-1] if kept else 0) + 1, 0, 0, "k", tuple(kept))
    value = old.act_value()
    for elapsed_micros, room in steps:
        now[0] += elapsed_micros / 1e6
        _, new_value, new = ledger.advance_writes(sk, value, old, old.seq + 1, 7, room)
        assert new_value == _reference_act(new)
        assert new.kept_text in (None, ",".join(map(str, new.kept)))
        assert Activity.decode(new_value) == new
        old, value = new, new_value


_times = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@given(holder=st.text(max_size=40), generation=_ints, expires=_times, released=st.booleans())
def test_lease_encoding_is_the_canonical_dumps(holder: str, generation: int, expires: float, released: bool) -> None:
    lease = LeaseState(holder, generation, expires, released)
    assert lease.encode() == dumps({"h": holder, "g": generation, "e": expires, "r": released})
    assert LeaseState.decode(lease.encode()) == lease


@given(dedupe=st.text(max_size=40), delivered=_times, payload=st.binary(max_size=50))
def test_inline_event_encoding_is_the_canonical_one(dedupe: str, delivered: float, payload: bytes) -> None:
    value = encode_inline_event(dedupe, delivered, payload)
    assert value == encode_event({"d": dedupe, "t": delivered}, payload)
    assert decode_event(value) == ({"d": dedupe, "t": delivered}, payload)


async def test_a_session_committing_fast_keeps_at_most_max_kept_superseded_entries() -> None:
    storage = MemoryStorage()
    now = [1_700_000_000.0]
    ledger = Ledger(storage, clock=lambda: now[0], config=LedgerConfig(listing_horizon=3600.0))
    view, _ = await ledger.open(T, A, "s")
    sid = view.session_id
    g = (await ledger.acquire(T, sid, "h", ttl=3600)).generation
    sk = ledger.keys(T, sid)
    prefix = index_prefix(agent_root(T, A))
    for seq in range(MAX_KEPT + 5):
        await ledger.commit(T, sid, g, seq, [b"r"], commit_id=f"c{seq}")
        now[0] += 0.001
        entries = {k for k in await storage.list_keys(prefix, None, 1000) if k.endswith(sid)}
        act = await storage.get(sk.act)
        assert act is not None and set(sk.listing_keys(act.value)) == entries
        assert len(entries) == min(seq + 2, MAX_KEPT + 1)  # the current entry and the kept ones
    # a second process (nothing remembered) continues from the stored act/ item
    other = Ledger(storage, clock=lambda: now[0], config=LedgerConfig(listing_horizon=3600.0))
    assert (await other.commit(T, sid, g, MAX_KEPT + 5, [b"r"])).seq == MAX_KEPT + 6
    now[0] += 0.001  # a listing sees the activity before its start
    page, _ = await other.list_sessions(T, A)
    assert [(s.session_id, s.seq, s.total_bytes) for s in page] == [(sid, MAX_KEPT + 6, MAX_KEPT + 6)]
