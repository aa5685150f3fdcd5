"""Defects the reliability suite found, reproduced deterministically. Each is
a strict xfail: when the server is fixed it XPASSes (and fails), and the
suite's allowance for it (checks.CheckReport.known) should go."""

from __future__ import annotations

import pytest

from fencepost_server.domain.kv import KvStore
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.requests import RequestLog
from fencepost_server.storage import PersistenceUncertain
from fencepost_server.storage.memory import MemoryStorage

from tests.faults import FaultyStorage


@pytest.mark.xfail(strict=True, reason="KV request-id replay reports the key's current version, not the first outcome's")
async def test_a_replayed_conditional_write_reports_its_own_version() -> None:
    inner = MemoryStorage()
    faulty = FaultyStorage(inner, seed=0, fail=0, timeout=0, lose=0, schedule={0: "lose"})
    kv = KvStore(faulty, Limits(), RequestLog(faulty))
    with pytest.raises(PersistenceUncertain):
        await kv.put_if_absent("t", "k", b"mine", request_id="r1")  # applied; the response is lost
    mine = (await kv.get("t", "k")).version  # type: ignore[union-attr]
    later = await kv.put_if_version("t", "k", b"theirs", mine, request_id="r2")  # another writer
    assert later.applied
    replay = await kv.put_if_absent("t", "k", b"mine", request_id="r1")  # the SDK's retry
    assert replay.applied
    assert replay.version == mine, f"replay reported {replay.version} (the later write's), not {mine}"
