"""Failure mapping, against a scripted fake DynamoDB endpoint (no moto):
refused -> retried then BackendUnavailable; ambiguous writes ->
PersistenceUncertain unless the write can prove it landed; reads never
turn a failure into a miss."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from fencepost_server.storage import BackendUnavailable, PersistenceUncertain, Put
from fencepost_server.storage.dynamodb import DynamoStorage, RequestRejected, RetryPolicy
from tests.dynamo_support import FAKE_CREDENTIALS, REGION, moto_endpoint

pytestmark = pytest.mark.backend("dynamodb")

FAST_RETRY = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.005)
ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"

Reply = Callable[[dict[str, Any]], Any]  # request body -> web.Response (or awaitable)


def error(status: int, code: str, **extra: Any) -> Reply:
    def reply(_body: dict[str, Any]) -> web.Response:
        return web.json_response({"__type": ERROR_PREFIX + code, "message": code, **extra}, status=status,
                                 content_type="application/x-amz-json-1.0")
    return reply


def ok(payload: dict[str, Any] | None = None) -> Reply:
    def reply(_body: dict[str, Any]) -> web.Response:
        return web.json_response(payload or {}, content_type="application/x-amz-json-1.0")
    return reply


async def hang(_body: dict[str, Any]) -> web.Response:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


def condition_failed_with_current(version_of: Callable[[dict[str, Any]], str]) -> Reply:
    """A failed condition on the (first) put, whose current item carries
    `version_of(put)`: ConditionalCheckFailed for PutItem, a cancellation for
    TransactWriteItems (a first write into a partition)."""
    def reply(body: dict[str, Any]) -> web.Response:
        if "TransactItems" in body:
            put = body["TransactItems"][0]["Put"]
            reasons = [{"Code": "ConditionalCheckFailed", "Item": {**put["Item"], "ver": {"S": version_of(put)}}}]
            reasons += [{"Code": "None"}] * (len(body["TransactItems"]) - 1)
            payload = {"__type": ERROR_PREFIX + "TransactionCanceledException", "Message": "cancelled",
                       "CancellationReasons": reasons}
        else:
            payload = {"__type": ERROR_PREFIX + "ConditionalCheckFailedException", "message": "failed",
                       "Item": {**body["Item"], "ver": {"S": version_of(body)}}}
        return web.json_response(payload, status=400, content_type="application/x-amz-json-1.0")
    return reply


@dataclass
class FakeDynamo:
    """Answers each request with the next scripted reply (the last one repeats)."""

    script: list[Reply] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    url: str = ""
    current: web.Request | None = None  # the request being answered

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.headers.get("X-Amz-Target", "").rsplit(".", 1)[-1])
        self.current = request
        reply = self.script[min(len(self.seen), len(self.script)) - 1]
        result = reply(json.loads(await request.read() or b"{}"))
        return await result if asyncio.iscoroutine(result) else result


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDynamo]:
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    fake = FakeDynamo()
    app = web.Application()
    app.router.add_post("/", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await runner.cleanup()


def storage_for(url: str) -> DynamoStorage:
    return DynamoStorage("t", endpoint_url=url, region=REGION, retry=FAST_RETRY,
                         connect_timeout=0.3, read_timeout=0.3)


async def test_throttling_is_retried_then_succeeds(fake: FakeDynamo) -> None:
    fake.script = [error(400, "ThrottlingException"), error(400, "ProvisionedThroughputExceededException"), ok({})]
    storage = storage_for(fake.url)
    try:
        assert await storage.get("t/kv/a") is None
        assert fake.seen == ["GetItem"] * 3
    finally:
        await storage.close()


async def test_throttling_that_persists_is_unavailable_not_a_miss(fake: FakeDynamo) -> None:
    fake.script = [error(400, "ThrottlingException")]
    storage = storage_for(fake.url)
    try:
        with pytest.raises(BackendUnavailable) as caught:
            await storage.get("t/kv/a")
        assert not isinstance(caught.value, PersistenceUncertain)
        # throttling means "not applied": a write is retried and is plainly unavailable too
        with pytest.raises(BackendUnavailable) as caught:
            await storage.put_if_absent("t/kv/a", b"x")
        assert not isinstance(caught.value, PersistenceUncertain)
        assert len(fake.seen) == 2 * FAST_RETRY.attempts
    finally:
        await storage.close()


async def test_timeout_after_sending_a_write_is_persistence_uncertain(fake: FakeDynamo) -> None:
    fake.script = [hang]
    storage = storage_for(fake.url)
    try:
        with pytest.raises(BackendUnavailable) as read_failure:
            await storage.get("t/kv/a")
        assert not isinstance(read_failure.value, PersistenceUncertain)
        with pytest.raises(PersistenceUncertain):
            await storage.put_if_absent("t/kv/a", b"x")
        with pytest.raises(PersistenceUncertain):
            await storage.delete("t/kv/a")
    finally:
        await storage.close()


async def test_server_errors_on_writes_are_uncertain(fake: FakeDynamo) -> None:
    fake.script = [error(500, "InternalServerError")]
    storage = storage_for(fake.url)
    try:
        with pytest.raises(PersistenceUncertain):
            await storage.put_if_version("t/kv/a", b"x", "v1")
        with pytest.raises(BackendUnavailable):
            await storage.list_keys("t/kv/")
    finally:
        await storage.close()


async def test_a_retry_that_finds_its_own_version_reports_applied(fake: FakeDynamo) -> None:
    fake.script = [error(500, "InternalServerError"), condition_failed_with_current(lambda b: b["Item"]["ver"]["S"])]
    storage = storage_for(fake.url)
    try:
        result = await storage.put_if_absent("t/kv/a", b"x")
        assert result.applied and result.version
        assert fake.seen == ["TransactWriteItems", "TransactWriteItems"]  # new partition: with its directory entry
    finally:
        await storage.close()


async def test_a_retry_that_finds_another_version_is_uncertain(fake: FakeDynamo) -> None:
    fake.script = [error(500, "InternalServerError"), condition_failed_with_current(lambda _b: "someone-else")]
    storage = storage_for(fake.url)
    try:
        with pytest.raises(PersistenceUncertain):
            await storage.put_if_version("t/kv/a", b"x", "v1")
        assert fake.seen == ["PutItem", "PutItem"]  # a version condition cannot create a partition
    finally:
        await storage.close()


async def test_nothing_listening_is_unavailable_not_uncertain(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    storage = storage_for(f"http://127.0.0.1:{port}")
    try:
        for call in (lambda: storage.get("t/kv/a"), lambda: storage.put("t/kv/a", b"x"),
                     lambda: storage.delete("t/kv/a")):
            with pytest.raises(BackendUnavailable) as caught:
                await call()
            assert not isinstance(caught.value, PersistenceUncertain)
    finally:
        await storage.close()


async def test_missing_table_is_unavailable_at_once() -> None:
    storage = DynamoStorage("no-such-table", endpoint_url=moto_endpoint(), region=REGION, retry=FAST_RETRY)
    try:
        with pytest.raises(BackendUnavailable, match="ResourceNotFound"):
            await storage.get("t/kv/a")
    finally:
        await storage.close()


async def test_a_refused_request_names_the_operation_the_key_and_what_dynamodb_said(
    fake: FakeDynamo, caplog: pytest.LogCaptureFixture
) -> None:
    """A ValidationException is never retried; the error and the log line
    say which operation on which key DynamoDB refused, and its reason."""
    fake.script = [error(400, "ValidationException", message="One or more parameter values were invalid")]
    storage = storage_for(fake.url)
    try:
        with caplog.at_level(logging.ERROR, logger="fencepost.dynamodb"), pytest.raises(RequestRejected) as refused:
            await storage.get("t/kv/refused")
        assert fake.seen == ["GetItem"]
        text = str(refused.value)
        assert "GetItem" in text and "'t/kv/refused'" in text
        assert "ValidationException: One or more parameter values were invalid" in text
        logged = [r.getMessage() for r in caplog.records if r.name == "fencepost.dynamodb"]
        assert len(logged) == 1 and text in logged[0] and "refused" in logged[0]
    finally:
        await storage.close()


async def test_a_transaction_item_refused_as_invalid_is_named_by_its_key(fake: FakeDynamo) -> None:
    """A cancellation whose reasons hold a ValidationError: the error names
    the refused item (its key) and DynamoDB's message for it."""
    def cancelled(body: dict[str, Any]) -> web.Response:
        reasons = [{"Code": "None"}] * len(body["TransactItems"])
        reasons[1] = {"Code": "ValidationError", "Message": "Item size has exceeded the maximum allowed size"}
        payload = {"__type": ERROR_PREFIX + "TransactionCanceledException", "Message": "Transaction cancelled",
                   "CancellationReasons": reasons}
        return web.json_response(payload, status=400, content_type="application/x-amz-json-1.0")

    fake.script = [cancelled]
    storage = storage_for(fake.url)
    try:
        with pytest.raises(RequestRejected) as refused:
            await storage.transact([], [Put("t/kv/a", b"x"), Put("t/kv/b", b"y")])
        assert fake.seen == ["TransactWriteItems"]
        text = str(refused.value)
        assert "TransactWriteItems" in text and "ValidationError" in text
        assert "'t/kv/b': ValidationError: Item size has exceeded the maximum allowed size" in text
    finally:
        await storage.close()


