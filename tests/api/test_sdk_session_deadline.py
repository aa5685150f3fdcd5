"""The Python SDK's Session helper stops the holder once no renewal got
through for a whole TTL, even when a renewal never answers: each renewal's
deadline is what is left of the TTL, not the client's default (30 s)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fencepost import errors
from fencepost._ledger import Session


class _StalledRenewals:
    """Grants the lease, then never answers a renewal: a call ends only at its
    deadline (`timeout`, else the client's default of 30 s)."""

    def __init__(self) -> None:
        self.renew_timeouts: list[float | None] = []

    async def acquire_lease(self, session_id: str, holder_id: str, **_: Any) -> Any:
        return type("L", (), {"generation": 1})()

    async def get_session(self, session_id: str, **_: Any) -> Any:
        return type("S", (), {"seq": 0, "pending": 0})()

    async def renew_lease(self, session_id: str, generation: int, *, timeout: float | None = None, **_: Any) -> Any:
        self.renew_timeouts.append(timeout)
        await asyncio.sleep(30.0 if timeout is None else timeout)
        raise errors.DeadlineExceeded("Deadline Exceeded")

    async def release_lease(self, *_: Any, **__: Any) -> int:
        return 0


async def test_a_renewal_that_never_answers_fences_the_holder_when_the_ttl_runs_out() -> None:
    ttl = 0.9
    fake = _StalledRenewals()
    s = Session(fake, "sid", "holder", ttl)  # type: ignore[arg-type]
    start = time.monotonic()
    await s.acquire()
    try:
        work = asyncio.ensure_future(s.run(lambda: asyncio.sleep(60)))
        try:
            await asyncio.wait_for(work, 5.0)
        except errors.LeaseFenced:
            pass
        lost_after = time.monotonic() - start
        assert s.fenced is not None
        assert ttl <= lost_after < ttl + 1.0, lost_after
        assert all(t is not None and t <= ttl for t in fake.renew_timeouts), fake.renew_timeouts
    finally:
        await s._stop()


