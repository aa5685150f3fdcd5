"""DynamoDB-specific behaviour against the local server: request counts,
lists that walk several partitions, a cold partition cache, item size."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import MAX_TXN_BYTES, TXN_OP_OVERHEAD, Check, Expect, InvalidTransaction, Put, key_bytes
from fencepost_server.storage.base import validate_transaction
from fencepost_server.storage.dynamodb import DynamoStorage
from fencepost_server.storage.memory import MemoryStorage
from tests.dynamo_support import REGION, moto_endpoint, new_dynamo_storage

pytestmark = pytest.mark.backend("dynamodb")


@pytest.fixture
async def dynamo() -> AsyncIterator[DynamoStorage]:
    storage = await new_dynamo_storage()
    try:
        yield storage
    finally:
        await storage.close()


async def count_requests(storage: DynamoStorage) -> Counter[str]:
    """Count every HTTP request the storage's client sends, by operation."""
    sent: Counter[str] = Counter()

    def before_send(**kwargs: Any) -> None:
        sent[kwargs["event_name"].rsplit(".", 1)[-1]] += 1

    (await storage.client()).meta.events.register("before-send.dynamodb", before_send)
    return sent


async def test_one_request_per_kv_and_cas_call(dynamo: DynamoStorage) -> None:
    sent = await count_requests(dynamo)
    expected: Counter[str] = Counter()

    async def step(op: str, call: Any) -> Any:
        before = sum(sent.values())
        result = await call
        assert sum(sent.values()) - before == 1, f"{op} sent {sum(sent.values()) - before} requests"
        expected[op] += 1
        return result

    # The first write into a partition also records it in the directory: same request.
    v1 = await step("put (new partition)", dynamo.put("t/kv/a", b"1"))
    assert sent["TransactWriteItems"] == 1
    v2 = await step("put", dynamo.put("t/kv/a", b"2"))
    assert (await step("get", dynamo.get("t/kv/a"))).version == v2  # type: ignore[union-attr]
    assert await step("get miss", dynamo.get("t/kv/missing")) is None
    assert (await step("put_if_absent", dynamo.put_if_absent("t/kv/b", b"x"))).applied
    lost = await step("put_if_absent lost", dynamo.put_if_absent("t/kv/b", b"y"))
    assert not lost.applied and lost.current is not None and lost.current.value == b"x"
    ok = await step("put_if_version", dynamo.put_if_version("t/kv/a", b"3", v2))
    stale = await step("put_if_version stale", dynamo.put_if_version("t/kv/a", b"4", v1))
    assert ok.applied and not stale.applied and stale.version == ok.version
    assert (await step("delete_if_version", dynamo.delete_if_version("t/kv/a", ok.version or ""))).applied
    assert await step("delete", dynamo.delete("t/kv/b")) is True
    assert await step("delete miss", dynamo.delete("t/kv/b")) is False
    for i in range(5):
        await dynamo.put(f"t/kv/p/{i}", b"v")
    page = await step("list page", dynamo.list("t/kv/p/", None, 3))
    assert [i.key for i in page] == ["t/kv/p/0", "t/kv/p/1", "t/kv/p/2"]
    page = await step("list_keys page", dynamo.list_keys("t/kv/p/", "t/kv/p/2", 3))
    assert page == ["t/kv/p/3", "t/kv/p/4"]
    assert "Scan" not in sent


async def test_transaction_is_one_request_and_reports_failed_checks(dynamo: DynamoStorage) -> None:
    v = await dynamo.put("t/kv/guard", b"g")
    sent = await count_requests(dynamo)
    res = await dynamo.transact(
        [Check("t/kv/guard", Expect(version=v)), Check("t/kv/none", Expect(exists=False))],
        [Put("t/kv/x", b"1"), Put("t/kv/y", b"2", Expect(exists=True))],
    )
    assert not res.applied and res.failed == (3,)
    assert sum(sent.values()) == 1
    assert await dynamo.get("t/kv/x") is None


# Keys across many partitions and patterns, including keys that end at a
# partition head and keys shorter than any partition part.
WALK_KEYS = [
    "a", "a/", "a/b", "a/b/c", "ab", "b", "t/kv/x", "t/kv/y/z", "t/kw", "t/sys/ledger/1",
    "t/sys/agentkit/v1/bot/j/1", "t/sys/agentkit/v1/bot/j/2", "t/sys/agentkit/v1/cat/m",
    "t/sys/x", "u/kv/é", "u/kv/😀", "#/req/0001/t/h1", "#/req/0001/u/h2", "#/req/0002/t/h3",
    "#/pending/03/s1", "#/x",
]


