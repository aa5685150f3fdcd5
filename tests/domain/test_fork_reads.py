"""Fork reads at every boundary: from_seq / limit around seed_length and the head."""

from __future__ import annotations

import dataclasses

from fencepost_server.domain.ledger import Ledger, LedgerConfig
from fencepost_server.storage import Storage

T = "tenant"


async def _log(ledger: Ledger, sid: str, start: int = 1, limit: int = 0) -> list[tuple[int, bytes]]:
    return [r for page in [p async for p in ledger.read_log(T, sid, start, limit)] for r in page]


async def test_fork_reads_match_a_model_at_every_boundary(storage: Storage) -> None:
    ledger = Ledger(storage, config=LedgerConfig(read_page=2))
    view, _ = await ledger.open(T, "agent", "p")
    parent = view.session_id
    g = (await ledger.acquire(T, parent, "A", ttl=60)).generation
    await ledger.commit(T, parent, g, 0, [b"p%d" % i for i in range(1, 6)])
    model: dict[str, list[bytes]] = {parent: [b"p%d" % i for i in range(1, 6)]}
    child = (await ledger.fork(T, parent, 3, "c")).session_id
    model[child] = model[parent][:3]
    gc = (await ledger.acquire(T, child, "B", ttl=60)).generation
    await ledger.commit(T, child, gc, 3, [b"c%d" % i for i in range(4, 8)])
    model[child] += [b"c%d" % i for i in range(4, 8)]
    await ledger.commit(T, parent, g, 5, [b"p%d" % i for i in range(6, 9)])
    model[parent] += [b"p%d" % i for i in range(6, 9)]
    forks = {}
    for at in (0, 1, 2, 3, 4, 7):
        sid = (await ledger.fork(T, child, at, f"gc{at}")).session_id
        forks[at] = sid
        model[sid] = model[child][:at]
    at0 = (await ledger.fork(T, parent, 0, "zero")).session_id
    model[at0] = []
    athead = (await ledger.fork(T, parent, 8, "head")).session_id
    model[athead] = list(model[parent])
    for sid, recs in model.items():
        expect = list(enumerate(recs, 1))
        for start in range(0, len(recs) + 3):
            for limit in range(0, len(recs) + 3):
                want = [r for r in expect if r[0] >= max(start, 1)]
                if limit:
                    want = want[:limit]
                got = await _log(ledger, sid, start, limit)
                assert got == want, (sid, start, limit)
    listed, _ = await ledger.list_sessions(T, "agent")
    sizes = {s.session_id: s.total_bytes for s in listed}
    for sid, recs in model.items():
        assert sizes[sid] == sum(map(len, recs)), sid
    # every fork commits at its seed_length; sizes and reads follow
    for sid in [*forks.values(), at0, athead]:
        gen = (await ledger.acquire(T, sid, "W", ttl=60)).generation
        n = len(model[sid])
        await ledger.commit(T, sid, gen, n, [b"own" + sid[:3].encode()])
        model[sid].append(b"own" + sid[:3].encode())
        fork2 = (await ledger.fork(T, sid, n + 1, "x" + sid)).session_id
        model[fork2] = list(model[sid])
    listed, _ = await ledger.list_sessions(T, "agent")
    sizes = {s.session_id: s.total_bytes for s in listed}
    for sid, recs in model.items():
        assert await _log(ledger, sid) == list(enumerate(recs, 1))
        assert sizes[sid] == sum(map(len, recs)), sid


async def test_fork_reads_split_by_bytes_at_the_budget(storage: Storage) -> None:
    from fencepost_server.domain.limits import Limits

    budget = 300
    ledger = Ledger(storage, limits=Limits(max_page_bytes=budget), config=LedgerConfig(read_page=4))
    view, _ = await ledger.open(T, "agent", "p")
    parent = view.session_id
    g = (await ledger.acquire(T, parent, "A", ttl=60)).generation
    sizes = [86, 86, 86, 236, 237, 1, 400, 85, 86]  # 86 + 64 overhead: two fill the budget exactly
    recs = [bytes([65 + i]) * n for i, n in enumerate(sizes)]
    await ledger.commit(T, parent, g, 0, recs[:5])
    child = (await ledger.fork(T, parent, 5, "c")).session_id
    gc = (await ledger.acquire(T, child, "B", ttl=60)).generation
    await ledger.commit(T, child, gc, 5, recs[5:])
    for start in range(0, 11):
        for limit in range(0, 11):
            parts = [p async for p in ledger.read_log(T, child, start, limit)]
            flat = [r for p in parts for r in p]
            want = [(i + 1, r) for i, r in enumerate(recs) if i + 1 >= max(start, 1)]
            assert flat == (want[:limit] if limit else want)
            for p in parts:
                assert p and (len(p) == 1 or sum(len(d) + 64 for _, d in p) <= budget), [len(d) for _, d in p]


async def test_a_fork_deleted_as_its_read_starts_is_the_session_not_found(storage: Storage) -> None:
    """The tree goes between the fork's meta read and its parent's: the
    refusal names the session asked for, not its parent."""
    import pytest

    from fencepost_server.domain.errors import NotFound

    ledger = Ledger(storage)
    view, _ = await ledger.open(T, "agent", "p")
    parent = view.session_id
    g = (await ledger.acquire(T, parent, "A", ttl=60)).generation
    await ledger.commit(T, parent, g, 0, [b"p1", b"p2"])
    child = (await ledger.fork(T, parent, 2, "c")).session_id
    parent_meta = ledger.keys(T, parent).meta
    inner_get, armed = storage.get, [True]

    async def get(key: str):  # type: ignore[no-untyped-def]
        if key == parent_meta and armed[0]:
            armed[0] = False
            await ledger.delete_session(T, parent, descendants=True, force=True)
        return await inner_get(key)

    storage.get = get  # type: ignore[method-assign]
    with pytest.raises(NotFound) as exc:
        await _log(ledger, child)
    assert not armed[0]
    assert exc.value.metadata["session_id"] == child
