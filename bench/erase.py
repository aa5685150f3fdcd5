"""Erase rate: DeleteSession of a 10,000-record session through a server
process, on SQLite and on the local DynamoDB-compatible server (moto, a few
hundred requests/s: there the figure says what the sweep costs in backend
calls, not what DynamoDB would do). Items/s = items the sweep removed /
seconds from the call to its response (the tombstone included).

    python -m bench erase
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import fencepost
from tests.dynamo_support import REGION, moto_endpoint, new_dynamo_storage

from .harness import Reporter, fencepost_server, free_port

RECORDS = 10_000


async def _erase(report: Reporter, name: str, backend: str) -> None:
    port = free_port()
    with fencepost_server(port, backend):
        async with fencepost.AsyncClient(f"127.0.0.1:{port}", timeout=600.0) as client:
            sid = (await client.open_session("bench", "erase")).session_id
            lease = await client.acquire_lease(sid, "h", ttl=600)
            seq = 0
            while seq < RECORDS:
                batch = [b"r" * 200 for _ in range(min(64, RECORDS - seq))]
                seq = (await client.commit(sid, lease.generation, seq, batch)).seq
            started = time.perf_counter()
            out = await client.delete_session(sid)
            seconds = time.perf_counter() - started
    report(f"erase a {RECORDS:,}-record session ({name})", items=out.erased_items, seconds=seconds,
           items_per_s=out.erased_items / seconds)


async def run(report: Reporter) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await _erase(report, "sqlite", f"sqlite://{Path(tmp) / 'erase.db'}")
    table = await new_dynamo_storage()
    try:
        await _erase(report, "dynamodb emulator", f"dynamodb://{table.table}?endpoint={moto_endpoint()}&region={REGION}")
    finally:
        await table.close()
