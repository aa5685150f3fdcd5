"""Listings of large entries with the server's message limit lowered to
1 MiB: every page ends before it outgrows one response (AIP-158 lets a page
hold fewer entries than asked), so the whole listing comes back. Each of
these failed with RESOURCE_EXHAUSTED / MESSAGE_TOO_LARGE ("Sent message
larger than max"), on every backend: a session's log, its inbox, an agent's
eval runs or memory could be written but not listed back."""

from __future__ import annotations

from fencepost_server.storage import Storage
from tests.conftest import running

LIMIT = 1024 * 1024
BIG = 200 * 1024


async def test_read_log_and_list_inbox(storage: Storage) -> None:
    async with running(storage, max_receive_bytes=LIMIT) as srv, srv.client(timeout=30) as c:
        sid = (await c.open_session("big", "k")).session_id
        gen = (await c.acquire_lease(sid, "w", ttl=600)).generation
        seq = 0
        for n in range(8):
            seq = (await c.commit(sid, gen, seq, [bytes([n]) * BIG])).seq
        records = [r async for r in c.read_log(sid)]
        assert [r.seq for r in records] == list(range(1, 9)) and records[7].data == bytes([7]) * BIG
        assert [r.seq async for r in c.read_log(sid, from_seq=3, limit=4)] == [3, 4, 5, 6]
        for n in range(8):
            await c.deliver(bytes([n]) * BIG, session_id=sid, dedupe_key=f"d{n}")
        events = [e async for e in c.list_inbox(sid)]
        assert [e.dedupe_key for e in events] == [f"d{n}" for n in range(8)]


async def test_eval_runs(storage: Storage) -> None:
    async with running(storage, max_receive_bytes=LIMIT) as srv, srv.client(timeout=30) as c:
        for n in range(8):
            await c.put_eval_run("agent", f"run-{n}", {"blob": "x" * BIG})
        assert sorted([r.run_id async for r in c.list_eval_runs("agent")]) == [f"run-{n}" for n in range(8)]


async def test_memory_list_and_audit(storage: Storage) -> None:
    async with running(storage, max_receive_bytes=LIMIT) as srv, srv.client(timeout=30) as c:
        ids = [(await c.memory_append("agent", f"fact {n}", metadata={"pad": "m" * 12_000})).id for n in range(100)]
        assert [e.id async for e in c.memory_list_all("agent")] == ids
        audited, token = [], ""
        while True:
            page = await c.memory_audit("agent", page_token=token)
            audited += [e.id for e in page.entries]
            token = page.next_page_token
            if not token:
                break
        assert audited == ids


async def test_ab_samples_and_reminders(storage: Storage) -> None:
    async with running(storage, max_receive_bytes=LIMIT) as srv, srv.client(timeout=30) as c:
        for n in range(8):
            await c.put_ab_sample("agent", "exp", f"s{n}", {"blob": "x" * BIG})
        assert len([s async for s in c.list_ab_samples("agent", "exp")]) == 8
        sid = (await c.open_session("agent", "rem")).session_id
        gen = (await c.acquire_lease(sid, "w", ttl=600)).generation
        for n in range(8):
            await c.create_reminder(sid, gen, f"{n} " + "p" * BIG, after_seconds=3600)
        assert len([r async for r in c.list_reminders(sid)]) == 8


async def test_store_api_memory_read_of_a_journal_grown_past_the_limit(storage: Storage) -> None:
    """StoreApiService `memory.read` answers the whole live journal in one
    message, and the journal rotated at 5 MiB whatever the server's message
    limit: past 1 MiB of journal it failed with RESOURCE_EXHAUSTED ("Sent
    message larger than max") and no ErrorInfo, so what was journaled could
    not be read back on that lane."""
    async with running(storage, max_receive_bytes=LIMIT) as srv, srv.client(timeout=30) as c:
        rec = {"at": "2026-01-01T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}
        for n in range(80):  # ~1.2 MB of records of ~15 KB
            await c.append_turn("agent", {**rec, "pad": f"{n:03d}" + "x" * 15_000})
        out = await c.store_call("memory.read", {"agent": "agent"})
        live = await c.read_journal("agent")
        assert live is not None and out["journal"]["jsonl"].encode() == live.data
        assert out["journal"]["sizeBytes"] <= LIMIT // 2
        assert [a async for a in c.list_archives("agent")], "the journal rotated below the message limit"
