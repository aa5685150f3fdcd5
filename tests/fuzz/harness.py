"""A real server in its own thread, raw calls to it, and the oracle.

The server is started through `tests.conftest.running` (the normal start
path) on an event loop in a background thread, so a plain (sync) hypothesis
test can call it: each call goes over a raw channel with identity
serializers, so the server sees exactly the bytes drawn.

The oracle, per call:
- the status is never INTERNAL, UNKNOWN or DATA_LOSS;
- every non-OK status carries a google.rpc.Status with exactly one
  ErrorInfo, domain fencepost.dev, a reason from `fencepost.reasons` — or is
  one of the transport's own detail-less answers, recognised explicitly
  (`transport_refusal`);
- a refused call leaves the backend's raw items exactly as they were.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencepost import reasons
from fencepost_server.storage import Item, Storage
from tests.conftest import BACKENDS, RunningServer, running

from .messages import WAITING, Rpc

T = TypeVar("T")

KNOWN_REASONS = frozenset(v for k, v in vars(reasons).items() if k.isupper() and k != "DOMAIN")
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
#: calls whose server side may wait: a short client deadline ends them
WAIT_DEADLINE = 0.3
CALL_DEADLINE = 60.0
#: background writers off: only the call under test writes while it runs
QUIET = {"ledger_janitor": False, "journal_flush_seconds": 1e9, "journal_flush_bytes": 1 << 40,
         "request_sweep_seconds": 1e9}


class ServerThread:
    """`running(storage)` on an event loop of its own."""

    def __init__(self, backend: str, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"fuzz-{backend}", daemon=True)
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._done: Future[None] | None = None
        self.storage: Storage = self.run(BACKENDS[backend](tmp))
        ready: Future[RunningServer] = Future()
        self._done = asyncio.run_coroutine_threadsafe(self._serve(ready), self.loop)
        self.server = ready.result(timeout=60)

    async def _serve(self, ready: Future[RunningServer]) -> None:
        self._stop = asyncio.Event()
        try:
            async with running(self.storage, **QUIET) as srv:  # type: ignore[arg-type]
                ready.set_result(srv)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            await self.storage.close()

    def run(self, coro: Awaitable[T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def snapshot(self) -> list[Item]:
        return self.run(self.storage.list("", None, 10**7))

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._done is not None:
            self._done.result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@dataclass
class Outcome:
    code: grpc.StatusCode
    reason: str  # ErrorInfo reason, "" for OK / transport refusals
    problem: str = ""  # why the oracle rejects this answer ("" = fine)


@dataclass
class Tally:
    """Calls per RPC and the (code, reason) answers seen."""

    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    problems: list[str] = field(default_factory=list)

    def add(self, rpc: Rpc, outcome: Outcome) -> None:
        self.calls[rpc.name if rpc.name not in _AMBIGUOUS else f"{rpc.service.rsplit('.', 1)[1]}.{rpc.name}"] += 1
        label = outcome.code.name + (f"/{outcome.reason}" if outcome.reason else "")
        self.answers[rpc.path][label] += 1

    def statuses(self) -> collections.Counter[str]:
        total: collections.Counter[str] = collections.Counter()
        for per in self.answers.values():
            for label, n in per.items():
                total[label.split("/")[0]] += n
        return total

    def table(self) -> str:
        lines = [f"{'rpc':<44} {'calls':>7}  answers"]
        for path in sorted(self.answers):
            per = self.answers[path]
            seen = ", ".join(f"{label} {n}" for label, n in per.most_common())
            lines.append(f"{path.lstrip('/').replace('fencepost.v1.', ''):<44} {sum(per.values()):>7}  {seen}")
        total = sum(self.calls.values())
        statuses = ", ".join(f"{c} {n}" for c, n in self.statuses().most_common())
        lines.append(f"total {total} calls; statuses: {statuses}")
        return "\n".join(lines)


_AMBIGUOUS = {"List", "Call"}


def transport_refusal(code: grpc.StatusCode, details: str, rpc: Rpc) -> bool:
    """The detail-less answers that come from gRPC itself, not the servicer."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        return True  # over the server's receive limit: refused before any handler ran
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and rpc.name in WAITING:
        return True  # our own short deadline on a call that waits
    return False