async def test_ledger_commit_is_one_transaction_and_one_count_query(dynamo: DynamoStorage) -> None:
    """TransactWriteItems returns no data, so the pending count a commit
    reports is a keys-only Query sent alongside: two requests, one round trip."""
    ledger = Ledger(dynamo)
    sid = (await ledger.open("t", "agent", "s"))[0].session_id
    g = (await ledger.acquire("t", sid, "A", ttl=60)).generation
    first = await ledger.deliver("t", session_id=sid, payload=b"1")
    await ledger.deliver("t", session_id=sid, payload=b"2")
    sent = await count_requests(dynamo)
    done = await ledger.commit("t", sid, g, 0, [b"r"], [first.inbox_id], commit_id="c")
    assert done.pending == 1
    assert dict(sent) == {"TransactWriteItems": 1, "Query": 1}


async def test_walks_over_short_prefixes_match_the_reference(dynamo: DynamoStorage) -> None:
    reference = MemoryStorage()
    for key in WALK_KEYS:
        await dynamo.put(key, key.encode())
        await reference.put(key, key.encode())
    prefixes = sorted({k[:n] for k in WALK_KEYS for n in (0, 1, 2, 4, 6, 8, 12) if n <= len(k)})
    for prefix in prefixes:
        want = await reference.list_keys(prefix, None, 1000)
        assert await dynamo.list_keys(prefix, None, 1000) == want, prefix
        # paged by 2, resuming after each page's last key
        got: list[str] = []
        after: str | None = None
        while True:
            page = await dynamo.list(prefix, after, 2)
            got.extend(i.key for i in page)
            if len(page) < 2:
                break
            after = page[-1].key
        assert got == want, prefix


async def test_a_cold_process_sees_every_partition(dynamo: DynamoStorage) -> None:
    """Another replica (empty partition cache) writes and lists the same table."""
    other = DynamoStorage(dynamo.table, endpoint_url=moto_endpoint(), region=REGION)
    try:
        await dynamo.put("t/sys/agentkit/v1/bot/k", b"1")
        await other.put("t/sys/agentkit/v1/bot/k2", b"2")  # re-records the partition: harmless
        v = await other.put("t/sys/agentkit/v1/dog/k", b"3")
        assert (await dynamo.put_if_version("t/sys/agentkit/v1/dog/k", b"4", v)).applied
        third = DynamoStorage(dynamo.table, endpoint_url=moto_endpoint(), region=REGION)
        try:
            assert await third.list_keys("t/") == [
                "t/sys/agentkit/v1/bot/k", "t/sys/agentkit/v1/bot/k2", "t/sys/agentkit/v1/dog/k",
            ]
        finally:
            await third.close()
    finally:
        await other.close()


async def test_largest_value_with_longest_key_fits_one_item(dynamo: DynamoStorage) -> None:
    key = "tenant/kv/" + "k" * 1024  # the domain's key limit applies to the caller's part
    value = bytes(range(256)) * 1024  # 256 KiB, the domain's value limit
    version = await dynamo.put(key, value)
    item = await dynamo.get(key)
    assert item is not None and item.value == value and item.version == version


async def test_one_dynamodb_request_per_kv_rpc(dynamo: DynamoStorage) -> None:
    """Through the gRPC server: each KV RPC (without a request id) costs one request."""
    from tests.conftest import running

    async with running(dynamo, ledger_janitor=False) as server, server.client(timeout=10.0) as client:
        await client.put("warm", b"0")  # records the tenant's KV partition in the directory
        await client.put("warm/1", b"0")
        # the first page token a process issues fetches the deployment's page-token key, once
        assert (await client.list_page("warm", page_size=1))[1]
        sent = await count_requests(dynamo)

        async def one(call: Any) -> Any:
            before = sum(sent.values())
            result = await call
            assert sum(sent.values()) - before == 1, dict(sent)
            return result

        version = await one(client.put("k", b"1"))
        assert (await one(client.get("k"))).value == b"1"  # type: ignore[union-attr]
        assert (await one(client.get_with_version("k"))).version == version  # type: ignore[union-attr]
        assert not (await one(client.put_if_absent("k", b"2", request_id=""))).applied
        assert (await one(client.put_if_version("k", b"3", version, request_id=""))).applied
        for i in range(3):
            await client.put(f"page/{i}", b"v")
        entries, token = await one(client.list_page("page/", page_size=2))
        assert [e.key for e in entries] == ["page/0", "page/1"] and token
        keys, token = await one(client.list_keys_page("page/", page_size=2, page_token=token))
        assert keys == ["page/2"] and not token
        assert await one(client.delete("k")) is True


