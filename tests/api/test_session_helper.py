"""The SDK's `Session` holder helper against a ledger that fails in ways the
server never drives by itself: renewals that keep failing, a read that fails
right after the lease was granted."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from fencepost import errors
from fencepost._ledger import Session


@dataclass
class _Lease:
    generation: int


@dataclass
class _Info:
    seq: int = 0
    pending: int = 0


class FlakyLedger:
    """Grants the lease; then renew_lease / get_session fail as told."""

    def __init__(self, renew_error: Exception | None = None, info_error: Exception | None = None) -> None:
        self.renew_error, self.info_error = renew_error, info_error
        self.renewals = 0
        self.released: list[int] = []

    async def acquire_lease(self, session_id: str, holder_id: str, *, ttl: float) -> _Lease:
        return _Lease(7)

    async def get_session(self, session_id: str) -> _Info:
        if self.info_error is not None:
            raise self.info_error
        return _Info()

    async def renew_lease(self, session_id: str, generation: int, **_: Any) -> _Lease:
        self.renewals += 1
        if self.renew_error is not None:
            raise self.renew_error
        return _Lease(generation)

    async def release_lease(self, session_id: str, generation: int, **_: Any) -> None:
        self.released.append(generation)


async def _until(condition: Any, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("error", [
    errors.PermissionDenied("token revoked", reason="PERMISSION_DENIED"),
    errors.Unavailable("server gone", reason=""),
], ids=["permanent", "transient"])
async def test_a_lease_not_renewed_within_its_ttl_counts_as_lost(error: Exception) -> None:
    # the holder must stop: once the TTL has passed unrenewed another holder may own the session
    ledger = FlakyLedger(renew_error=error)
    s = await Session(ledger, "sid", "h", ttl=0.3).acquire()  # type: ignore[arg-type]
    work = asyncio.ensure_future(s.run(lambda: asyncio.sleep(30)))
    await _until(lambda: s.fenced is not None)
    assert isinstance(s.fenced, errors.LeaseFenced) and str(error) in s.fenced.message
    with pytest.raises(errors.LeaseFenced):
        await work
    assert ledger.renewals >= 2  # it kept trying while the lease could still be alive


async def test_renewals_that_succeed_keep_the_session() -> None:
    ledger = FlakyLedger()
    s = await Session(ledger, "sid", "h", ttl=0.15).acquire()  # type: ignore[arg-type]
    await _until(lambda: ledger.renewals >= 6)
    assert s.fenced is None and ledger.renewals >= 6
    s.check()
    await s.release(force=True)


async def test_a_failed_read_after_the_grant_gives_the_lease_back() -> None:
    ledger = FlakyLedger(info_error=errors.Unavailable("server gone"))
    with pytest.raises(errors.Unavailable):
        await Session(ledger, "sid", "h", ttl=30).acquire()  # type: ignore[arg-type]
    assert ledger.released == [7]
