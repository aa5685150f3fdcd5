"""KvService through a real server on loopback, on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import fencepost
from fencepost import errors
from fencepost_server.storage import BackendUnavailable, Item, Storage, TxnResult
from tests.conftest import running
from tests.faults import FaultyStorage


async def _all_keys(storage: Storage) -> list[str]:
    return [i.key for i in await storage.list("", None, 10_000)]


async def test_put_get_delete_roundtrip(client: fencepost.AsyncClient) -> None:
    version = await client.put("greeting", b"hello")
    entry = await client.get("greeting")
    assert entry == fencepost.Entry("greeting", b"hello", version)
    assert await client.get("missing") is None
    assert await client.delete("greeting") is True
    assert await client.delete("greeting") is False
    assert await client.get("greeting") is None


async def test_versions_change_on_plain_put_and_fence_stale_writers(client: fencepost.AsyncClient) -> None:
    v1 = await client.put("k", b"a")
    v2 = await client.put("k", b"a")
    assert v1 != v2
    stale = await client.put_if_version("k", b"b", v1)
    assert not stale.applied and stale.version == v2
    ok = await client.put_if_version("k", b"b", v2)
    assert ok.applied and ok.version not in (v1, v2)


async def test_cas_group(client: fencepost.AsyncClient) -> None:
    created = await client.put_if_absent("c", b"1")
    assert created.applied
    again = await client.put_if_absent("c", b"2")
    assert not again.applied and again.version == created.version
    entry = await client.get_with_version("c")
    assert entry is not None and entry.value == b"1"
    gone = await client.delete_if_version("c", "not-a-version")
    assert not gone.applied and gone.version == created.version
    assert (await client.delete_if_version("c", created.version)).applied
    absent = await client.put_if_version("c", b"x", created.version)
    assert not absent.applied and absent.version == ""


async def test_list_pages_unicode_in_byte_order_without_skips(client: fencepost.AsyncClient) -> None:
    keys = [f"u/{i:02d}" for i in range(12)] + ["u/é", "u/日本", "u/😀", "u/Z"]
    for key in keys:
        await client.put(key, key.encode())
    await client.put("v/other", b"x")
    pages: list[list[str]] = []
    token = ""
    while True:
        entries, token = await client.list_page("u/", page_size=5, page_token=token)
        pages.append([e.key for e in entries])
        if not token:
            break
    flat = [k for page in pages for k in page]
    assert flat == sorted(keys, key=lambda k: k.encode())
    assert all(len(p) <= 5 for p in pages) and len(pages) == 4
    assert [k async for k in client.list_keys("u/", page_size=3)] == flat


async def test_page_token_is_bound_to_its_prefix(client: fencepost.AsyncClient) -> None:
    for i in range(4):
        await client.put(f"a/{i}", b"")
    _, token = await client.list_page("a/", page_size=2)
    assert token
    with pytest.raises(errors.PageTokenInvalid):
        await client.list_page("b/", page_size=2, page_token=token)
    with pytest.raises(errors.PageTokenInvalid):
        await client.list_page("a/", page_token="garbage!")
    with pytest.raises(errors.PageSizeInvalid):
        await client.list_page("a/", page_size=-1)


@pytest.mark.parametrize(
    ("key", "value", "exc", "reason"),
    [
        ("", b"v", errors.KeyInvalid, "KEY_INVALID"),
        ("a\x00b", b"v", errors.KeyInvalid, "KEY_INVALID"),
        ("k" * 1025, b"v", errors.KeyTooLong, "KEY_TOO_LONG"),
        ("é" * 513, b"v", errors.KeyTooLong, "KEY_TOO_LONG"),  # 1026 UTF-8 bytes
        ("k", b"x" * (256 * 1024 + 1), errors.ValueTooLarge, "VALUE_TOO_LARGE"),
    ],
)
async def test_limits_refuse_with_reason_and_write_nothing(
    client: fencepost.AsyncClient, storage: Storage, key: str, value: bytes, exc: type, reason: str
) -> None:
    before = await _all_keys(storage)
    for call in (
        lambda: client.put(key, value),
        lambda: client.put_if_absent(key, value),
        lambda: client.txn([], [fencepost.put_op(key, value)]),
    ):
        with pytest.raises(exc) as info:
            await call()
        assert info.value.reason == reason
        assert info.value.code == "INVALID_ARGUMENT"
    if reason != "KEY_INVALID":
        assert int(info.value.metadata["size"]) > int(info.value.metadata["limit"])
    assert await _all_keys(storage) == before


async def test_limits_accept_exactly_the_limit(client: fencepost.AsyncClient) -> None:
    await client.put("k" * 1024, b"x" * (256 * 1024))
    entry = await client.get("k" * 1024)
    assert entry is not None and len(entry.value) == 256 * 1024


async def test_txn_branches_are_atomic(client: fencepost.AsyncClient, storage: Storage) -> None:
    v = await client.put("acct", b"10")
    ok = await client.txn(
        [fencepost.compare("acct", version=v), fencepost.compare("lock", exists=False)],
        [fencepost.put_op("acct", b"9"), fencepost.put_op("log/1", b"-1")],
        [fencepost.put_op("audit", b"lost race")],
    )
    assert ok.succeeded and len(ok.versions) == 2
    stale = await client.txn(
        [fencepost.compare("acct", version=v)],
        [fencepost.put_op("acct", b"8")],
        [fencepost.put_op("audit", b"lost race")],
    )
    assert not stale.succeeded and stale.failed_compares == [0]
    assert (await client.get("acct")).value == b"9"  # type: ignore[union-attr]
    assert (await client.get("audit")).value == b"lost race"  # type: ignore[union-attr]
    with pytest.raises(errors.TxnTooLarge):
        await client.txn([], [fencepost.put_op(f"t/{i}", b"") for i in range(101)])
    with pytest.raises(errors.TxnDuplicateKey):
        await client.txn([], [fencepost.put_op("d", b""), fencepost.delete_op("d")])
    assert await client.get("t/0") is None


async def test_request_id_applies_a_conditional_write_once(client: fencepost.AsyncClient) -> None:
    first = await client.put_if_absent("once", b"1", request_id="req-1")
    retry = await client.put_if_absent("once", b"1", request_id="req-1")
    assert first.applied and retry.applied and retry.version == first.version
    other = await client.put_if_absent("once", b"1", request_id="req-2")
    assert not other.applied
    with pytest.raises(errors.RequestIdReused):
        await client.put_if_absent("different", b"1", request_id="req-1")


class _LoseNext(FaultyStorage):
    """Applies the next call named `lose_call` and loses its response (only that
    one: the server's background work keeps its own calls unharmed)."""

    lose_call = ""

    def _scheduled(self, name: str) -> str | None:
        super()._scheduled(name)
        if name != self.lose_call:
            return None
        self.lose_call = ""
        return "lose"


async def test_a_conditional_write_without_a_request_id_is_never_resent(storage: Storage) -> None:
    """`request_id=""` opts a conditional write out of its request id; a
    resend after an ambiguous failure is then no longer safe: a PutIfAbsent
    whose first attempt applied would answer `applied = false` against its
    own write, and a Txn whose success branch applied would apply its
    failure branch too. The SDK surfaces the failure instead of resending."""
    faulty = _LoseNext(storage, seed=0, fail=0, timeout=0, lose=0)
    async with running(faulty) as srv, srv.client() as c:
        faulty.lose_call = "put_if_absent"
        with pytest.raises(errors.PersistenceUncertain):
            await c.put_if_absent("once", b"mine", request_id="")
        assert faulty.calls["put_if_absent"] == 1
        faulty.lose_call = "transact"
        with pytest.raises(errors.PersistenceUncertain):
            await c.txn([fencepost.compare("lock", exists=False)], [fencepost.put_op("lock", b"won")],
                        [fencepost.put_op("lost", b"both branches")], request_id="")
        assert (await c.get("lock")).value == b"won"  # type: ignore[union-attr]
        assert await c.get("lost") is None


async def test_keys_of_other_tenants_namespaces_are_unreachable(client: fencepost.AsyncClient, storage: Storage) -> None:
    await client.put("mine", b"1")
    stored = await _all_keys(storage)
    assert stored == ["default/kv/mine"]
    # A caller key that looks like a framework key stays inside the caller's KV space.
    await client.put("../sys/agentkit/v1/x", b"evil")
    assert "default/sys/agentkit/v1/x" not in await _all_keys(storage)


class _Down(Storage):
    """A backend that is unreachable for every call."""

    async def _fail(self, *_: object, **__: object) -> None:
        raise BackendUnavailable("connection refused")

    async def get(self, key: str) -> Item | None:
        raise BackendUnavailable("connection refused")

    put = delete = list = list_keys = put_if_absent = put_if_version = delete_if_version = _fail  # type: ignore[assignment]

    async def transact(self, *_: object) -> TxnResult:
        raise BackendUnavailable("connection refused")


async def test_failing_backend_is_unavailable_never_a_miss() -> None:
    async with running(_Down()) as srv, srv.client(retry=fencepost.NO_RETRY) as c:
        for call in (lambda: c.get("k"), lambda: c.get_with_version("k"), lambda: c.put("k", b""),
                     lambda: c.list_page(""), lambda: c.delete("k")):
            with pytest.raises(errors.BackendUnavailable) as info:
                await call()
            assert info.value.code == "UNAVAILABLE"


async def test_closed_backend_is_unavailable(storage: Storage) -> None:
    """The real backend failing (closed under the server) is UNAVAILABLE too."""
    async with running(storage) as srv, srv.client(retry=fencepost.NO_RETRY) as c:
        await c.put("k", b"v")
        await storage.close()
        with pytest.raises(errors.Unavailable):
            await c.get("k")


async def test_retries_unavailable_then_succeeds(storage: Storage) -> None:
    class Flaky(_Down):
        failures = 2

        async def get(self, key: str) -> Item | None:
            if self.failures:
                self.failures -= 1
                raise BackendUnavailable("blip")
            return await storage.get(key)

    flaky = Flaky()
    async with running(flaky) as srv, srv.client() as c:
        assert await c.get("nothing") is None
        assert flaky.failures == 0


async def test_health_and_reflection(server: object) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with grpc.aio.insecure_channel(server.target) as channel:  # type: ignore[attr-defined]
        health = health_pb2_grpc.HealthStub(channel)
        res = await health.Check(health_pb2.HealthCheckRequest(service="fencepost.v1.KvService"))
        assert res.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in call for s in r.list_services_response.service]
        assert "fencepost.v1.KvService" in names


