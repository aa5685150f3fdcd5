"""Two fencepost server processes over one DynamoDB table: concurrent CAS
increments from clients spread over both are each counted exactly once, and
the page tokens one issues resume on the other (one shared key)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest

import fencepost
from tests.api.security_support import Rpc
from tests.dynamo_support import FAKE_CREDENTIALS, backend_url, unique_table

pytestmark = pytest.mark.backend("dynamodb")

CLIENTS = 32
KEYS = ["ctr/0", "ctr/1", "ctr/2", "ctr/3"]
INCREMENTS_PER_CLIENT = 2


async def start_server(url: str) -> tuple[asyncio.subprocess.Process, str]:
    env = {**os.environ, **FAKE_CREDENTIALS}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0",
        "--backend", url, "--create-table", "--log-level", "WARNING",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )
    assert proc.stdout is not None
    output = []
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        output.append(line)
        if not line:
            raise AssertionError(f"server exited before serving:\n{''.join(output)}")
        match = re.search(r"serving on (\S+:\d+)", line)
        if match:
            return proc, match.group(1)


@pytest.fixture
async def two_servers() -> AsyncIterator[list[str]]:
    url = backend_url(unique_table())
    procs: list[asyncio.subprocess.Process] = []
    try:
        targets = []
        for _ in range(2):
            proc, target = await start_server(url)
            procs.append(proc)
            targets.append(target)
        yield targets
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout=15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def test_cas_increments_across_two_processes_count_exactly_once(two_servers: list[str]) -> None:
    clients = [fencepost.AsyncClient(two_servers[i % 2], timeout=30.0) for i in range(CLIENTS)]
    applied: Counter[str] = Counter()
    try:
        for key in KEYS:
            await clients[0].put(key, b"0")

        async def worker(n: int) -> None:
            client, key = clients[n], KEYS[n % len(KEYS)]
            for _ in range(INCREMENTS_PER_CLIENT):
                while True:
                    entry = await client.get_with_version(key)
                    assert entry is not None
                    result = await client.put_if_version(key, str(int(entry.value) + 1).encode(), entry.version)
                    if result.applied:
                        applied[key] += 1
                        break

        await asyncio.gather(*(worker(n) for n in range(CLIENTS)))
        assert sum(applied.values()) == CLIENTS * INCREMENTS_PER_CLIENT
        for key in KEYS:
            # read through the *other* process than the one that seeded the keys
            entry = await clients[1].get(key)
            assert entry is not None and int(entry.value) == applied[key]
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def test_page_tokens_resume_on_the_other_replica(two_servers: list[str]) -> None:
    """Both replicas reach for the page-token key at once: one mints it, the
    other reads it, and a token either issues resumes on the other."""
    async with grpc.aio.insecure_channel(two_servers[0]) as ch0, grpc.aio.insecure_channel(two_servers[1]) as ch1:
        one, two = Rpc(ch0), Rpc(ch1)
        for i in range(3):
            await one("KvService/Put", key=f"page/{i}", value=b"v")
        first = await asyncio.gather(*(r("KvService/List", prefix="page/", page_size=1) for r in (one, two)))
        for issued_by, other in ((first[0], two), (first[1], one)):
            assert [e.key for e in issued_by.entries] == ["page/0"]
            resumed = await other("KvService/List", prefix="page/", page_size=1, page_token=issued_by.next_page_token)
            assert [e.key for e in resumed.entries] == ["page/1"]
