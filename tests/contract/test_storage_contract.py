"""The storage contract, run against every backend (see conftest.BACKENDS)."""

from __future__ import annotations

import asyncio

import pytest

from fencepost_server.storage import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    TXN_OP_OVERHEAD,
    Check,
    CountKeys,
    Delete,
    Expect,
    InvalidTransaction,
    Put,
    Storage,
    key_bytes,
)

UNICODE_KEYS = ["p/a", "p/b", "p/z", "p/é", "p/日本", "p/😀", "p/\u007f", "p/A", "p/ab", "p/a\u0001"]


async def test_get_miss_is_none(storage: Storage) -> None:
    assert await storage.get("nope") is None


async def test_put_get_roundtrip_binary(storage: Storage) -> None:
    value = bytes(range(256))
    version = await storage.put("k", value)
    item = await storage.get("k")
    assert item is not None and item.value == value and item.version == version


async def test_version_changes_on_every_plain_put(storage: Storage) -> None:
    seen = {await storage.put("k", b"same") for _ in range(5)}
    assert len(seen) == 5


async def test_delete_then_recreate_never_reuses_a_version(storage: Storage) -> None:
    seen: set[str] = set()
    for _ in range(5):
        seen.add(await storage.put("k", b"v"))
        assert await storage.delete("k") is True
        res = await storage.put_if_absent("k", b"v")
        assert res.applied and res.version not in seen
        seen.add(res.version)  # type: ignore[arg-type]
        assert await storage.delete("k") is True
    assert await storage.delete("k") is False


async def test_stale_version_cannot_write_after_recreate(storage: Storage) -> None:
    v1 = await storage.put("k", b"one")
    await storage.delete("k")
    await storage.put("k", b"two")
    res = await storage.put_if_version("k", b"three", v1)
    assert not res.applied
    assert (await storage.get("k")).value == b"two"  # type: ignore[union-attr]


async def test_put_if_absent(storage: Storage) -> None:
    first = await storage.put_if_absent("k", b"a")
    assert first.applied and first.version
    second = await storage.put_if_absent("k", b"b")
    assert not second.applied
    assert second.version == first.version
    assert second.current is not None and second.current.value == b"a"


async def test_put_if_version(storage: Storage) -> None:
    v1 = await storage.put("k", b"a")
    ok = await storage.put_if_version("k", b"b", v1)
    assert ok.applied and ok.version != v1
    stale = await storage.put_if_version("k", b"c", v1)
    assert not stale.applied and stale.version == ok.version
    assert stale.current is not None and stale.current.value == b"b"
    absent = await storage.put_if_version("missing", b"x", v1)
    assert not absent.applied and absent.version is None and absent.current is None
    assert await storage.get("missing") is None


async def test_delete_if_version(storage: Storage) -> None:
    v1 = await storage.put("k", b"a")
    v2 = await storage.put("k", b"b")
    stale = await storage.delete_if_version("k", v1)
    assert not stale.applied and stale.version == v2
    ok = await storage.delete_if_version("k", v2)
    assert ok.applied
    assert await storage.get("k") is None
    gone = await storage.delete_if_version("k", v2)
    assert not gone.applied and gone.version is None


async def test_list_is_utf8_byte_order_with_unicode_keys(storage: Storage) -> None:
    for key in UNICODE_KEYS:
        await storage.put(key, key.encode())
    await storage.put("q/outside", b"x")
    await storage.put("p", b"not-under-p/")
    expected = sorted(UNICODE_KEYS, key=lambda k: k.encode())
    items = await storage.list("p/", None, 1000)
    assert [i.key for i in items] == expected
    assert [i.value for i in items] == [k.encode() for k in expected]
    assert await storage.list_keys("p/", None, 1000) == expected


async def test_list_pages_neither_skip_nor_repeat(storage: Storage) -> None:
    keys = [f"pg/{i:03d}" for i in range(23)] + ["pg/é", "pg/😀"]
    for key in keys:
        await storage.put(key, b"v")
    got: list[str] = []
    after = None
    while True:
        page = await storage.list_keys("pg/", after, 4)
        got.extend(page)
        if len(page) < 4:
            break
        after = page[-1]
    assert got == sorted(keys, key=lambda k: k.encode())


async def test_list_versions_pairs_each_key_with_its_current_version(storage: Storage) -> None:
    """What an erasure's conditional deletes are built from: the same keys as
    list_keys, each with the version a get returns."""
    for i in range(5):
        await storage.put(f"lv/{i}", b"x" * 1000)
    await storage.put("lv/2", b"again")
    got = await storage.list_versions("lv/", "lv/0", 3)
    assert [k for k, _ in got] == await storage.list_keys("lv/", "lv/0", 3) == ["lv/1", "lv/2", "lv/3"]
    for key, version in got:
        item = await storage.get(key)
        assert item is not None and version == item.version


