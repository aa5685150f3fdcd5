"""Request ids (AIP-155): a retry after a lost response reports the first
outcome exactly — the versions the first attempt wrote — even when another
writer has changed the key since."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fencepost_server.domain.kv import Compare, KvStore
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import (
    Check,
    CountKeys,
    Expect,
    PersistenceUncertain,
    Put,
    Storage,
    TxnResult,
    Write,
)
from fencepost_server.storage.counting import ObservedStorage


class LoseNextResponse(ObservedStorage):
    """When armed, the next transaction that applies is reported as unknown."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, lambda *_: None)
        self.armed = False

    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        result = await self.inner.transact(checks, writes, count)
        if self.armed and result.applied:
            self.armed = False
            raise PersistenceUncertain("response lost after the write was applied")
        return result


@pytest.fixture
def lossy(storage: Storage) -> LoseNextResponse:
    return LoseNextResponse(storage)


async def test_replayed_cas_reports_its_own_version_after_a_later_write(lossy: LoseNextResponse) -> None:
    kv = KvStore(lossy, Limits(), RequestLog(lossy))
    lossy.armed = True
    with pytest.raises(PersistenceUncertain):
        await kv.put_if_absent("t", "k", b"mine", request_id="r1")  # applied; response lost
    mine = (await kv.get("t", "k")).version  # type: ignore[union-attr]
    later = await kv.put_if_version("t", "k", b"theirs", mine, request_id="r2")  # someone else
    assert later.applied
    replay = await kv.put_if_absent("t", "k", b"mine", request_id="r1")  # the SDK's retry
    assert replay.applied and replay.version == mine
    assert (await kv.get("t", "k")).value == b"theirs"  # type: ignore[union-attr]


async def test_replayed_txn_reports_the_branch_it_took(lossy: LoseNextResponse) -> None:
    kv = KvStore(lossy, Limits(), RequestLog(lossy))
    await kv.put("t", "guard", b"1")
    lossy.armed = True
    compares = [Compare("guard", Expect(value=b"2"))]  # fails: the failure branch applies (response lost)
    with pytest.raises(PersistenceUncertain):
        await kv.txn("t", compares, [Put("s", b"success")], [Put("f", b"failure")], request_id="tx1")
    await kv.put("t", "guard", b"2")  # now the compare would hold
    replay = await kv.txn("t", compares, [Put("s", b"success")], [Put("f", b"failure")], request_id="tx1")
    assert not replay.succeeded and replay.failed_compares == (0,)
    assert replay.versions == ((await kv.get("t", "f")).version,)  # type: ignore[union-attr]
    assert await kv.get("t", "s") is None


async def test_replayed_put_and_delete(lossy: LoseNextResponse) -> None:
    kv = KvStore(lossy, Limits(), RequestLog(lossy))
    lossy.armed = True
    with pytest.raises(PersistenceUncertain):
        await kv.put("t", "p", b"v1", request_id="p1")
    first = (await kv.get("t", "p")).version  # type: ignore[union-attr]
    await kv.put("t", "p", b"v2")
    assert await kv.put("t", "p", b"v1", request_id="p1") == first
    lossy.armed = True
    with pytest.raises(PersistenceUncertain):
        await kv.delete("t", "p", request_id="d1")
    assert await kv.delete("t", "p", request_id="d1") is True  # the first attempt removed it
