"""Request ids (AIP-155): a retry after a lost response reports the first
outcome exactly — the versions the first attempt wrote — even when another
writer has changed the key since."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import InvalidArgument
from fencepost_server.domain.kv import Compare, KvStore
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import (
    Check,
    CountKeys,
    Expect,
    Marker,
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
        return self._maybe_lose(await self.inner.transact(checks, writes, count))

    async def transact_marked(self, checks: Sequence[Check], writes: Sequence[Write], marker: Marker) -> TxnResult:
        if not self.inner.keeps_markers_with_items:
            return await super().transact_marked(checks, writes, marker)  # through self.transact
        return self._maybe_lose(await self.inner.transact_marked(checks, writes, marker))

    def _maybe_lose(self, result: TxnResult) -> TxnResult:
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


MARKERS = "#/req/"


async def _marker_rows(storage: Storage) -> int:
    return len(await storage.list_keys(MARKERS, None, 1000))


async def test_a_single_key_write_keeps_its_marker_with_the_item_where_the_backend_can(storage: Storage) -> None:
    kv = KvStore(storage, Limits(), RequestLog(storage))
    first = await kv.put_if_absent("t", "k", b"v1", request_id="a")
    second = await kv.put_if_version("t", "k", b"v2", first.version, request_id="b")
    await kv.put("t", "p", b"x", request_id="c")
    assert first.applied and second.applied
    # kept with the item: a's marker moved out to a row of its own when b overwrote k, b's is a
    # row of its own (an overwrite's marker is, see storage/sqlite/statements.put_marked), c's stays with p
    rows = 2 if storage.keeps_markers_with_items else 3
    assert await _marker_rows(storage) == rows
    assert (await kv.put_if_absent("t", "k", b"v1", request_id="a")) == first
    assert (await kv.put_if_version("t", "k", b"v2", first.version, request_id="b")) == second
    assert await kv.put("t", "p", b"x", request_id="c") == (await kv.get("t", "p")).version  # type: ignore[union-attr]
    assert await _marker_rows(storage) == rows


async def test_an_overwritten_or_deleted_item_hands_its_marker_on(storage: Storage) -> None:
    kv = KvStore(storage, Limits(), RequestLog(storage))
    put = await kv.put("t", "k", b"mine", request_id="p")
    await kv.put("t", "k", b"theirs")  # plain overwrite: the marker moves out
    assert await kv.put("t", "k", b"mine", request_id="p") == put
    assert (await kv.get("t", "k")).value == b"theirs"  # type: ignore[union-attr]

    created = await kv.put_if_absent("t", "gone", b"once", request_id="once")
    assert await kv.delete("t", "gone")  # deleted: absent again, so only the marker stops a second apply
    assert (await kv.put_if_absent("t", "gone", b"once", request_id="once")) == created
    assert await kv.get("t", "gone") is None


async def test_a_compare_and_set_without_an_id_hands_the_marker_on(storage: Storage) -> None:
    kv = KvStore(storage, Limits(), RequestLog(storage))
    created = await kv.put_if_absent("t", "k", b"mine", request_id="create")
    changed = await kv.put_if_version("t", "k", b"theirs", created.version)  # no id: the marker moves out
    assert changed.applied
    assert await kv.put_if_absent("t", "k", b"mine", request_id="create") == created
    again = await kv.put("t", "k", b"again")  # the item keeps no stale copy of the marker to move out twice
    assert await kv.put_if_absent("t", "k", b"mine", request_id="create") == created
    assert (await kv.delete_if_version("t", "k", again)).applied
    assert await kv.put_if_absent("t", "k", b"mine", request_id="create") == created
    assert await kv.get("t", "k") is None


async def test_a_reused_request_id_is_refused_with_the_marker_on_the_item(storage: Storage) -> None:
    from fencepost_server.domain.errors import InvalidArgument

    kv = KvStore(storage, Limits(), RequestLog(storage))
    await kv.put("t", "k", b"first", request_id="same")
    with pytest.raises(InvalidArgument) as refused:
        await kv.put("t", "k", b"different", request_id="same")
    assert refused.value.reason == "REQUEST_ID_REUSED"
    assert (await kv.get("t", "k")).value == b"first"  # type: ignore[union-attr]


async def test_a_request_id_kept_with_an_item_is_refused_to_any_other_request(storage: Storage) -> None:
    """Every request looks for a marker wherever the backend may keep it: a
    Delete or a Txn reusing a Put's id is refused, and the Put's item stays
    writable (a second copy of the marker would collide with the first when
    the item's next write moves it out)."""
    from fencepost_server.domain.errors import InvalidArgument

    kv = KvStore(storage, Limits(), RequestLog(storage))
    await kv.put("t", "other", b"x")
    first = await kv.put_if_absent("t", "a", b"v1", request_id="same")
    for reuse in (lambda: kv.delete("t", "other", request_id="same"),
                  lambda: kv.txn("t", [], [Put("other", b"y")], [], request_id="same")):
        with pytest.raises(InvalidArgument) as refused:
            await reuse()
        assert refused.value.reason == "REQUEST_ID_REUSED"
    assert (await kv.get("t", "other")).value == b"x"  # type: ignore[union-attr]
    second = await kv.put("t", "a", b"v2")
    assert (await kv.put_if_version("t", "a", b"v3", second, request_id="next")).applied
    assert await kv.put_if_absent("t", "a", b"v1", request_id="same") == first
    assert await kv.delete("t", "a")


async def test_markers_kept_with_items_survive_an_export_and_import(storage: Storage) -> None:
    """Backup and migration copy `export_items`: a marker kept with its item
    must come out as an item of its own, or a retry after a move applies twice."""
    from fencepost_server.storage.memory import MemoryStorage

    kv = KvStore(storage, Limits(), RequestLog(storage))
    first = await kv.put_if_absent("t", "k", b"v1", request_id="a")
    put = await kv.put("t", "p", b"x", request_id="c")
    copy = MemoryStorage()
    async for page in storage.export_items():
        await copy.import_items(page)
    moved = KvStore(copy, Limits(), RequestLog(copy))
    assert (await moved.put_if_absent("t", "k", b"v1", request_id="a")) == first
    assert await moved.put("t", "p", b"x", request_id="c") == put
    assert (await moved.get("t", "p")).version == put  # type: ignore[union-attr]


async def test_a_sweep_past_the_window_removes_every_expired_marker_kept_with_an_item_or_not(
    storage: Storage,
) -> None:
    """Retention: once their dedupe window has passed, markers go, whether
    they are items of their own or kept with the item their request wrote;
    the items stay, and markers still inside the window stay."""
    now = [1_000_000_000.0]
    log = RequestLog(storage, clock=lambda: now[0])
    kv = KvStore(storage, Limits(), log)
    await kv.put_if_absent("t", "kept", b"v", request_id="kept")  # kept with its item where the backend can
    moved = await kv.put("t", "moved", b"v", request_id="moved")
    await kv.put("t", "moved", b"w")  # its marker moves out to an item of its own
    now[0] += 3 * 3600  # past the window (current + previous hour)
    await kv.put_if_absent("t", "fresh", b"v", request_id="fresh")

    def markers() -> list[str]:
        return [item.key for page in pages for item in page if item.key.startswith(MARKERS)]

    pages = [page async for page in storage.export_items()]
    assert len(markers()) == 3  # export shows every marker, kept ones as items of their own
    assert await log.sweep(batch=1) == 2
    pages = [page async for page in storage.export_items()]
    assert len(markers()) == 1  # only the fresh request's
    assert [(await kv.get("t", k)).value for k in ("kept", "moved", "fresh")] == [b"v", b"w", b"v"]  # type: ignore[union-attr]
    # the expired request id is no longer remembered: a retry now applies anew
    assert (await kv.put("t", "moved", b"v", request_id="moved")) != moved
    assert await log.sweep() == 0


async def test_the_sweep_deletes_expired_markers_a_batch_per_backend_call(storage: Storage) -> None:
    from fencepost_server.storage.counting import CountingStorage

    now = 1_000_000_000.0
    bucket = int(now) // 3600 - 2  # past the window
    for i in range(250):
        await storage.put(f"{MARKERS}{bucket:010d}/t/{i:04d}", b"m")
    counted = CountingStorage(storage)
    assert await RequestLog(counted, clock=lambda: now).sweep() == 250
    assert counted.calls["transact"] == 3  # 100 + 100 + 50, not one call per marker
    assert await _marker_rows(storage) == 0


def test_fingerprints_and_outcomes_keep_the_format_stored_markers_were_written_in() -> None:
    """A retry after an upgrade compares against markers an older build wrote:
    the fingerprint's bytes and the outcome's JSON must not drift."""
    import hashlib
    import json

    from fencepost_server.domain.kv import _fingerprint
    from fencepost_server.domain.requests import _outcome_json

    assert _fingerprint("put_if_version", "k/é", "r1", hashlib.sha256(b"v").digest()).hex() == (
        "e6c99caf88d0b2c163a05933933e1d2d53448b9a2f3d496eb36fbfd43096ec1c")
    assert _fingerprint("txn", [1, "x"], ()).hex() == (
        "95340650e85a773dead1ada6501dae5f38bb0d23163f99eddcc3bf5e570f8fce")
    for versions, failed, note in [
        (["r0a1b"], (), ""), ([None], (), ""), (["r-1"], (), ""), (["ré"], (), ""), ([""], (), ""),
        (["a", None, "b"], (0, 2), ""), (["a"], (), "sess-1.x_y"), (["a"], (1,), "n\"ote"), ([], (), ""),
    ]:
        expected: dict[str, object] = {"v": versions, "f": list(failed)}
        if note:
            expected["n"] = note
        assert _outcome_json(versions, failed, note) == json.dumps(expected).encode()


async def test_a_uuid7_request_id_names_its_marker_and_any_other_id_its_hash(storage: Storage) -> None:
    """The SDKs send UUIDv7 ids so that markers written together sit together
    in key order; every other id is hashed. Both kinds replay and refuse reuse
    alike, kept with an item or moved out to a row of their own."""
    import hashlib

    from fencepost.ids import new_request_id
    from fencepost_server.domain.errors import InvalidArgument

    kv = KvStore(storage, Limits(), RequestLog(storage))
    ordered, upper = new_request_id(), new_request_id().upper()  # an uppercase UUID is another id: hashed
    first = await kv.put_if_absent("t", "k", b"v1", request_id=ordered)
    await kv.put("t", "k", b"v2", request_id=upper)  # moves the first marker out where it was kept
    await kv.put("t", "k", b"v3")  # and this one (markers are listed as rows of their own)
    names = {key.rsplit("/", 1)[1] for key in await storage.list_keys(MARKERS, None, 1000)}
    assert ordered in names and hashlib.sha256(upper.encode()).hexdigest() in names
    assert await kv.put_if_absent("t", "k", b"v1", request_id=ordered) == first
    with pytest.raises(InvalidArgument) as refused:
        await kv.delete("t", "k", request_id=ordered)
    assert refused.value.reason == "REQUEST_ID_REUSED"
    assert (await kv.get("t", "k")).value == b"v3"  # type: ignore[union-attr]


def test_the_sdk_makes_uuid7_request_ids_in_time_order() -> None:
    import time
    import uuid

    from fencepost._kv import _rid
    from fencepost._memory import _rid as memory_rid
    from fencepost.ids import UUID7, new_request_id

    before = time.time_ns() // 1_000_000
    ids = [new_request_id() for _ in range(1000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for rid in ids:
        assert UUID7.fullmatch(rid)
        parsed = uuid.UUID(rid)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122 and str(parsed) == rid
        assert before <= parsed.int >> 80 <= after  # the leading 48 bits: Unix milliseconds
    assert [rid[:13] for rid in ids] == sorted(rid[:13] for rid in ids)
    assert UUID7.fullmatch(_rid(None)) and UUID7.fullmatch(memory_rid(None)) and _rid("mine") == "mine"
    assert not UUID7.fullmatch(str(uuid.uuid4())) and not UUID7.fullmatch(uuid.uuid4().hex)


async def test_a_txn_without_a_request_id_computes_no_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fingerprint reprs every value of the transaction (up to 4 MiB) and
    # only a request id's marker keeps it
    from fencepost_server.domain import kv as kv_module
    from fencepost_server.storage.memory import MemoryStorage

    def refuse(*parts: object) -> bytes:
        raise AssertionError("fingerprint computed")

    storage = MemoryStorage()
    kv = KvStore(storage, Limits(), RequestLog(storage))
    monkeypatch.setattr(kv_module, "_fingerprint", refuse)
    out = await kv.txn("t", [Compare("k", Expect(exists=False))], [Put("k", b"v" * 1000)], [])
    assert out.succeeded
    with pytest.raises(AssertionError, match="fingerprint computed"):
        await kv.txn("t", [], [Put("k2", b"v")], [], request_id="rid-1")


async def test_the_next_hour_still_replays_and_guards_every_kind_of_marker(storage: Storage) -> None:
    """A retry in the hour after its first attempt finds the marker under the
    previous window, wherever the backend put it: kept with the item, moved
    out by a later write or delete, or a row of its own (a CAS overwrite, a
    Txn); the id stays refused to any other request there."""
    now = [1_000_000 * 3600 + 3599.0]  # the last second of an hour
    kv = KvStore(storage, Limits(), RequestLog(storage, clock=lambda: now[0]))
    created = await kv.put_if_absent("t", "kept", b"v", request_id="kept")
    moved = await kv.put("t", "moved", b"v", request_id="moved")
    deleted = await kv.put_if_absent("t", "deleted", b"v", request_id="deleted")
    swapped = await kv.put_if_version("t", "kept", b"w", created.version, request_id="swapped")
    txn = await kv.txn("t", [Compare("kept", Expect(exists=True))], [Put("other", b"t")], [], request_id="txn")
    await kv.put("t", "moved", b"later")  # moves its marker out to a row of its own
    await kv.delete("t", "deleted")
    now[0] += 1  # the next hour's window
    assert await kv.put_if_absent("t", "kept", b"v", request_id="kept") == created
    assert await kv.put("t", "moved", b"v", request_id="moved") == moved
    assert await kv.put_if_absent("t", "deleted", b"v", request_id="deleted") == deleted
    assert await kv.put_if_version("t", "kept", b"w", created.version, request_id="swapped") == swapped
    assert await kv.txn("t", [Compare("kept", Expect(exists=True))], [Put("other", b"t")], [], request_id="txn") == txn
    for rid in ("kept", "moved", "deleted", "swapped", "txn"):
        with pytest.raises(InvalidArgument) as info:
            await kv.put("t", "fresh", b"v", request_id=rid)
        assert info.value.reason == reasons.REQUEST_ID_REUSED
    assert await kv.get("t", "fresh") is None and await kv.get("t", "deleted") is None
    assert (await kv.get("t", "moved")).value == b"later"  # type: ignore[union-attr]


async def test_a_sweep_leaves_no_record_of_the_hours_it_emptied(storage: Storage) -> None:
    """A backend that keeps records of key ranges (DynamoDB's partition
    directory: one per hour and tenant of markers) drops those of the hours
    a sweep emptied; every later sweep's listing walked each of them again,
    so a sweep cost one more query per hour the server had ever served."""
    now = [1_000_000 * 3600.0]
    log = RequestLog(storage, clock=lambda: now[0])
    kv = KvStore(storage, Limits(), log)
    for hour in range(5):
        await kv.put("t", f"k{hour}", b"v", request_id=f"id{hour}")
        now[0] += 3600
    current = await kv.put("t", "now", b"v", request_id="now")
    assert await log.sweep() == 4  # hours 0-3; hour 4 is the previous window
    hours = {name.split("/")[2] for name in await storage.partitions_under(MARKERS)}
    assert hours <= {f"{1_000_000 + h:010d}" for h in (4, 5)}
    assert await log.sweep() == 0
    # the hours still inside the window keep their markers and their records
    assert await kv.put("t", "k4", b"v", request_id="id4") == (await kv.get("t", "k4")).version  # type: ignore[union-attr]
    assert await kv.put("t", "now", b"v", request_id="now") == current
    now[0] += 2 * 3600
    assert await log.sweep() == 2
    assert await storage.partitions_under(MARKERS) == []