async def test_list_prefix_edge_cases(storage: Storage) -> None:
    await storage.put("a", b"1")
    await storage.put("ab", b"2")
    await storage.put("b", b"3")
    assert [i.key for i in await storage.list("a")] == ["a", "ab"]
    assert [i.key for i in await storage.list("")] == ["a", "ab", "b"]
    assert await storage.list_keys("a", "a") == ["ab"]
    assert await storage.list_keys("zz") == []
    # start_after before the prefix starts at the prefix
    assert await storage.list_keys("b", "a") == ["b"]


async def test_list_prefix_ending_just_below_the_surrogates(storage: Storage) -> None:
    """U+D7FF is a valid key character whose next code point (U+D800) is a
    surrogate, which has no UTF-8 form: the end of a prefix ending in it is
    U+E000. Listing it used to fail SQLite's range bound (INTERNAL)."""
    keys = ["p\ud7ff", "p\ud7ffx", "p\ud7ff\U0010ffff", "p\ue000", "p\ud7fe"]
    for key in keys:
        await storage.put(key, b"v")
    assert await storage.list_keys("p\ud7ff") == ["p\ud7ff", "p\ud7ffx", "p\ud7ff\U0010ffff"]
    assert [i.key for i in await storage.list("p\ud7ff", "p\ud7ffx")] == ["p\ud7ff\U0010ffff"]
    assert await storage.list_keys("p") == sorted(keys)


async def test_transact_all_or_nothing(storage: Storage) -> None:
    v = await storage.put("t/guard", b"g")
    res = await storage.transact(
        [Check("t/guard", Expect(version=v))],
        [Put("t/a", b"1"), Put("t/b", b"2", Expect(exists=False)), Delete("t/guard-other")],
    )
    assert res.applied and len(res.versions) == 3 and res.versions[2] is None
    # one failing condition: nothing at all is written
    res = await storage.transact(
        [],
        [Put("t/a", b"changed"), Put("t/b", b"x", Expect(exists=False)), Delete("t/guard", Expect(version=v))],
    )
    assert not res.applied and res.failed == (1,)
    assert (await storage.get("t/a")).value == b"1"  # type: ignore[union-attr]
    assert (await storage.get("t/guard")) is not None


async def test_transact_value_and_absence_conditions(storage: Storage) -> None:
    await storage.put("t/gen", b"7")
    ok = await storage.transact([Check("t/gen", Expect(value=b"7")), Check("t/none", Expect(exists=False))],
                                [Put("t/x", b"1")])
    assert ok.applied
    bad = await storage.transact([Check("t/gen", Expect(value=b"8"))], [Put("t/x", b"2")])
    assert not bad.applied and bad.failed == (0,)
    assert (await storage.get("t/x")).value == b"1"  # type: ignore[union-attr]


async def test_transact_counts_a_prefix_as_its_writes_left_it(storage: Storage) -> None:
    for name in ("a", "b", "c"):
        await storage.put(f"in/{name}", b"")
    await storage.put("in-other", b"")  # shares the characters, not the prefix
    res = await storage.transact(
        [], [Delete("in/a", Expect(exists=True)), Put("in/d", b""), Put("elsewhere", b"")], CountKeys("in/")
    )
    assert res.applied and res.count == 3  # b, c, d
    capped = await storage.transact([], [Put("in/e", b"")], CountKeys("in/", limit=2))
    assert capped.count == 2
    # checks only, and a prefix with nothing under it
    assert (await storage.transact([Check("in/b", Expect(exists=True))], [], CountKeys("in/"))).count == 4
    assert (await storage.transact([], [Put("x", b"")], CountKeys("none/"))).count == 0
    # not asked, or not applied: no count
    assert (await storage.transact([], [Put("y", b"")])).count is None
    failed = await storage.transact([Check("in/a", Expect(exists=True))], [Put("z", b"")], CountKeys("in/"))
    assert not failed.applied and failed.count is None


async def test_transact_refuses_oversized_or_duplicate(storage: Storage) -> None:
    with pytest.raises(InvalidTransaction):
        await storage.transact([], [Put(f"t/{i}", b"") for i in range(MAX_TXN_OPS + 1)])
    with pytest.raises(InvalidTransaction):
        await storage.transact([Check("t/a", Expect(exists=True))], [Put("t/a", b"")])
    assert await storage.list_keys("t/") == []


async def test_concurrent_cas_increments_count_exactly_once(storage: Storage) -> None:
    await storage.put("ctr", b"0")
    applied = 0

    async def worker() -> None:
        nonlocal applied
        for _ in range(10):
            while True:
                item = await storage.get("ctr")
                assert item is not None
                res = await storage.put_if_version("ctr", str(int(item.value) + 1).encode(), item.version)
                if res.applied:
                    applied += 1
                    break

    await asyncio.gather(*(worker() for _ in range(8)))
    assert applied == 80
    assert (await storage.get("ctr")).value == b"80"  # type: ignore[union-attr]


