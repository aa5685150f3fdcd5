"""The async client (hand-written) and the sync client (derived from it).

Each service's methods live in their own mixin module (`_kv.py`, ...); the
sync `Client` is built from `AsyncClient` by introspection at import time, so
the two can never drift.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import grpc

from ._admin import AdminMethods
from ._call import DEFAULT_RETRY, Caller, Metadata, RetryPolicy
from ._env import resolve_target, resolve_tls, resolve_token
from ._evals import EvalMethods
from ._journal import JournalMethods
from ._kv import KvMethods
from ._ledger import LedgerMethods
from ._memory import MemoryMethods
from ._schedule import ScheduleMethods
from ._text import refuse_unencodable
from .errors import FencepostError
from .v1 import (
    admin_pb2_grpc,
    evals_pb2_grpc,
    journal_pb2_grpc,
    kv_pb2_grpc,
    ledger_pb2_grpc,
    memory_pb2_grpc,
    schedule_pb2_grpc,
    store_api_pb2_grpc,
)

DEFAULT_TIMEOUT = 30.0


class AsyncClient(
    KvMethods, EvalMethods, MemoryMethods, LedgerMethods, JournalMethods, ScheduleMethods, AdminMethods
):
    """Async fencepost client. Every method takes keyword-only `timeout`,
    `metadata` and `retry`; errors are `fencepost.errors.FencepostError`s.

        async with fencepost.AsyncClient("127.0.0.1:50051") as fp:
            await fp.put("greeting", b"hello")

    Left out, `target`, `token` and TLS come from the environment like the
    CLI's (`FENCEPOST_ENDPOINT`, `FENCEPOST_TOKEN`, `FENCEPOST_TLS_CA`,
    `FENCEPOST_TLS_CERT` / `FENCEPOST_TLS_KEY`, `FENCEPOST_TLS_SERVER_NAME`;
    see `fencepost._env`), else 127.0.0.1:50051 in plaintext. Explicit
    arguments win; `token=""` sends no token whatever the environment says.
    An `authorization` in `metadata` is sent instead of FENCEPOST_TOKEN's;
    a `token` argument replaces it.
    `env` replaces `os.environ` as the source of those defaults.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        metadata: Metadata | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        options: list[tuple[str, Any]] | None = None,
        channel: grpc.aio.Channel | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        md = list(metadata.items()) if isinstance(metadata, Mapping) else list(metadata or [])
        named = any(k.lower() == "authorization" for k, _ in md)
        explicit, token = token is not None, resolve_token(token, env)
        # One authorization header (the server refuses a call with two): a
        # `token` argument replaces the metadata's, the environment's only fills in.
        if token and explicit:
            md = [(k, v) for k, v in md if k.lower() != "authorization"]
        if token and (explicit or not named):
            md.append(("authorization", f"Bearer {token}"))
        if channel is None:
            target = resolve_target(target, env)
            if credentials is None:
                tls = resolve_tls(env=env)
                if tls.enabled:
                    credentials, tls_options = tls.credentials()
                    options = [*(options or []), *tls_options]
            if credentials is not None:
                channel = grpc.aio.secure_channel(target, credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(target, options=options)
        self._channel = channel
        self._caller = Caller(timeout, md, retry)
        self._kv = kv_pb2_grpc.KvServiceStub(channel)
        self._evals = evals_pb2_grpc.EvalServiceStub(channel)
        self._memory = memory_pb2_grpc.MemoryServiceStub(channel)
        self._ledger = ledger_pb2_grpc.LedgerServiceStub(channel)
        self._journal = journal_pb2_grpc.JournalServiceStub(channel)
        self._store_api = store_api_pb2_grpc.StoreApiServiceStub(channel)
        self._schedule = schedule_pb2_grpc.ScheduleServiceStub(channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(channel)

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._channel

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _LoopThread:
    """A private event loop in a daemon thread that runs the async client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fencepost-client", daemon=True)
        self.thread.start()
        self.closed = False
        self._lock = threading.Lock()  # no work is handed to the loop once `stop` has begun

    def run(self, coro: Any) -> Any:
        with self._lock:
            if self.closed:
                coro.close()
                raise FencepostError("the client is closed", code="CANCELLED")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:  # `stop` ended it (another thread closed the client)
            raise FencepostError("the client was closed while the call ran", code="CANCELLED") from None

    def stop(self) -> None:
        with self._lock:
            self.closed = True
        # A call of another thread may still wait on this loop (in its retry
        # backoff, say): cancel it, or a stopped loop leaves that thread blocked forever.
        asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _cancel_others() -> None:
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class Client:
    """Blocking fencepost client with the same methods and arguments as
    `AsyncClient` (generated from it). Async iterators become iterators."""

    def __init__(self, target: str | None = None, **kwargs: Any) -> None:
        self._runner = _LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(target, **kwargs)

        try:
            self._async = self._runner.run(make())
        except BaseException:  # a refused configuration must not leave the loop's thread behind
            self._runner.stop()
            raise

    def close(self) -> None:
        if self._runner is not None:
            self._runner.run(self._async.close())
            self._runner.stop()
            self._runner = None  # type: ignore[assignment]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sync_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def gen(self: Client, *args: Any, **kwargs: Any) -> Iterator[Any]:
            agen: AsyncIterator[Any] = getattr(self._async, name)(*args, **kwargs)
            try:
                while True:
                    try:
                        yield self._runner.run(agen.__anext__())
                    except StopAsyncIteration:
                        return
            finally:
                runner = self._runner
                if runner is not None and not runner.closed:  # closed: stopping cancelled it already
                    runner.run(agen.aclose())  # type: ignore[attr-defined]

        return gen

    @functools.wraps(fn)
    def call(self: Client, *args: Any, **kwargs: Any) -> Any:
        return self._runner.run(getattr(self._async, name)(*args, **kwargs))

    return call


#: the KV methods' arguments that are keys: refused as KeyInvalid, the others as FieldInvalid
_KV_KEY_ARGS = frozenset({"key", "prefix"})


def _refuse_unencodable_text() -> None:
    """Every public method raises the typed error for an argument protobuf cannot encode (see _text)."""
    for name, fn in inspect.getmembers(AsyncClient, inspect.isfunction):
        if name.startswith("_") or name == "close":
            continue
        if not (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)):
            continue
        keys = _KV_KEY_ARGS if name in vars(KvMethods) else frozenset()
        setattr(AsyncClient, name, refuse_unencodable(fn, keys))


def _derive_sync() -> None:
    for name, fn in inspect.getmembers(AsyncClient, inspect.isfunction):
        if name.startswith("_") or name in ("close",):
            continue
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            setattr(Client, name, _sync_method(name, fn))


_refuse_unencodable_text()
_derive_sync()
