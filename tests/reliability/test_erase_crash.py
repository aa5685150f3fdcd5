"""kill -9 in the middle of a large session's sweep (SQLite and the DynamoDB
emulator): after the restart the janitor finishes it, every read said
SESSION_NOT_FOUND from the tombstone on, and the raw store ends empty."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost_server.storage import Storage
from fencepost_server.storage.sqlite import SqliteStorage
from tests.conftest import SLOW_BACKENDS
from tests.raw_store import raw_keys_naming

from .crash import CLIENT_OPTIONS, CrashableServer

FULL_RECORDS = 10_000
FINISH_SECONDS = 600.0  # janitor interval + grace + the sweep itself (the emulator: ~300 items/s), on a loaded machine


async def _kill_mid_sweep(backend_url: str, raw: Storage, records: int, log_dir: Path) -> None:
    server = CrashableServer(backend_url, log_dir)
    await asyncio.to_thread(server.start)
    try:
        async with fencepost.AsyncClient(server.target, timeout=60.0, options=CLIENT_OPTIONS) as client:
            sid = (await client.open_session("agent", "big")).session_id
            lease = await client.acquire_lease(sid, "h", ttl=600)
            seq = 0
            while seq < records:
                batch = [b"record-%06d" % (seq + i) for i in range(min(64, records - seq))]
                seq = (await client.commit(sid, lease.generation, seq, batch)).seq
            await client.deliver(b"B" * (70 * 1024), session_id=sid)

            seen: list[str] = []
            stop = asyncio.Event()

            async def reader() -> None:
                while not stop.is_set():
                    try:
                        await client.get_session(sid, timeout=5.0)
                        seen.append("found")
                    except errors.SessionNotFound:
                        seen.append("gone")
                    except (errors.Unavailable, errors.DeadlineExceeded):
                        await asyncio.sleep(0.05)  # the server is down: no answer, no claim
                    await asyncio.sleep(0.01)

            async def delete() -> None:
                try:
                    await client.delete_session(sid, force=True)
                except (errors.Unavailable, errors.DeadlineExceeded):
                    pass  # killed under it: the janitor finishes

            reading = asyncio.create_task(reader())
            deleting = asyncio.create_task(delete())
            while "gone" not in seen and not deleting.done():
                await asyncio.sleep(0.001)
            server.kill9()
            await deleting
            left_at_kill = raw_keys_naming(raw, sid)
            assert len(left_at_kill) > 1, "the sweep finished before the kill: nothing was tested"
            print(f"killed mid-sweep: {len(left_at_kill)} items of the session left")

            await asyncio.to_thread(server.start)
            deadline = time.monotonic() + FINISH_SECONDS
            while raw_keys_naming(raw, sid):
                assert time.monotonic() < deadline, f"sweep not finished: {len(raw_keys_naming(raw, sid))} left"
                await asyncio.sleep(5.0)  # a raw scan is a full table Scan: not too often
            with_answers = len(seen)
            while len(seen) < with_answers + 5:  # a few reads after the end, through the restarted server
                await asyncio.sleep(0.05)
            stop.set()
            await reading
            first_gone = seen.index("gone")
            assert set(seen[first_gone:]) == {"gone"}, "a read found the session after the tombstone"
            again = await client.open_session("agent", "big")
            assert again.session_id != sid and again.seq == 0
    finally:
        server.stop()


async def test_kill9_mid_sweep_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "erase.db"
    raw = SqliteStorage(path)
    try:
        await _kill_mid_sweep(f"sqlite://{path}", raw, FULL_RECORDS, tmp_path)
    finally:
        await raw.close()


@pytest.mark.scaled  # 1,000 records in `make test`; FENCEPOST_FULL_SCALE=1 (make reliability): 10,000
async def test_kill9_mid_sweep_dynamodb(tmp_path: Path) -> None:
    from tests.dynamo_support import backend_url, new_dynamo_storage

    table_owner = await new_dynamo_storage()  # creates the table; the server subprocesses share it
    try:
        records = 1_000 if "dynamodb" in SLOW_BACKENDS else FULL_RECORDS
        await _kill_mid_sweep(backend_url(table_owner.table), table_owner, records, tmp_path)
    finally:
        await table_owner.close()
