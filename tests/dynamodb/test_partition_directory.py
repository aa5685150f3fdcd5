"""The partition directory under erasure: the rows naming an erased scope go,
and a replica that still trusts a removed row cannot hide its writes from
lists (directory.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from fencepost_server.domain.erasure import Eraser
from fencepost_server.domain.keys import TenantKeys
from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import Put, Storage
from fencepost_server.storage.counting import ObservedStorage
from fencepost_server.storage.dynamodb import DynamoStorage
from tests.domain.test_ledger import FakeClock
from tests.dynamo_support import REGION, moto_endpoint, new_dynamo_storage
from tests.raw_store import DIRECTORY_ROW, raw_items, raw_keys_naming

pytestmark = pytest.mark.backend("dynamodb")

T = "tenant"
AGENT_ROOT = TenantKeys(T).agent("doomed")  # the agent's partition: its name holds tenant and agent


def replica(table: str, ttl: float) -> DynamoStorage:
    return DynamoStorage(table, endpoint_url=moto_endpoint(), region=REGION,
                         partition_cache_ttl=ttl, in_flight_seconds=0.1)


@pytest.fixture
async def two() -> AsyncIterator[tuple[DynamoStorage, DynamoStorage]]:
    """A, a replica that trusts what it remembers for long (so its write
    below surely relies on a row the erasure removed), and B, the replica
    that erases, with a short wait to keep the test fast."""
    b = await new_dynamo_storage(partition_cache_ttl=0.3, in_flight_seconds=0.1)
    a = replica(b.table, ttl=600.0)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def directory_rows(storage: Storage) -> list[str]:
    return sorted(k[len(DIRECTORY_ROW):] for k in raw_items(storage) if k.startswith(DIRECTORY_ROW))


class WriteAfterForget(ObservedStorage):
    """B's storage: right after the erasure removes the rows, replica A (which
    still trusts them) writes into the erased agent's partition."""

    def __init__(self, inner: Storage, write: object) -> None:
        super().__init__(inner, lambda *_: None)
        self.write = write
        self.row_missing_under_the_write = False

    async def forget_partitions(self, names: Sequence[str]) -> None:
        await super().forget_partitions(names)
        await self.write()  # type: ignore[operator]
        self.row_missing_under_the_write = AGENT_ROOT not in directory_rows(self.inner)


async def test_a_stale_replica_writing_into_an_erased_partition_is_still_listed(
    two: tuple[DynamoStorage, DynamoStorage],
) -> None:
    a, b = two
    sid = (await Ledger(a).open(T, "doomed", "k"))[0].session_id  # A now remembers the agent's partition
    assert AGENT_ROOT in directory_rows(b)
    late = AGENT_ROOT + "memory/late"

    async def a_writes() -> None:
        await a.put(late, b"written by A during the erasure")

    erasing = WriteAfterForget(b, a_writes)
    eraser = Eraser(erasing, Ledger(erasing))
    op = await eraser.start(T, "doomed")
    assert await eraser.run_pending() == 1
    assert (await eraser.get(T, op.name)).done
    # the race happened: A's item landed in a partition whose row was gone ...
    assert erasing.row_missing_under_the_write
    # ... and the settle put the row back, so every list finds it, through either replica
    assert AGENT_ROOT in directory_rows(b)
    for storage in (a, b):
        assert await storage.list_keys(TenantKeys(T).root) == [late]
        assert late in await storage.list_keys("")
    assert [i.key async for page in b.export_items() for i in page if i.key == late] == [late]
    assert raw_keys_naming(b, sid) == []


async def test_an_erasure_with_no_racing_write_leaves_no_row_naming_the_scope(
    two: tuple[DynamoStorage, DynamoStorage],
) -> None:
    a, b = two
    ledger = Ledger(a)
    for agent in ("doomed", "kept"):
        await ledger.open(T, agent, "k")
    await a.put("elsewhere/kv/x", b"kept")
    eraser = Eraser(b, Ledger(b))
    await eraser.start(T, "doomed")
    await eraser.run_pending()
    assert [n for n in directory_rows(b) if "doomed" in n] == []
    assert TenantKeys(T).agent("kept") in directory_rows(b)
    await eraser.start(T, None)
    await eraser.run_pending()
    assert raw_keys_naming(b, T + "/") == []
    assert "elsewhere/kv/" in directory_rows(b)


class Crash(Exception):
    pass