async def test_forgetting_partitions_of_an_emptied_prefix(storage: Storage) -> None:
    """Erasure's last step: the records a backend keeps of key ranges under an
    emptied prefix are listed, forgotten and settled; a key written meanwhile
    (a racing writer) is still found by every list afterwards."""
    doomed = ["gone/kv/a", "gone/sys/agentkit/v1/bot/x", "gone/sys/agentkit/v1/dog/y", "gone/sys/journal/z"]
    kept = ["kept/kv/a", "kept/sys/agentkit/v1/bot/x"]
    for key in doomed + kept:
        await storage.put(key, b"v")
    kept_names = await storage.partitions_under("kept/")
    for key in doomed:
        assert await storage.delete(key)

    names, after = [], None
    while page := await storage.partitions_under("gone/", after, 1):  # one at a time: paging holds
        names += page
        after = page[-1]
    assert names == sorted(names) and all(n.startswith("gone/") for n in names)
    assert names == await storage.partitions_under("gone/")
    await storage.forget_partitions(names)
    assert await storage.partitions_under("gone/") == []

    await storage.put("gone/sys/agentkit/v1/bot/late", b"raced")  # a write landing during the wait
    await asyncio.sleep(storage.partition_settle_seconds)
    restored = await storage.settle_partitions(names)
    assert restored <= len(names)

    assert await storage.list_keys("gone/") == ["gone/sys/agentkit/v1/bot/late"]
    assert "gone/sys/agentkit/v1/bot/late" in await storage.list_keys("")
    assert all(n.startswith("gone/sys/agentkit/v1/bot/") for n in await storage.partitions_under("gone/"))
    assert await storage.list_keys("kept/") == kept
    assert await storage.partitions_under("kept/") == kept_names


async def test_list_with_no_room_returns_nothing(storage: Storage) -> None:
    """`limit` is "at most": 0 or a negative limit lists nothing on every
    backend (SQLite reads a negative LIMIT as no limit at all)."""
    for key in ("lim/a", "lim/b"):
        await storage.put(key, b"v")
    for limit in (0, -1, -1000):
        assert await storage.list("lim/", None, limit) == []
        assert await storage.list_keys("lim/", None, limit) == []
    assert [i.key for i in await storage.list("lim/", None, 1)] == ["lim/a"]


async def test_transaction_byte_limit_is_one_count_on_every_backend(storage: Storage) -> None:
    """MAX_TXN_BYTES counts keys, values and TXN_OP_OVERHEAD per operation (what
    a backend adds to its own count: DynamoDB's attribute names, key prefix and
    version), so a transaction is applied on every backend or refused on every
    backend: exactly at the limit applies (on DynamoDB also in a partition it
    has not written yet), one byte over is refused with limit and size."""
    value = b"v" * (256 * 1024)
    keys = [f"{'p' * 300}/{i:02d}" for i in range(16)]
    last = MAX_TXN_BYTES - TXN_OP_OVERHEAD * 17 - len(value) * 15 - key_bytes([*keys, "guard"])
    checks = [Check("guard", Expect(exists=False))]
    over = [Put(k, value) for k in keys[:15]] + [Put(keys[15], b"v" * (last + 1))]
    with pytest.raises(InvalidTransaction) as refused:
        await storage.transact(checks, over)
    assert (refused.value.limit, refused.value.size) == (MAX_TXN_BYTES, MAX_TXN_BYTES + 1)
    assert await storage.list_keys("p") == []
    exact = [*over[:15], Put(keys[15], b"v" * last)]
    assert (await storage.transact(checks, exact)).applied
    assert await storage.list_keys("p") == keys


async def test_list_ends_with_the_item_that_takes_it_past_max_bytes(storage: Storage) -> None:
    """With `max_bytes` a list ends with the item whose key and value take it
    past the budget (never before its first item), or at `limit`: the same
    leading items as without it, on every backend, and across partitions."""
    sizes = [300, 50, 700, 10, 2000, 5, 5]
    keys = [f"mb/{i}" for i in range(len(sizes))] + ["mb/sys/agentkit/v1/bot/x"]  # another partition too
    for key, size in zip(keys, [*sizes, 40]):
        await storage.put(key, b"v" * size)
    full = await storage.list("mb/", None, 100)
    assert [i.key for i in full] == sorted(keys, key=str.encode)

    def expected(limit: int, budget: int) -> list[str]:
        out, spent = [], 0
        for item in full[:limit]:
            out.append(item.key)
            spent += len(item.key.encode()) + len(item.value)
            if spent > budget:
                break
        return out

    for limit in (1, 3, 100):
        for budget in (0, 1, 304, 400, 1100, 3100, 10_000):
            got = [i.key for i in await storage.list("mb/", None, limit, max_bytes=budget)]
            assert got == expected(limit, budget), (limit, budget)
    after = full[1].key
    got = [i.key for i in await storage.list("mb/", after, 100, max_bytes=800)]
    assert got == [i.key for i in full[2:5]]  # 704, 718, then 2722: past 800 at the third
