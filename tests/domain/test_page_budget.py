"""A page of large values reads no further than one response holds: the
backend is asked for `page_size + 1` items *and* a byte budget, and payload
blobs are read a few at a time, so a page size of 1000 over values near the
256 KiB limit reads about 4 MiB, not up to 256 MiB (a few such calls at once
could exhaust the server's memory): KV List, ListInbox."""

from __future__ import annotations

from fencepost_server.domain.kv import KvStore
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import Item, Storage
from fencepost_server.storage.counting import ObservedStorage

BIG = 200 * 1024
T = "default"


class _ReadBytes(ObservedStorage):
    """Counts the value bytes the backend's lists and gets hand back."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner, lambda *_: None)
        self.listed = 0

    async def get(self, key):  # type: ignore[no-untyped-def]
        item = await self.inner.get(key)
        self.listed += len(item.value) if item else 0
        return item

    async def list(self, prefix, start_after=None, limit=100, max_bytes=None):  # type: ignore[no-untyped-def]
        items: list[Item] = await self.inner.list(prefix, start_after, limit, max_bytes)
        self.listed += sum(len(i.value) for i in items)
        return items


async def test_a_page_of_large_values_reads_about_one_response(storage: Storage) -> None:
    limits = Limits()
    counted = _ReadBytes(storage)
    kv = KvStore(counted, limits, RequestLog(counted))
    n = limits.max_page_bytes // BIG + 10  # more than one response holds
    for i in range(n):
        await kv.put("default", f"big/{i:03d}", bytes([i % 251]) * BIG)
    seen: list[str] = []
    token = ""
    while True:
        counted.listed = 0
        page = await kv.list("default", "big/", 1000, token)
        assert counted.listed <= limits.max_page_bytes + BIG  # the page and the one item that ends it
        assert sum(len(i.value) for i in page.items) <= limits.max_page_bytes
        seen += [i.key for i in page.items]
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"big/{i:03d}" for i in range(n)]


async def test_a_page_of_large_events_reads_about_one_response(storage: Storage) -> None:
    limits = Limits()
    counted = _ReadBytes(storage)
    ledger = Ledger(counted, limits)
    sid = (await ledger.open(T, "agent", "k"))[0].session_id
    n = limits.max_page_bytes // BIG + 40  # past what a page and its last blobs read
    for i in range(n):
        await ledger.deliver(T, session_id=sid, payload=bytes([i % 251]) * BIG)  # a blob each
    seen: list[bytes] = []
    token = ""
    while True:
        counted.listed = 0
        events, token = await ledger.list_inbox(T, sid, 1000, token)
        assert counted.listed <= limits.max_page_bytes + 16 * BIG  # a page, and the blobs read with its last
        seen += [e.payload[:1] for e in events]
        if not token:
            break
    assert seen == [bytes([i % 251]) for i in range(n)]
