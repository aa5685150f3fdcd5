"""Recorded client histories: one `Op` per call, with invoke / complete times
and an outcome of ok (the response arrived), fail (the server said it was not
applied) or unknown (no answer: it may or may not have been applied).

Workloads record through `History.call`, which classifies the SDK's typed
errors: a definite refusal (`FailedPrecondition`, `InvalidArgument`,
`NotFound`, `Aborted`, ...) is `fail`; anything else (a transport error, a
timeout, an exhausted retry, a cancelled call) is `unknown`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fencepost.errors import (
    Aborted,
    FailedPrecondition,
    FencepostError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)

T = TypeVar("T")

OK, FAIL, UNKNOWN = "ok", "fail", "unknown"
#: the server answered "not applied"; every other error leaves the outcome open
DEFINITE_ERRORS = (FailedPrecondition, InvalidArgument, NotFound, Aborted, PermissionDenied, Unauthenticated)


@dataclass
class Op:
    id: int
    process: str
    kind: str  # e.g. "kv.put_if_version", "ledger.commit"
    args: dict[str, Any]
    invoke: float
    complete: float = math.inf  # inf while in flight / when the outcome is unknown
    status: str = UNKNOWN
    result: Any = None
    error: FencepostError | None = None


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def invoke(self, process: str, kind: str, **args: Any) -> Op:
        op = Op(next(self._ids), process, kind, args, time.monotonic())
        self.ops.append(op)
        return op

    @staticmethod
    def finish(op: Op, status: str, result: Any = None, error: FencepostError | None = None) -> None:
        op.status, op.result, op.error = status, result, error
        op.complete = time.monotonic() if status != UNKNOWN else math.inf

    async def call(self, process: str, kind: str, run: Callable[[], Awaitable[T]], **args: Any) -> tuple[Op, T | None]:
        """Record one call; returns the op and the result (None unless ok).
        Errors never propagate: the op's status says what happened."""
        op = self.invoke(process, kind, **args)
        try:
            result = await run()
        except DEFINITE_ERRORS as exc:
            self.finish(op, FAIL, error=exc)
            return op, None
        except FencepostError as exc:
            self.finish(op, UNKNOWN, error=exc)
            return op, None
        self.finish(op, OK, result)
        return op, result

    def of(self, prefix: str) -> list[Op]:
        return [op for op in self.ops if op.kind.startswith(prefix)]

    def outcomes(self) -> Counter[str]:
        return Counter(op.status for op in self.ops)


@dataclass
class Violation:
    check: str  # e.g. "kv.linearizable", "ledger.fencing"
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}"