async def test_reflection_streams_held_open_do_not_starve_the_server(server: object) -> None:
    """Reflection must run on the event loop: a thread-per-stream servicer
    would stall once the default thread pool (cores + 4) is held."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    release = asyncio.Event()

    async def ask_then_hold() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        await release.wait()

    async with grpc.aio.insecure_channel(server.target) as channel:  # type: ignore[attr-defined]
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        held = [stub.ServerReflectionInfo(ask_then_hold()) for _ in range(12)]
        for call in held:
            await asyncio.wait_for(call.read(), 10)  # each stream answered and still open
        fresh = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in fresh for s in r.list_services_response.service]
        assert "fencepost.v1.LedgerService" in names
        release.set()
        for call in held:
            call.cancel()


async def test_concurrent_cas_increments_through_the_server(client: fencepost.AsyncClient) -> None:
    await client.put("n", b"0")
    applied = 0

    async def worker() -> None:
        nonlocal applied
        for _ in range(5):
            while True:
                cur = await client.get_with_version("n")
                assert cur is not None
                res = await client.put_if_version("n", str(int(cur.value) + 1).encode(), cur.version)
                if res.applied:
                    applied += 1
                    break

    await asyncio.gather(*(worker() for _ in range(8)))
    assert applied == 40 and (await client.get("n")).value == b"40"  # type: ignore[union-attr]


async def test_txn_compare_value_is_held_to_the_value_limit(client: fencepost.AsyncClient, storage: Storage) -> None:
    """No stored value can be over the value limit, so a compare against one
    could never hold: it is refused as VALUE_TOO_LARGE on every backend (a
    condition that large is more than DynamoDB takes in one expression), and
    nothing is written. A compare value of exactly the limit is compared."""
    limit = 256 * 1024
    version = await client.put("cv", b"x" * limit)
    with pytest.raises(errors.ValueTooLarge) as info:
        await client.txn([fencepost.compare("cv", value=b"x" * (limit + 1))],
                         [fencepost.put_op("cv", b"won")], [fencepost.put_op("cv-lost", b"lost")])
    assert info.value.code == "INVALID_ARGUMENT"
    assert info.value.metadata["limit"] == str(limit) and info.value.metadata["size"] == str(limit + 1)
    assert (await client.get("cv")).version == version  # type: ignore[union-attr]
    assert await client.get("cv-lost") is None
    held = await client.txn([fencepost.compare("cv", value=b"x" * limit)], [fencepost.put_op("cv", b"won")])
    assert held.succeeded


async def test_txn_at_the_byte_limit_is_refused_with_limit_and_size(
    client: fencepost.AsyncClient, storage: Storage
) -> None:
    """The 4 MiB transaction limit counts the transaction as stored: keys with
    the server's tenant scope and a request_id's marker count too. A Txn
    whose caller bytes alone fit but whose stored form does not is refused
    like any Txn over the limit (TXN_TOO_LARGE with `limit` and `size`), and
    writes nothing."""
    limit = 4 * 1024 * 1024
    big = 256 * 1024
    keys = [f"b/{i:02d}" for i in range(16)]
    values = [b"x" * big] * 15 + [b"x" * (big - sum(map(len, keys)) - 16)]
    assert sum(map(len, keys)) + sum(map(len, values)) == limit - 16  # within the limit as sent
    with pytest.raises(errors.TxnTooLarge) as info:
        await client.txn([], [fencepost.put_op(k, v) for k, v in zip(keys, values, strict=True)])
    assert info.value.code == "INVALID_ARGUMENT"
    assert info.value.metadata["limit"] == str(limit)
    assert int(info.value.metadata["size"]) > limit
    assert await _all_keys(storage) == []


async def test_txn_compare_on_an_empty_version_is_refused_as_put_if_version_is(
    client: fencepost.AsyncClient, storage: Storage
) -> None:
    """No key ever has the empty version (CAS responses use it to say
    "absent"), so a compare on it could never hold and the failure branch
    would run every time: it is VERSION_INVALID, as an empty
    expected_version is for PutIfVersion and DeleteIfVersion, and nothing is
    written. Absence is `exists = false`."""
    for compared in ("ev", "ev-missing"):
        with pytest.raises(errors.VersionInvalid) as info:
            await client.txn([fencepost.compare(compared, version="")],
                             [fencepost.put_op("ev", b"won")], [fencepost.put_op("ev-lost", b"lost")])
        assert info.value.code == "INVALID_ARGUMENT"
    with pytest.raises(errors.VersionInvalid):
        await client.put_if_version("ev", b"won", "")
    assert await _all_keys(storage) == []
    absent = await client.txn([fencepost.compare("ev", exists=False)], [fencepost.put_op("ev", b"won")])
    assert absent.succeeded


async def test_a_version_longer_than_any_minted_is_refused_alike(
    client: fencepost.AsyncClient, storage: Storage
) -> None:
    """No backend mints a version over 256 characters, so a compare on one
    could never hold; DynamoDB would also reject a multi-megabyte one inside
    its condition expression. VERSION_INVALID everywhere, nothing written."""
    await client.put("lv", b"v0")
    longest, over = "v" * 256, "v" * 257
    assert not (await client.put_if_version("lv", b"v1", longest)).applied  # at the bound: just not held
    for attempt in (
        client.put_if_version("lv", b"v1", over),
        client.delete_if_version("lv", over),
        client.txn([fencepost.compare("lv", version=over)], [fencepost.put_op("lv", b"won")]),
        client.put_if_version("lv", b"v1", "v" * 3_000_000),
    ):
        with pytest.raises(errors.VersionInvalid) as info:
            await attempt
        assert info.value.code == "INVALID_ARGUMENT"
    assert (await client.get("lv")).value == b"v0"


async def test_list_pages_of_large_values_fit_in_a_response(client: fencepost.AsyncClient) -> None:
    """A page is cut short (with a token) before it outgrows what one response
    may carry: 40 values at the value limit are 10 MiB, over the 8 MiB message
    limit, and listing them with the default page size used to fail the
    whole listing with RESOURCE_EXHAUSTED. Every key still comes back once,
    in order, through List and ListKeys alike."""
    keys = [f"big/{i:02d}" for i in range(40)]
    for key in keys:
        await client.put(key, key.encode() * (256 * 1024 // 6))
    first, token = await client.list_page("big/", page_size=100)
    assert 0 < len(first) < len(keys) and token
    listed = [e async for e in client.list("big/")]
    assert [e.key for e in listed] == keys
    assert all(e.value.startswith(e.key.encode()) for e in listed)
    rest, _ = await client.list_page("big/", page_size=100, page_token=token)
    assert [e.key for e in first + rest][:len(keys)] == keys[:len(first) + len(rest)]
    assert [k async for k in client.list_keys("big/")] == keys


async def test_list_pages_follow_a_lowered_message_limit(storage: Storage) -> None:
    """With `--max-receive-bytes` lowered, pages shrink with it."""
    async with running(storage, max_receive_bytes=1024 * 1024) as srv, srv.client() as c:
        keys = [f"mid/{i}" for i in range(8)]
        for key in keys:
            await c.put(key, b"v" * (200 * 1024))
        assert [e.key async for e in c.list("mid/")] == keys


async def test_every_write_takes_exactly_the_limits_with_a_request_id(client: fencepost.AsyncClient) -> None:
    """A key of exactly 1024 UTF-8 bytes (four-byte characters up to the last
    byte) and a value of exactly 256 KiB go through every write, each with a
    request id (markers travel with the write: on DynamoDB a transaction,
    kept with the row on SQLite), and a retry reports the first outcome."""
    key, value = "😀" * 256, b"v" * (256 * 1024)
    assert len(key.encode()) == 1024
    created = await client.put_if_absent(key, value, request_id="lim-1")
    assert created.applied
    assert (await client.put_if_absent(key, value, request_id="lim-1")) == created
    swapped = await client.put_if_version(key, value, created.version, request_id="lim-2")
    assert swapped.applied
    put = await client.put(key, value, request_id="lim-3")
    txn = await client.txn([fencepost.compare(key, value=value)], [fencepost.put_op(key, value)], request_id="lim-4")
    assert txn.succeeded and (await client.get(key)).version == txn.versions[0]  # type: ignore[union-attr]
    assert await client.put(key, value, request_id="lim-3") == put
    assert (await client.delete_if_version(key, txn.versions[0], request_id="lim-5")).applied
    assert [e async for e in client.list(key[:100])] == []


def test_compare_takes_exactly_one_target() -> None:
    """`compare` built a compare on the first of the targets given and dropped
    the rest silently: `compare(k, exists=True, version=v)` then held for any
    version of k."""
    assert fencepost.compare("k", exists=False).exists is False
    assert fencepost.compare("k", value=b"").HasField("value")
    for targets in ({"exists": True, "version": "v1"}, {"version": "v1", "value": b"x"}, {}):
        with pytest.raises(ValueError):
            fencepost.compare("k", **targets)  # type: ignore[arg-type]