def judge(rpc: Rpc, code: grpc.StatusCode, details: str, trailers: Any) -> Outcome:
    if code == grpc.StatusCode.OK:
        return Outcome(code, "")
    if code in FORBIDDEN:
        return Outcome(code, "", f"{code.name}: {details}")
    raw = dict(trailers or ()).get("grpc-status-details-bin")
    if raw is None:
        if transport_refusal(code, details, rpc):
            return Outcome(code, "")
        return Outcome(code, "", f"{code.name} without google.rpc.Status: {details}")
    status = status_pb2.Status.FromString(raw)
    infos = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            infos.append(info)
    if len(infos) != 1:
        return Outcome(code, "", f"{code.name} with {len(infos)} ErrorInfo: {details}")
    info = infos[0]
    if info.domain != reasons.DOMAIN or info.reason not in KNOWN_REASONS:
        return Outcome(code, info.reason, f"{code.name} with ErrorInfo {info.domain}/{info.reason}")
    if status.code != code.value[0]:
        return Outcome(code, info.reason, f"google.rpc.Status code {status.code} differs from {code.name}")
    return Outcome(code, info.reason)


class RawCaller:
    """Calls with identity serializers: request bytes in, response bytes out."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(
            target, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        )
        self._stubs: dict[str, Callable[..., Any]] = {}

    def call(self, rpc: Rpc, data: bytes) -> tuple[grpc.StatusCode, str, Any]:
        timeout = WAIT_DEADLINE if rpc.name in WAITING else CALL_DEADLINE
        stub = self._stubs.get(rpc.path)
        if stub is None:
            factory = self.channel.unary_stream if rpc.streaming else self.channel.unary_unary
            stub = self._stubs[rpc.path] = factory(rpc.path, _registered_method=False)
        try:
            if rpc.streaming:
                responses = stub(data, timeout=timeout)
                for _ in responses:
                    pass
                return responses.code(), responses.details() or "", responses.trailing_metadata()
            _, call = stub.with_call(data, timeout=timeout)
            return call.code(), call.details() or "", call.trailing_metadata()
        except grpc.RpcError as err:
            return err.code(), err.details() or "", err.trailing_metadata()  # type: ignore[attr-defined]

    def serving(self) -> bool:
        health = health_pb2_grpc.HealthStub(self.channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def close(self) -> None:
        self.channel.close()


class Fuzzer:
    """One server, one raw caller, the oracle, and the tally."""

    def __init__(self, server: ServerThread, tally: Tally | None = None) -> None:
        self.server = server
        self.caller = RawCaller(server.server.target)
        self.tally = tally if tally is not None else Tally()
        self._before: list[Item] | None = None

    def check(self, rpc: Rpc, data: bytes) -> Outcome:
        before = self._before if self._before is not None else self.server.snapshot()
        code, details, trailers = self.caller.call(rpc, data)
        outcome = judge(rpc, code, details, trailers)
        after = self.server.snapshot()
        if code != grpc.StatusCode.OK and not outcome.problem and not _same(before, after) \
                and not (rpc.name in WAITING and code == grpc.StatusCode.DEADLINE_EXCEEDED):
            outcome.problem = f"refused with {code.name}/{outcome.reason} but wrote: {_diff(before, after)}"
        self._before = after
        self.tally.add(rpc, outcome)
        if outcome.problem:
            self.tally.problems.append(f"{rpc.path}: {outcome.problem} (request {data[:200]!r})")
        return outcome

    def close(self) -> None:
        self.caller.close()


def _same(a: list[Item], b: list[Item]) -> bool:
    return a == b


def _diff(a: list[Item], b: list[Item]) -> str:
    old, new = {i.key: i for i in a}, {i.key: i for i in b}
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return ", ".join(repr(k) for k in changed[:5]) + (" ..." if len(changed) > 5 else "")
