"""An agent erasure meeting what a DeleteSession cut short left behind, on
every backend: the erasure finishes it, so nothing of the agent's sessions
is left when it says done."""

from __future__ import annotations

from fencepost_server.domain.erasure import Eraser
from fencepost_server.domain.ledger import Ledger
from fencepost_server.storage import Storage
from tests.domain.test_ledger import FakeClock
from tests.raw_store import raw_keys_naming

T = "tenant"


async def test_an_agent_erasure_finishes_a_delete_cut_short_after_the_sessions_keys(storage: Storage) -> None:
    """DeleteSession's sweep removes the session's own keys, then its payload
    blobs and its to-do entry (under `#/ledger/`): cut short in between (a
    crash, a deadline), nothing of the session is left under the agent, but
    its payloads are. The agent's erasure must not say done with them there."""
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    sid = (await ledger.open(T, "doomed", "k"))[0].session_id
    await ledger.deliver(T, session_id=sid, payload=b"P" * (70 * 1024))  # over the inline limit: a blob
    kept = (await ledger.open(T, "kept", "k"))[0].session_id
    await ledger.deliver(T, session_id=kept, payload=b"Q" * (70 * 1024))
    assert [k for k in raw_keys_naming(storage, sid) if k.startswith("#/ledger/blob/")]

    assert await ledger.tombstone(T, sid, force=True) == [sid]
    await ledger.delete_prefix(ledger.keys(T, sid).base)  # the sweep, cut short here

    eraser = Eraser(storage, ledger, clock=clock)
    op = await eraser.start(T, "doomed")
    assert await eraser.run_pending() == 1
    assert (await eraser.get(T, op.name)).done
    assert raw_keys_naming(storage, sid) == []
    assert [k for k in raw_keys_naming(storage, kept) if k.startswith("#/ledger/blob/")]  # another agent's stay