async def test_transaction_too_big_to_carry_its_directory_entries(dynamo: DynamoStorage) -> None:
    """99 puts into 99 new partitions: the directory entries go out first."""
    keys = [f"p{i:02d}/x" for i in range(99)]
    result = await dynamo.transact([], [Put(k, b"v") for k in keys])
    assert result.applied and len(result.versions) == 99
    cold = DynamoStorage(dynamo.table, endpoint_url=moto_endpoint(), region=REGION)
    try:
        assert await cold.list_keys("p", None, 1000) == keys
    finally:
        await cold.close()


async def test_transaction_over_dynamodbs_own_size_count_is_refused_before_sending(dynamo: DynamoStorage) -> None:
    """The contract's count (keys, values, TXN_OP_OVERHEAD per operation)
    bounds DynamoDB's own (attribute names, the partition prefix, versions)
    for the versions the backends mint; a put given a longer version of its
    own can still be over DynamoDB's count: refused as too large
    (TXN_TOO_LARGE) rather than sent and answered with a ValidationException."""
    value = b"v" * (256 * 1024)
    keys = [f"big/{i:02d}" for i in range(16)]
    last = MAX_TXN_BYTES - TXN_OP_OVERHEAD * 16 - len(value) * 15 - key_bytes(keys)  # exactly the limit
    writes = [Put(k, value, version="x" * 200) for k in keys[:15]] + [Put(keys[15], b"v" * last)]
    validate_transaction([], writes)  # within the storage contract
    sent = await count_requests(dynamo)
    with pytest.raises(InvalidTransaction) as refused:
        await dynamo.transact([], writes)
    assert refused.value.limit == MAX_TXN_BYTES and refused.value.size > MAX_TXN_BYTES
    assert sum(sent.values()) == 0 and await dynamo.get(keys[0]) is None


async def test_a_transaction_within_the_counted_overhead_fits_with_its_directory_entry(dynamo: DynamoStorage) -> None:
    """A transaction within the contract's count (keys, values and
    TXN_OP_OVERHEAD per operation) fits DynamoDB's own count, also in a
    partition this process has not written yet: when the
    partition's directory entry would push it over, the entry goes out first
    (as when the entries would push it over 100 items)."""
    partition = "p" * 500 + "/"  # a long partition head: its directory entry is over the per-item slack
    keys = [f"{partition}{i:02d}" for i in range(16)]
    value = b"v" * (256 * 1024)
    last = MAX_TXN_BYTES - TXN_OP_OVERHEAD * 16 - len(value) * 15 - key_bytes(keys)
    writes = [Put(k, value) for k in keys[:15]] + [Put(keys[15], b"v" * last)]
    result = await dynamo.transact([], writes)
    assert result.applied
    cold = DynamoStorage(dynamo.table, endpoint_url=moto_endpoint(), region=REGION)
    try:
        assert await cold.list_keys("p", None, 100) == keys
    finally:
        await cold.close()


async def test_concurrent_reservations_keep_the_highest_watermark(dynamo: DynamoStorage) -> None:
    """A migration imports pages concurrently, each reserving its versions:
    the stored watermark of a family is the highest any of them reserved."""
    import asyncio

    tokens = [f"{n:016x}" for n in range(20, 0, -1)]  # the highest first: its write must not be undone
    await asyncio.gather(*(dynamo.reserve_versions([t]) for t in tokens))
    assert await dynamo.version_watermarks() == [tokens[0]]


async def test_a_partition_head_too_long_for_its_directory_entry_is_refused_before_sending(
    dynamo: DynamoStorage,
) -> None:
    """The partition's name is also the sort key of its directory entry
    (at most 1024 bytes): a key whose head is longer cannot be stored, and
    a migration's fit check must say so before it sends anything."""
    from fencepost_server.lifecycle.fit import item_sizer
    from fencepost_server.storage import Item, StorageError
    from fencepost_server.storage.dynamodb import RequestRejected

    key = "a" * 1100 + "/x"
    sizer = item_sizer(dynamo)
    assert sizer is not None
    with pytest.raises(StorageError):
        sizer(Item(key, b"v", "0" * 32))
    sent = await count_requests(dynamo)
    with pytest.raises(RequestRejected):
        await dynamo.put(key, b"v")
    assert not sent


async def test_creating_a_table_that_exists_with_another_schema_says_so() -> None:
    """`create-table` on a name already taken by a table of another key
    schema must not report "already exists" and let every request fail."""
    from tests.dynamo_support import unique_table

    storage = DynamoStorage(unique_table(), endpoint_url=moto_endpoint(), region=REGION)
    try:
        client = await storage.client()
        await client.create_table(
            TableName=storage.table, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        )
        with pytest.raises(Exception, match="schema"):
            await storage.create_table()
    finally:
        await storage.close()
