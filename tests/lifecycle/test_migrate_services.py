"""Migration sqlite -> DynamoDB (emulator) and back, with every service's data:
served by a real server on each side, every read RPC answers the same, and
versions, lease generations, commit ids and dedupe keys keep their meaning."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost_server.lifecycle import Exit, LifecycleError, migrate
from fencepost_server.storage import Storage, open_backend
from fencepost_server.storage.dynamodb import DynamoStorage
from tests.conftest import running
from tests.dynamo_support import backend_url, new_dynamo_storage

from .service_state import SERVER_SETTINGS, Written, populate, read_everything


async def _dynamo_url() -> str:
    storage = await new_dynamo_storage()
    await storage.close()
    return backend_url(storage.table)


async def _all_versions(url: str) -> set[str]:
    storage = open_backend(url)
    try:
        versions = {i.version async for page in storage.export_items() for i in page}
        return versions | set(await storage.version_watermarks())
    finally:
        await storage.close()


async def _serve(url: str) -> tuple[Storage, object]:
    storage = open_backend(url)
    return storage, running(storage, **SERVER_SETTINGS)


async def _check_after_move(c: fencepost.AsyncClient, w: Written, before_versions: set[str]) -> None:
    # a put_if_version with a version read before the move applies after it
    res = await c.put_if_version("app/007", b"after the move", w.kv_versions["app/007"])
    assert res.applied
    minted = {res.version}
    # the key deleted before the move: its old version never matches again
    stale = await c.put_if_version("gone", b"x", w.gone_version)
    assert not stale.applied
    for i in range(40):
        minted.add(await c.put("gone", f"again {i}".encode()))
        minted.add(await c.put(f"new/{i}", b"new"))
    assert not minted & (before_versions | w.minted), "a version issued before the move came back"

    # the holder whose lease expired before the move is fenced by a later grant
    later = await c.acquire_lease(w.expired, "holder-3", ttl=60)
    assert later.generation == w.expired_generation + 1
    with pytest.raises(errors.LeaseFenced):
        await c.commit(w.expired, w.expired_generation, 1, [b"from the old holder"])
    # the holder of the lease held across the move keeps it
    session = await c.get_session(w.held)
    assert session.lease.live and session.lease.generation == w.held_generation

    # a commit retried with its commit_id reports the first outcome
    commit_id, generation, expected, records, seq = w.commit
    again = await c.commit(w.held, generation, expected, records, commit_id=commit_id)
    assert again.seq == seq and again.replayed
    assert (await c.get_session(w.held)).seq == session.seq  # applied once

    # an event's dedupe key still dedupes
    dup = await c.deliver(b"event 0", session_id=w.held, dedupe_key=w.dedupe_key)
    assert dup.duplicate


async def _round(source_url: str, target_url: str, tmp_path: Path) -> None:
    source, serving = await _serve(source_url)
    try:
        async with serving as srv, srv.client(timeout=30) as c:
            w = await populate(c)
            before = await read_everything(c, w)
    finally:
        await source.close()
    before_versions = await _all_versions(source_url)

    report = await migrate(source_url, target_url, work_dir=tmp_path / "work", page=100)
    assert report.verification.same, report.verification.differences
    assert report.copied == report.verification.other_items > 100

    target, serving = await _serve(target_url)
    try:
        async with serving as srv, srv.client(timeout=30) as c:
            after = await read_everything(c, w)
            recalls = "memory.search recall counts"
            for name in before:
                if name != recalls:
                    assert after[name] == before[name], name
            # the recall statistics came along: one more search, one more recall each
            assert after[recalls] == [n + 1 for n in before[recalls]] and min(before[recalls]) >= 1
            await _check_after_move(c, w, before_versions)
    finally:
        await target.close()


@pytest.mark.backend("dynamodb")
async def test_sqlite_to_dynamodb_keeps_every_answer(tmp_path: Path) -> None:
    await _round(f"sqlite://{tmp_path / 'source.db'}", await _dynamo_url(), tmp_path)


@pytest.mark.backend("dynamodb")
async def test_dynamodb_to_sqlite_keeps_every_answer(tmp_path: Path) -> None:
    await _round(await _dynamo_url(), f"sqlite://{tmp_path / 'target.db'}", tmp_path)


async def test_no_aba_across_sqlite_to_sqlite(tmp_path: Path) -> None:
    """Versions deleted before the move are not in the copy, yet are never minted after it."""
    source_url, target_url = f"sqlite://{tmp_path / 'a.db'}", f"sqlite://{tmp_path / 'b.db'}"
    source = open_backend(source_url)
    issued = [await source.put("k", f"v{i}".encode()) for i in range(50)]
    issued.append(await source.put("other", b"x"))
    await source.delete("k")  # the highest versions of "k" now exist nowhere
    await source.close()
    report = await migrate(source_url, target_url, work_dir=tmp_path / "work")
    assert report.verification.same
    target = open_backend(target_url)
    try:
        assert (await target.get("other")).version == issued[-1]  # type: ignore[union-attr]
        fresh = [await target.put("k", b"again") for _ in range(60)]
        assert not set(fresh) & set(issued)
    finally:
        await target.close()


def test_dynamo_support_is_importable() -> None:
    assert DynamoStorage  # the emulator tests above must never skip


@pytest.mark.backend("dynamodb")
async def test_a_value_over_dynamodbs_item_limit_is_refused_by_name(tmp_path: Path) -> None:
    """SQLite holds any value; a DynamoDB item is at most 400 KB. The migration
    refuses (exit 3) naming the key and its size, before writing that page,
    instead of failing on an opaque ValidationException from BatchWriteItem."""
    source = f"sqlite://{tmp_path / 'source.db'}"
    storage = open_backend(source)
    try:
        await storage.put("t/kv/small", b"x" * 100)
        await storage.put("t/kv/huge", b"x" * (400 * 1024))  # with its key and version: over 400 KB
    finally:
        await storage.close()
    target = await _dynamo_url()
    with pytest.raises(LifecycleError) as exc:
        await migrate(source, target, work_dir=tmp_path / "work", stream=io.StringIO())
    assert exc.value.code == Exit.REFUSED
    message = str(exc.value)
    assert "'t/kv/huge'" in message and "400 KB" in message and "ValidationException" not in message
