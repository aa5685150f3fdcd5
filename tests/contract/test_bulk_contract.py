"""The operator half of the storage contract (backup, restore, migration):
export in key order with versions, import keeping versions, no ABA across
an import. Runs on every backend (conftest.BACKENDS)."""

from __future__ import annotations

import secrets

from fencepost_server.storage import Item, Storage
from fencepost_server.storage.base import version_family

# Keys spread over many DynamoDB partitions (layout.py), nested ones included.
KEYS = [
    "a", "b/", "b/x", "t1/kv/k1", "t1/kv/k2", "t1/kv/z/deep", "t1/sys/ledger/s1", "t1/sys/ledger/s2",
    "t1/sys/agentkit/v1/ag/journal/head", "t1/sys/agentkit/v1/ag/memory/e1", "t1/sys/x", "t1/z",
    "t2/kv/k1", "#/req/2026113022/t1/r1", "#/idx/0/a", "zz", "é/kv/ü", "日本/kv/x",
]


async def _all(storage: Storage, *, start_after: str | None = None, page: int = 1000) -> list[Item]:
    return [item async for items in storage.export_items(start_after, page) for item in items]


async def _fill(storage: Storage) -> dict[str, Item]:
    out = {}
    for i, key in enumerate(KEYS):
        version = await storage.put(key, f"v{i}".encode())
        out[key] = Item(key, f"v{i}".encode(), version)
    return out


async def test_export_reads_everything_in_key_order_with_versions(storage: Storage) -> None:
    written = await _fill(storage)
    items = await _all(storage)
    assert [i.key for i in items] == sorted(KEYS, key=lambda k: k.encode())
    assert {i.key: i for i in items} == written


async def test_export_pages_and_resumes_after_any_key(storage: Storage) -> None:
    await _fill(storage)
    order = sorted(KEYS, key=lambda k: k.encode())
    pages = [items async for items in storage.export_items(None, 4)]
    assert [len(p) for p in pages[:-1]] == [4] * (len(pages) - 1) and 0 < len(pages[-1]) <= 4
    assert [i.key for p in pages for i in p] == order
    for cut in (0, 3, 7, len(order) - 1):
        assert [i.key for i in await _all(storage, start_after=order[cut], page=3)] == order[cut + 1:]
    assert [i.key for i in await _all(storage, start_after="t1/kv/")] == [k for k in order if k > "t1/kv/"]


async def test_import_keeps_values_and_versions_byte_for_byte(storage: Storage) -> None:
    foreign = [Item(k, bytes([i, 0, 255]) * i, secrets.token_hex(16)) for i, k in enumerate(KEYS)]
    await storage.import_items(foreign)
    await storage.import_items(foreign[:5])  # a resumed import re-sends: harmless
    assert await _all(storage) == sorted(foreign, key=lambda i: i.key.encode())
    for item in foreign:
        assert await storage.get(item.key) == item
    # lists over a prefix (DynamoDB: through the partition directory) see them too
    assert [i.key for i in await storage.list("t1/")] == sorted(k for k in KEYS if k.startswith("t1/"))
    # a version read before the move is the version after it
    res = await storage.put_if_version("t1/kv/k1", b"new", foreign[KEYS.index("t1/kv/k1")].version)
    assert res.applied and res.version not in {i.version for i in foreign}


async def test_import_overwrites_an_existing_key(storage: Storage) -> None:
    await storage.put("k", b"old")
    await storage.import_items([Item("k", b"new", "v-imported")])
    assert await storage.get("k") == Item("k", b"new", "v-imported")


async def test_versions_minted_after_an_import_never_equal_an_imported_one(storage: Storage) -> None:
    probe = await storage.put("probe", b"")
    family = version_family(probe)
    if family is None:  # random tokens: a collision is a 2**-128 event
        ahead = secrets.token_hex(16)
    else:  # the backend's own counter family, well ahead of its counter
        head = probe[: len(probe) - int(family[0].rsplit("-", 1)[-1])]
        width = len(probe) - len(head)
        ahead = f"{head}{family[1] + 50:0{width}x}"
    await storage.import_items([Item("imported", b"x", ahead)])
    minted = {await storage.put(f"new/{i}", b"") for i in range(60)}
    assert ahead not in minted
    if family is not None:
        assert all(version_family(v)[1] > family[1] + 50 for v in minted)  # type: ignore[index]


async def test_reserved_watermarks_are_never_minted_and_are_exported(storage: Storage) -> None:
    probe = await storage.put("probe", b"")
    family = version_family(probe)
    marks = ["00000000ffffffff", "cafe0001-000000000fff"]
    if family is not None:  # this backend's own family, ahead of its counter
        marks.append(probe[: len(probe) - 6] + "ffffff")
    await storage.reserve_versions(marks)
    minted = [await storage.put(f"new/{i}", b"") for i in range(20)]
    assert not set(minted) & set(marks)
    if family is not None:
        assert all(version_family(v)[1] > version_family(marks[-1])[1] for v in minted)  # type: ignore[index]
    watermarks = await storage.version_watermarks()
    for mark in watermarks:
        assert version_family(mark) is not None
    # every reserved family of this backend's kind is carried (highest first)
    own = {version_family(m)[0] for m in watermarks}  # type: ignore[index]
    if family is not None:
        assert family[0] in own
    # the watermarks are no item of the key space
    assert {i.key for i in await _all(storage)} == {"probe", *(f"new/{i}" for i in range(20))}
