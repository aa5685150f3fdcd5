"""The local DynamoDB-compatible server (moto in server mode) for the tests.

One moto process per test session (tests/moto_launcher.py: moto's server,
executing one request at a time), started on first use on a free loopback
port and ended when the session ends (or when the session dies: the process
exits as soon as its stdin, a pipe from the session, closes). Each test gets
its own table, so tests never see each other's data. If moto cannot start,
the tests that need it fail; they never skip.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from fencepost_server.storage import Storage
from fencepost_server.storage.dynamodb import DynamoStorage

REGION = "us-east-1"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_START_SECONDS = 30.0

_process: subprocess.Popen[bytes] | None = None
_endpoint: str | None = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop() -> None:
    global _process, _endpoint
    if _process is not None and _process.poll() is None:
        _process.kill()
        _process.wait(timeout=10)
    _process, _endpoint = None, None


def _answers(endpoint: str) -> bool:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "dynamodb", endpoint_url=endpoint, region_name=REGION,
        config=Config(connect_timeout=0.5, read_timeout=2, retries={"total_max_attempts": 1}),
        aws_access_key_id="testing", aws_secret_access_key="testing",
    )
    try:
        client.list_tables()
        return True
    except Exception:
        return False


def moto_endpoint() -> str:
    """The URL of the session's moto server, starting it on first call."""
    global _process, _endpoint
    for name, value in FAKE_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    if _endpoint is not None and _process is not None and _process.poll() is None:
        return _endpoint
    port = _free_port()
    _process = subprocess.Popen(
        [sys.executable, "-m", "tests.moto_launcher", str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
    )
    atexit.register(_stop)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + _START_SECONDS
    while not _answers(endpoint):
        if _process.poll() is not None or time.monotonic() > deadline:
            _stop()
            raise RuntimeError(f"the local DynamoDB server (moto) did not start on {endpoint}")
        time.sleep(0.1)
    _endpoint = endpoint
    return endpoint


def unique_table() -> str:
    return f"fencepost-test-{uuid.uuid4().hex[:12]}"


def backend_url(table: str) -> str:
    return f"dynamodb://{table}?endpoint={moto_endpoint()}&region={REGION}"


async def new_dynamo_storage(**kwargs: object) -> DynamoStorage:
    """A DynamoStorage over a fresh table on the session's moto server."""
    storage = DynamoStorage(unique_table(), endpoint_url=moto_endpoint(), region=REGION, **kwargs)  # type: ignore[arg-type]
    await storage.create_table()
    return storage


#: The shared fixture's partition-cache TTL and in-flight bound: an erasure
#: waits their sum before settling the partition directory (30 s + 7 s by
#: default), so the tests keep it short.
TEST_PARTITION_CACHE = {"partition_cache_ttl": 0.5, "in_flight_seconds": 0.25}


async def open_dynamodb(_tmp: Path) -> Storage:
    return await new_dynamo_storage(**TEST_PARTITION_CACHE)
