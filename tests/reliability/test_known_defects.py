"""Defects the reliability suite found, reproduced deterministically (now
regression tests): both are about a conditional KV write retried with its
request id after its first attempt was applied and the response lost."""

from __future__ import annotations

import pytest

from fencepost_server.domain.kv import KvStore
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import PersistenceUncertain
from fencepost_server.storage.memory import MemoryStorage

from tests.faults import FaultyStorage


def _kv_losing_first_response() -> KvStore:
    faulty = FaultyStorage(MemoryStorage(), seed=0, fail=0, timeout=0, lose=0, schedule={0: "lose"})
    return KvStore(faulty, Limits(), RequestLog(faulty))


async def test_a_replayed_conditional_write_reports_its_own_version() -> None:
    """Found first: the replay reported the key's current version (a later
    writer's); fixed on main by recording the versions in the marker."""
    kv = _kv_losing_first_response()
    with pytest.raises(PersistenceUncertain):
        await kv.put_if_absent("t", "k", b"mine", request_id="r1")  # applied; the response is lost
    mine = (await kv.get("t", "k")).version  # type: ignore[union-attr]
    assert (await kv.put_if_version("t", "k", b"theirs", mine, request_id="r2")).applied  # another writer
    replay = await kv.put_if_absent("t", "k", b"mine", request_id="r1")  # the SDK's retry
    assert replay.applied and replay.version == mine


@pytest.mark.parametrize("n", range(64))
async def test_an_honest_retry_is_never_taken_for_a_reused_request_id(n: int) -> None:
    """Found after that fix: the marker is fingerprint + b"\\n" + JSON and the
    32-byte binary fingerprint holds a newline about 12% of the time, so
    splitting at the first newline called a retry REQUEST_ID_REUSED."""
    kv = _kv_losing_first_response()
    with pytest.raises(PersistenceUncertain):
        await kv.put_if_absent("t", f"k{n}", f"v{n}".encode(), request_id="r")
    replay = await kv.put_if_absent("t", f"k{n}", f"v{n}".encode(), request_id="r")
    assert replay.applied
