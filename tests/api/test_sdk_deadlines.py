"""The Python SDK's deadlines and cancellation against a real server: a call's
`timeout` bounds every attempt and the backoff between them; a stream's
`timeout` is its deadline; a cancelled task cancels its call and leaves the
client usable; the sync client raises the same typed errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

import fencepost
from fencepost import errors
from fencepost_server.storage import BackendUnavailable, Item
from fencepost_server.storage.memory import MemoryStorage
from tests.conftest import RunningServer, running


class _Slow(MemoryStorage):
    """`stall/...` keys never answer; `down/...` keys are an outage."""

    async def get(self, key: str) -> Item | None:
        if "/stall/" in key:
            await asyncio.Event().wait()
        if "/down/" in key:
            raise BackendUnavailable("connection refused")
        return await super().get(key)


@pytest.fixture
async def srv() -> AsyncIterator[RunningServer]:
    async with running(_Slow()) as s:
        yield s


async def test_a_stalled_call_ends_at_its_deadline(srv: RunningServer) -> None:
    async with srv.client(timeout=10.0) as c:
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded):
            await c.get("stall/k", timeout=0.3)
        assert time.monotonic() - start < 2.0


async def test_retries_never_outlast_the_deadline(srv: RunningServer) -> None:
    slow_backoff = fencepost.RetryPolicy(max_attempts=20, initial_backoff=0.2, max_backoff=0.2, multiplier=1.0)
    async with srv.client(retry=slow_backoff) as c:
        start = time.monotonic()
        with pytest.raises((errors.BackendUnavailable, errors.DeadlineExceeded)):
            await c.get("down/k", timeout=0.5)
        assert time.monotonic() - start < 1.5


async def test_a_stream_s_timeout_is_its_deadline(srv: RunningServer) -> None:
    async with srv.client() as c:
        s = await c.open_session("agent", "deadline")
        lease = await c.acquire_lease(s.session_id, "holder", ttl=30)
        start = time.monotonic()
        with pytest.raises(errors.DeadlineExceeded):
            async for _ in c.watch_inbox(s.session_id, lease.generation, timeout=0.3):
                pass
        assert time.monotonic() - start < 2.0


async def test_a_cancelled_call_is_cancelled_and_the_client_goes_on(srv: RunningServer) -> None:
    async with srv.client(timeout=30.0) as c:
        task = asyncio.create_task(c.get("stall/k"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 2.0)
        await c.put("k", b"v")
        assert (await c.get("k")).value == b"v"  # type: ignore[union-attr]


async def test_the_sync_client_raises_the_same_typed_deadline(srv: RunningServer) -> None:
    def blocking() -> None:  # in a thread: the server runs on this test's event loop
        with fencepost.Client(srv.target, timeout=10.0) as c:
            with pytest.raises(errors.DeadlineExceeded):
                c.get("stall/k", timeout=0.3)
            c.put("k", b"v")
            assert c.get("k").value == b"v"  # type: ignore[union-attr]

    await asyncio.to_thread(blocking)


async def test_every_stream_method_takes_the_options_every_method_takes(srv: RunningServer) -> None:
    """AsyncClient: "Every method takes keyword-only `timeout`, `metadata` and
    `retry`"; a stream is never resent, whatever `retry` says."""
    opts = {"timeout": 5.0, "metadata": {"x-test": "1"}, "retry": fencepost.NO_RETRY}
    async with srv.client() as c:
        s = await c.open_session("agent", "stream-options")
        lease = await c.acquire_lease(s.session_id, "holder", ttl=30)
        await c.commit(s.session_id, lease.generation, 0, [b"r"])
        assert [r.data async for r in c.read_log(s.session_id, **opts)] == [b"r"]
        assert await c.read_journal("agent", **opts) is None
        with pytest.raises(errors.ArchiveNotFound):
            await c.read_archive("agent", "no-such-archive", **opts)
        await c.deliver(b"e", session_id=s.session_id)
        async for event in c.watch_inbox(s.session_id, lease.generation, **opts):
            assert event.payload == b"e"
            break
        with pytest.raises(errors.DeadlineExceeded):
            async for _ in c.watch_due(s.session_id, lease.generation, **{**opts, "timeout": 0.3}):
                pass


class _LongBackoff(fencepost.RetryPolicy):
    """One retry, after a backoff far longer than the test waits."""

    def delays(self) -> list[float]:
        return [60.0]


def test_closing_the_sync_client_ends_a_call_waiting_out_its_backoff() -> None:
    # nothing listens on port 1: the get fails UNAVAILABLE and sleeps its backoff;
    # closing the client meanwhile must end that call, not leave its thread blocked
    c = fencepost.Client("127.0.0.1:1", timeout=120.0, retry=_LongBackoff(), token="")
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            c.get("k")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - whatever it raises, it must return
            outcome.append(exc)

    import threading

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    time.sleep(1.0)  # the refused attempt is over: the call is in its backoff
    c.close()
    caller.join(10)
    assert not caller.is_alive(), "the call still waits on a closed client"
    [err] = outcome
    assert isinstance(err, errors.FencepostError) and err.code == "CANCELLED", repr(err)


def test_closing_the_sync_client_ends_a_listing_iterated_in_another_thread() -> None:
    # the iterator's cleanup hands the loop one more step (closing the
    # listing) while the client stops it: a step handed over too late was
    # never run, and the iterating thread waited on it forever (a race: tried
    # a few times)
    import threading

    for _ in range(6):
        c = fencepost.Client("127.0.0.1:1", timeout=120.0, retry=_LongBackoff(), token="")
        outcome: list[BaseException | None] = []

        def iterate(c: fencepost.Client = c, outcome: list[BaseException | None] = outcome) -> None:
            try:
                for _entry in c.list("p"):
                    pass
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - whatever it raises, it must return
                outcome.append(exc)

        caller = threading.Thread(target=iterate, daemon=True)
        caller.start()
        time.sleep(0.5)  # the listing's first page is in its backoff
        c.close()
        caller.join(10)
        assert not caller.is_alive(), "the listing still waits on a closed client"
        [err] = outcome
        assert isinstance(err, errors.FencepostError) and err.code == "CANCELLED", repr(err)
