"""KV Put/Get through fencepost over DynamoDB next to raw aioboto3 calls.

Both sides run against the same local DynamoDB-compatible server (moto,
started here as the tests start it) at the same concurrency. moto does a few
hundred requests/s and executes them one at a time, so absolute figures say
little; the ratio fencepost / raw is the figure (target >= 80%): what the
gRPC hop, the SDK and the server's own work cost on top of the backend.
moto's first requests are slow (it loads lazily), and this machine is
shared, so the two sides are measured twice, interleaved, after a warm-up,
and the ratio uses each side's better round.
"""

from __future__ import annotations

import aioboto3
from aiobotocore.config import AioConfig

import fencepost
from fencepost_server.storage.dynamodb import DynamoStorage
from tests.dynamo_support import REGION, moto_endpoint, unique_table

from .harness import Reporter, fencepost_server, free_port, measure

VALUE = b"v" * 64
CONCURRENCY = 16
TOTAL = 600
WARMUP = 20
KEYS = 200
ROUNDS = 2


async def _raw(report: Reporter, endpoint: str, table: str) -> dict[str, float]:
    """put_item / get_item straight from one aioboto3 client (same pool size)."""
    config = AioConfig(max_pool_connections=64, retries={"total_max_attempts": 1})
    async with aioboto3.Session().client("dynamodb", region_name=REGION, endpoint_url=endpoint,
                                         config=config) as client:
        def key(i: int) -> dict[str, dict[str, str]]:
            return {"pk": {"S": "k:raw/kv/"}, "sk": {"S": f"bench/{i % KEYS}"}}

        put = await measure(
            lambda i: client.put_item(TableName=table, Item={**key(i), "val": {"B": VALUE}, "ver": {"S": str(i)}}),
            concurrency=CONCURRENCY, total=TOTAL, warmup=WARMUP,
        )
        report.result(f"raw aioboto3 put_item in_flight={CONCURRENCY}", put)
        get = await measure(
            lambda i: client.get_item(TableName=table, Key=key(i), ConsistentRead=True),
            concurrency=CONCURRENCY, total=TOTAL, warmup=WARMUP,
        )
        report.result(f"raw aioboto3 get_item in_flight={CONCURRENCY}", get)
    return {"put": put.rate, "get": get.rate}


async def _fencepost(report: Reporter, endpoint: str, table: str) -> dict[str, float]:
    """Put / Get through a fencepost server process with SDK clients."""
    port = free_port()
    with fencepost_server(port, f"dynamodb://{table}?endpoint={endpoint}&region={REGION}"):
        async with fencepost.AsyncClient(f"127.0.0.1:{port}", timeout=60.0) as client:
            put = await measure(lambda i: client.put(f"bench/{i % KEYS}", VALUE),
                                concurrency=CONCURRENCY, total=TOTAL, warmup=WARMUP)
            report.result(f"fencepost dynamodb Put in_flight={CONCURRENCY}", put)
            get = await measure(lambda i: client.get(f"bench/{i % KEYS}"),
                                concurrency=CONCURRENCY, total=TOTAL, warmup=WARMUP)
            report.result(f"fencepost dynamodb Get in_flight={CONCURRENCY}", get)
    return {"put": put.rate, "get": get.rate}


async def run(report: Reporter) -> None:
    endpoint = moto_endpoint()
    table = unique_table()
    storage = DynamoStorage(table, endpoint_url=endpoint, region=REGION)
    try:
        await storage.create_table()
    finally:
        await storage.close()
    await _raw(_quiet, endpoint, table)  # warm moto up; not reported
    raw: dict[str, float] = {}
    served: dict[str, float] = {}
    for _ in range(ROUNDS):
        for best, side in ((raw, _raw), (served, _fencepost)):
            for op, rate in (await side(report, endpoint, table)).items():
                best[op] = max(best.get(op, 0.0), rate)
    for op in ("put", "get"):
        report(f"ratio fencepost/raw {op} in_flight={CONCURRENCY}", ratio=served[op] / raw[op])


class _Quiet(Reporter):
    def __call__(self, name: str, **figures: object) -> None:
        pass


_quiet = _Quiet()