async def test_a_write_that_timed_out_then_met_a_fatal_error_is_uncertain(fake: FakeDynamo) -> None:
    """The first attempt may have landed: a later attempt refused for a
    reason that stops retrying (credentials, access) does not make it "not
    applied"."""
    fake.script = [hang, error(400, "AccessDeniedException")]
    storage = storage_for(fake.url)
    try:
        with pytest.raises(PersistenceUncertain):
            await storage.put_if_version("t/kv/a", b"x", "v1")
        assert fake.seen == ["PutItem", "PutItem"]
    finally:
        await storage.close()


def reset_after_reading(fake: FakeDynamo) -> Reply:
    """Read the whole request, then reset the connection (TCP RST) instead of
    answering: the request arrived and may have been applied."""
    async def reply(_body: dict[str, Any]) -> web.Response:
        assert fake.current is not None and fake.current.transport is not None
        sock = fake.current.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        fake.current.transport.abort()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")
    return reply


async def test_a_connection_reset_after_sending_a_write_is_uncertain(fake: FakeDynamo) -> None:
    """A reset after the request went out is not "never sent": the retry's
    failed condition may be the first attempt's own work."""
    gone = error(400, "ConditionalCheckFailedException")  # the key is gone (no current item)
    fake.script = [reset_after_reading(fake), gone]
    storage = storage_for(fake.url)
    try:
        with pytest.raises(PersistenceUncertain):
            await storage.delete_if_version("t/kv/a", "v1")
        assert fake.seen == ["DeleteItem", "DeleteItem"]
    finally:
        await storage.close()