async def test_a_replica_dying_mid_wait_leaves_the_settle_to_another(
    two: tuple[DynamoStorage, DynamoStorage],
) -> None:
    a, b = two
    await Ledger(a).open(T, "doomed", "k")
    clock = FakeClock()
    first = Eraser(b, Ledger(b), clock=clock, claim_seconds=30)
    op = await first.start(T, "doomed")
    real_step = first._step

    async def dies_while_waiting(state, *held):  # type: ignore[no-untyped-def]
        if state["phase"] == "directory" and state.get("waited") is not None:
            raise Crash  # as kill -9: the rows are gone, the settle not done
        await real_step(state, *held)

    first._step = dies_while_waiting  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await first.run_pending()
    partial = await first.get(T, op.name)
    assert partial.phase == "directory" and not partial.done
    await a.put(AGENT_ROOT + "memory/late", b"A still trusts the row")  # lands without it

    second = Eraser(b, Ledger(b), clock=clock, claim_seconds=30)
    clock.now += 31  # the first replica's claim expires
    assert await second.run_pending() == 1
    assert (await second.get(T, op.name)).done
    assert await b.list_keys(TenantKeys(T).root) == [AGENT_ROOT + "memory/late"]


WRITES = {
    "put": lambda s, k: s.put(k, b"v"),
    "put_if_absent": lambda s, k: s.put_if_absent(k, b"v"),
    "transact": lambda s, k: s.transact((), [Put(k, b"v")]),
}


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_remembered_row_is_trusted_only_for_the_ttl(
    two: tuple[DynamoStorage, DynamoStorage], write: str,
) -> None:
    """Past the TTL, a replica's next write into the partition writes the row again."""
    _, b = two
    short = replica(b.table, ttl=0.2)
    partition = "t/sys/agentkit/v1/bot/"
    try:
        await WRITES[write](short, partition + "first")
        await b.forget_partitions(await b.partitions_under(partition))  # as an erasure racing the write below
        await asyncio.sleep(0.3)
        await WRITES[write](short, partition + "second")
        assert partition in directory_rows(b)
    finally:
        await short.close()


@pytest.mark.parametrize("write", list(WRITES))
async def test_a_slow_call_checks_the_ttl_again_before_sending(
    two: tuple[DynamoStorage, DynamoStorage], write: str,
) -> None:
    """An entry valid when the call began but expired by the time it sends (a
    stalled process, a retry) is not relied on: the row goes out with it."""
    _, b = two
    slow = replica(b.table, ttl=600.0)
    partition = "t/sys/agentkit/v1/bot/"
    try:
        await WRITES[write](slow, partition + "first")
        await b.forget_partitions([partition])
        readings = iter([0.0])  # the call's first look at the clock: the entry is valid ...
        later = slow._known.now() + 601.0  # ... every later one: expired
        slow._known.now = lambda: next(readings, later)  # type: ignore[method-assign]
        await WRITES[write](slow, partition + "second")
        assert partition in directory_rows(b)
    finally:
        await slow.close()


def test_the_wait_follows_the_url() -> None:
    storage = DynamoStorage.from_params(
        "t", {"partition_cache_ttl": "2", "connect_timeout": "1", "read_timeout": "3", "region": REGION},
    )
    assert storage.partition_settle_seconds == 6.0
    assert DynamoStorage.from_params("t", {"region": REGION}).partition_settle_seconds == 37.0
    with pytest.raises(ValueError):
        DynamoStorage.from_params("t", {"partition_cache_ttl": "-1"})


async def test_rows_are_removed_only_while_the_claim_is_held() -> None:
    """The save recording a batch of names can return late (a DynamoDB
    request resent after timeouts, a pause): removing the rows then, past
    the claim, could remove those of partitions another replica's finished
    erasure left to new data, with no settle to follow (this replica's next
    save fails). The claim is checked first, as before every delete."""
    b = await new_dynamo_storage(partition_cache_ttl=0.3, in_flight_seconds=0.1)
    try:
        slow = _LateNamesSave(b)
        ledger = Ledger(b)
        await ledger.open(T, "doomed", "k")
        eraser = Eraser(slow, Ledger(slow), claim_seconds=0.6)
        await eraser.start(T, "doomed", "")
        assert await eraser.run_pending() == 1
        assert slow.forgets and slow.late_save
        for sent, forgot in slow.forgets:
            assert forgot - sent <= 0.6 * 2 / 3, "rows removed past the claim"
    finally:
        await b.close()


class _LateNamesSave(ObservedStorage):
    """The save recording a batch of partition names returns past the claim."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, lambda *_: None)
        self.late_save = False
        self.last_save_sent = 0.0
        self.forgets: list[tuple[float, float]] = []

    async def put_if_version(self, key: str, value: bytes, expected: str):  # type: ignore[no-untyped-def,override]
        self.last_save_sent = time.monotonic()
        res = await self.inner.put_if_version(key, value, expected)
        state = json.loads(value)
        if not self.late_save and isinstance(state.get("forgotten"), list) and state.get("waited") is None:
            self.late_save = True
            await asyncio.sleep(0.5)
        return res

    async def forget_partitions(self, names: Sequence[str]) -> None:  # type: ignore[override]
        self.forgets.append((self.last_save_sent, time.monotonic()))
        await self.inner.forget_partitions(names)
