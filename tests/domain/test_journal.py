"""Journal rules on every backend: flush, rotation, crash safety, read-your-acks."""

from __future__ import annotations

from collections.abc import Callable

import asyncio
import json
import random
import time
from collections import Counter
from typing import Any

import pytest

from fencepost import reasons
from fencepost_server.domain.errors import InvalidArgument
from fencepost_server.domain.journal import Entry, FlushOutcome, Journal, JournalConfig, _Keys, decode_segment
from fencepost_server.domain.limits import Limits
from fencepost_server.storage import Item, Storage
from tests.journal_faults import KillAt, Killed

TENANT = "default"


def fields(i: int, session: str = "s1") -> dict[str, Any]:
    return {"at": f"2025-01-01T00:00:{i % 60:02d}Z", "sessionId": session, "channelId": "c1", "status": "completed"}


def extra(tag: str) -> dict[str, Any]:
    return {"tag": tag, "pad": "x" * 40}


async def list_all(storage: Storage, prefix: str) -> list[Item]:
    out: list[Item] = []
    after = None
    while page := await storage.list(prefix, after, 1000):
        out.extend(page)
        after = page[-1].key
    return out


async def stored_ids(storage: Storage, agent: str) -> Counter[str]:
    """Every record id as stored: tail items plus every segment of every generation."""
    keys = _Keys(TENANT, agent)
    ids = [Entry.decode(i.value).id for i in await list_all(storage, keys.tail)]
    for item in await list_all(storage, keys.root + "seg/"):
        ids.extend(e.id for e in decode_segment(item.value))
    return Counter(ids)


def tags(data: bytes) -> list[str]:
    return [json.loads(line)["tag"] for line in data.splitlines()]


async def test_never_appended_is_none(storage: Storage) -> None:
    assert await Journal(storage, Limits()).read(TENANT, "nobody") is None


async def test_append_is_one_blind_write_and_read_includes_tail(storage: Storage) -> None:
    from fencepost_server.storage.counting import CountingStorage

    counting = CountingStorage(storage)
    j = Journal(counting, Limits())
    ids = [await j.append(TENANT, "a", fields(i), extra(f"t{i}")) for i in range(5)]
    assert dict(counting.calls) == {"put": 5}
    assert ids == sorted(ids) and len(set(ids)) == 5
    view = await j.read(TENANT, "a", flush=False)
    assert view is not None and tags(view.data) == [f"t{i}" for i in range(5)]


async def test_flush_moves_tail_into_segments_exactly_once(storage: Storage) -> None:
    j = Journal(storage, Limits(), JournalConfig(segment_bytes=2000))
    ids = [await j.append(TENANT, "a", fields(i), extra(f"t{i}")) for i in range(60)]
    out = await j.flush(TENANT, "a")
    assert out.flushed == 60 and not out.skipped
    keys = _Keys(TENANT, "a")
    assert await list_all(storage, keys.tail) == []
    assert len(await list_all(storage, keys.segments(1))) > 1  # several segments
    assert await stored_ids(storage, "a") == Counter(ids)
    view = await j.read(TENANT, "a")
    assert view is not None and tags(view.data) == [f"t{i}" for i in range(60)] and view.records == 60


async def test_flush_skips_while_another_replica_holds_the_lease(storage: Storage) -> None:
    a, b = Journal(storage, Limits()), Journal(storage, Limits())
    for i in range(3):
        await a.append(TENANT, "ag", fields(i), extra(f"t{i}"))
    held = await b._acquire(_Keys(TENANT, "ag"))
    assert held is not None
    assert (await a.flush(TENANT, "ag")).skipped
    view = await a.read(TENANT, "ag")  # flush skipped, tail still included
    assert view is not None and tags(view.data) == ["t0", "t1", "t2"]
    assert len(await list_all(storage, _Keys(TENANT, "ag").tail)) == 3


async def test_read_returns_every_ack_before_it_from_32_writers(storage: Storage) -> None:
    """32 concurrent writers on one agent, a second replica flushing meanwhile,
    reads mid-stream: each read holds every record acked before it started,
    in id order, once."""
    writer_replica, reader_replica = Journal(storage, Limits()), Journal(storage, Limits(), JournalConfig(segment_bytes=1500))
    flusher = Journal(storage, Limits(), JournalConfig(segment_bytes=1500))
    id_of: dict[str, str] = {}
    done = asyncio.Event()

    async def writer(w: int) -> None:
        for i in range(12):
            tag = f"w{w}-{i}"
            id_of[tag] = await writer_replica.append(TENANT, "hot", fields(i), extra(tag))
            await asyncio.sleep(0)

    async def flush_loop() -> None:
        while not done.is_set():
            await flusher.flush(TENANT, "hot", max_steps=2)
            await asyncio.sleep(0)

    async def reader() -> list[tuple[set[str], list[str]]]:
        seen = []
        while not done.is_set():
            acked = set(id_of)
            view = await reader_replica.read(TENANT, "hot")
            seen.append((acked, tags(view.data) if view else []))
            await asyncio.sleep(0)
        return seen

    flush_task = asyncio.create_task(flush_loop())
    read_task = asyncio.create_task(reader())
    await asyncio.gather(*(writer(w) for w in range(32)))
    done.set()
    await flush_task
    reads = await read_task
    final = await reader_replica.read(TENANT, "hot")
    assert final is not None
    reads.append((set(id_of), tags(final.data)))
    assert len(reads) >= 2
    for acked, got in reads:
        assert len(got) == len(set(got)), "duplicate record in a read"
        assert acked <= set(got), f"{len(acked - set(got))} acked records missing"
        assert [id_of[t] for t in got] == sorted(id_of[t] for t in got), "not in id order"
    assert len(reads[-1][1]) == 32 * 12
    assert await stored_ids(storage, "hot") == Counter(id_of.values())


async def test_rotation_archives_and_starts_fresh_live_journal(storage: Storage) -> None:
    j = Journal(storage, Limits(), JournalConfig(max_journal_bytes=1000))
    order = []
    for batch in range(4):
        for i in range(8):
            tag = f"b{batch}-{i}"
            order.append(tag)
            await j.append(TENANT, "rot", fields(i), extra(tag))
        await j.flush(TENANT, "rot")
    page = await j.list_archives(TENANT, "rot")
    assert len(page.archives) >= 2 and page.next_page_token == ""
    names = [a.name for a in page.archives]
    assert names == sorted(names)
    collected: list[str] = []
    for info in page.archives:
        _, view = await j.read_archive(TENANT, "rot", info.name)
        assert 0 < view.size <= 1000 and view.size == info.size and view.records == info.records
        collected.extend(tags(view.data))
    live = await j.read(TENANT, "rot")
    assert live is not None and 0 < live.size <= 1000
    assert collected + tags(live.data) == order  # nothing lost, nothing twice, in order
    # pagination over archives
    first = await j.list_archives(TENANT, "rot", 1)
    assert len(first.archives) == 1 and first.next_page_token
    second = await j.list_archives(TENANT, "rot", 1, first.next_page_token)
    assert second.archives[0].name == names[1]


async def test_read_archive_unknown_name(storage: Storage) -> None:
    from fencepost_server.domain.errors import NotFound

    with pytest.raises(NotFound) as err:
        await Journal(storage, Limits()).read_archive(TENANT, "a", "000001-nope")
    assert err.value.reason == "ARCHIVE_NOT_FOUND"


async def _fill(storage: Storage, agent: str, n: int) -> dict[str, str]:
    j = Journal(storage, Limits())
    return {f"t{i:03d}": await j.append(TENANT, agent, fields(i), extra(f"t{i:03d}")) for i in range(n)}


KILL_CONFIG = JournalConfig(max_journal_bytes=2500, segment_bytes=1200)
KILL_RECORDS = 40


async def test_flush_killed_at_every_step_loses_and_duplicates_nothing(
    storage: Storage, scaled: Callable[[int, int], int]
) -> None:
    # A clean run to learn how many backend calls a full flush makes.
    await _fill(storage, "clean", KILL_RECORDS)
    probe = KillAt(storage, -1)
    out = await Journal(probe, Limits(), KILL_CONFIG).flush(TENANT, "clean")
    assert out.flushed == KILL_RECORDS and out.rotated >= 1
    steps = len(probe.calls)
    assert probe.calls.count("transact") >= 4

    # Every step on memory and sqlite; every third step (and the last) on the slow emulator.
    stride = scaled(1, 3)
    chosen = sorted(set(range(0, steps, stride)) | {steps - 1})
    for after in (False, True):
        for n in chosen:
            agent = f"kill-{n}-{after}"
            id_of = await _fill(storage, agent, KILL_RECORDS)
            killer = KillAt(storage, n, after=after)
            with pytest.raises(Killed):
                await Journal(killer, Limits(), KILL_CONFIG).flush(TENANT, agent)
            # In storage: every record in the tail or in exactly one segment.
            assert await stored_ids(storage, agent) == Counter(id_of.values()), (n, after, killer.calls)
            # Another replica (its lease clock past the dead holder's lease) finishes.
            later = Journal(storage, Limits(), KILL_CONFIG, clock=lambda: time.time() + 3600)
            await later.flush(TENANT, agent)
            assert await stored_ids(storage, agent) == Counter(id_of.values())
            assert await list_all(storage, _Keys(TENANT, agent).tail) == []
            got: list[str] = []
            for info in (await later.list_archives(TENANT, agent)).archives:
                got.extend(tags((await later.read_archive(TENANT, agent, info.name))[1].data))
            live = await later.read(TENANT, agent)
            assert live is not None
            assert got + tags(live.data) == sorted(id_of), (n, after)


async def test_retried_request_id_is_read_once(storage: Storage) -> None:
    j = Journal(storage, Limits())
    first = await j.append(TENANT, "r", fields(1), extra("first"), "req-1")
    await j.flush(TENANT, "r")
    retry = await j.append(TENANT, "r", fields(1), extra("first"), "req-1")  # e.g. a retry after UNAVAILABLE
    await j.append(TENANT, "r", fields(2), extra("other"), "req-2")
    assert retry == first  # the first attempt's id, which reads return
    view = await j.read(TENANT, "r")
    assert view is not None and tags(view.data) == ["first", "other"]


async def test_request_id_reused_for_another_record_is_refused(storage: Storage) -> None:
    j = Journal(storage, Limits())
    await j.append(TENANT, "r", fields(1), extra("first"), "req-1")
    with pytest.raises(InvalidArgument) as err:
        await j.append(TENANT, "r", fields(1), extra("different"), "req-1")
    assert err.value.reason == reasons.REQUEST_ID_REUSED
    view = await j.read(TENANT, "r")
    assert view is not None and tags(view.data) == ["first"]


async def test_a_request_id_reused_past_its_window_for_another_record_is_read(storage: Storage) -> None:
    """Past the request-id window (its marker no longer found) the same id with
    a different record is a new request: it is acked, so every read returns it.
    Only a retry of the same record under the id is read once."""
    from fencepost_server.domain.requests import RequestLog

    now = [time.time()]
    j = Journal(storage, Limits(), requests=RequestLog(storage, clock=lambda: now[0]))
    await j.append(TENANT, "late", fields(1), extra("first"), "req-1")
    now[0] += 3 * 3600  # past the dedupe window
    assert await j.append(TENANT, "late", fields(2), extra("second"), "req-1")  # another record: acked
    now[0] += 3 * 3600
    await j.append(TENANT, "late", fields(1), extra("first"), "req-1")  # a late retry of the first
    view = await j.read(TENANT, "late")
    assert view is not None and tags(view.data) == ["first", "second"] and view.records == 2


def test_ids_are_time_ordered_and_unique_across_replicas() -> None:
    from fencepost_server.domain.journal import IdSource

    now = [1000.0]
    a, b = IdSource(lambda: now[0]), IdSource(lambda: now[0])
    ids = []
    for _ in range(200):
        if random.random() < 0.3:
            now[0] += random.choice([0.001, -0.005])  # the clock may step back
        ids.append(a.next())
        ids.append(b.next())
    assert len(set(ids)) == len(ids)
    assert [i for i in ids if i.endswith(a.node)] == sorted(i for i in ids if i.endswith(a.node))


async def test_a_late_record_with_an_older_id_is_read_in_id_order(storage: Storage) -> None:
    """A replica whose clock lags appends after newer records were flushed:
    the journal is still in id order (the read sorts, it does not trust
    segment order)."""
    ahead = Journal(storage, Limits())
    behind = Journal(storage, Limits(), clock=lambda: time.time() - 60)
    await ahead.append(TENANT, "skew", fields(1), extra("new-1"))
    await ahead.append(TENANT, "skew", fields(2), extra("new-2"))
    await ahead.flush(TENANT, "skew")
    await behind.append(TENANT, "skew", fields(0), extra("old"))
    view = await ahead.read(TENANT, "skew", flush=False)
    assert view is not None and tags(view.data) == ["old", "new-1", "new-2"]
    await ahead.flush(TENANT, "skew")  # now in a later segment than the newer records
    view = await ahead.read(TENANT, "skew")
    assert view is not None and tags(view.data) == ["old", "new-1", "new-2"]


def test_ids_roll_over_to_the_next_millisecond_past_the_counter_width() -> None:
    """A clock that does not advance: after 1,000,000 ids in one millisecond
    the next id takes the next millisecond instead of a 7-digit counter
    (which would sort before the 6-digit ones) or a repeat."""
    from fencepost_server.domain.journal import IdSource

    ids = IdSource(lambda: 1000.0)
    ids._counter = 999_998  # noqa: SLF001 - skip the first million calls
    ids._last_ms = 1_000_000  # noqa: SLF001
    out = [ids.next() for _ in range(4)]
    assert out == sorted(out) and len(set(out)) == 4
    assert [i.split("-")[:2] for i in out] == [
        ["0000001000000", "999999"], ["0000001000001", "000000"],
        ["0000001000001", "000001"], ["0000001000001", "000002"],
    ]
    assert all(len(i.split("-")[1]) == 6 for i in out)


def test_ids_stay_ordered_over_a_million_in_one_millisecond() -> None:
    from fencepost_server.domain.journal import IdSource

    ids = IdSource(lambda: 1000.0)
    out = [ids.next() for _ in range(1_000_003)]
    assert all(a < b for a, b in zip(out, out[1:]))


async def test_flush_due_reports_the_flush_lag(storage: Storage) -> None:
    """The background flush reports the age of the oldest unflushed record it
    folded (the `fencepost_journal_flush_lag_seconds` gauge's event)."""
    seen: list[tuple[str, float]] = []
    j = Journal(storage, Limits(), JournalConfig(flush_seconds=0.0),
                events=lambda name, value=1.0: seen.append((name, value)))
    for i in range(3):
        await j.append(TENANT, "lag", fields(i), extra(f"t{i}"))
    j.dirty[(TENANT, "lag")][2] -= 5.0  # the first append is 5 s old
    assert await j.flush_due() == 1
    lags = [v for name, v in seen if name == "journal.flush_lag_seconds"]
    assert len(lags) == 1 and 5.0 <= lags[0] < 60.0
    assert len(await list_all(storage, _Keys(TENANT, "lag").tail)) == 0


async def test_a_skipped_flush_keeps_the_age_of_its_oldest_record(storage: Storage) -> None:
    """A flush skipped (another flusher holds the lease) is due again later,
    and the lag reported when it runs counts from the oldest append, not
    from the skip."""
    seen: list[tuple[str, float]] = []
    j = Journal(storage, Limits(), JournalConfig(flush_seconds=0.0),
                events=lambda name, value=1.0: seen.append((name, value)))
    await j.append(TENANT, "slow", fields(0), extra("t0"))
    j.dirty[(TENANT, "slow")][2] -= 5.0  # the append is 5 s old
    real_flush = j.flush

    async def held(tenant: str, agent: str) -> FlushOutcome:
        return FlushOutcome(0, 0, True)

    j.flush = held  # type: ignore[method-assign]
    assert await j.flush_due() == 1
    assert (TENANT, "slow") in j.dirty and not seen
    j.flush = real_flush  # type: ignore[method-assign]
    assert await j.flush_due() == 1
    lags = [v for name, v in seen if name == "journal.flush_lag_seconds"]
    assert len(lags) == 1 and 5.0 <= lags[0] < 60.0


#: every backend operation that writes (anything else only reads)
_WRITES = {"put", "delete", "put_if_absent", "put_if_version", "delete_if_version", "transact"}


async def test_a_read_with_nothing_to_flush_writes_nothing(storage: Storage) -> None:
    """Flush-on-read takes the lease only when the tail holds something: a
    read of a folded journal, or of an agent that never appended, makes no
    backend write (no lease put and delete per read)."""
    from fencepost_server.storage.counting import CountingStorage

    counting = CountingStorage(storage)
    j = Journal(counting, Limits())
    for i in range(3):
        await j.append(TENANT, "quiet", fields(i), extra(f"t{i}"))
    view = await j.read(TENANT, "quiet")  # folds the tail: this one writes
    assert view is not None and tags(view.data) == ["t0", "t1", "t2"]
    assert counting.calls["transact"] == 1
    for agent in ("quiet", "never"):
        counting.reset()
        view = await j.read(TENANT, agent)
        assert not _WRITES & set(counting.calls), dict(counting.calls)
        assert (view is None) == (agent == "never")
    counting.reset()
    assert await j.flush(TENANT, "quiet") == FlushOutcome(0, 0, False)
    assert not _WRITES & set(counting.calls), dict(counting.calls)


async def test_a_read_that_folded_the_tail_leaves_the_background_flusher_nothing(storage: Storage) -> None:
    """Flush-on-read folds what the agent's appends left in the tail; the
    background flusher then had the agent due still and spent a backend
    call finding its tail empty. An append that lands while the read runs
    keeps the agent due."""
    from fencepost_server.storage.counting import CountingStorage

    counting = CountingStorage(storage)
    j = Journal(counting, Limits(), JournalConfig(flush_seconds=0.0))
    await j.append(TENANT, "read", fields(0), extra("t0"))
    view = await j.read(TENANT, "read")
    assert view is not None and (TENANT, "read") not in j.dirty
    counting.reset()
    await j.flush_due()
    assert sum(counting.calls.values()) == 0

    real_list, real_flush = counting.list, j.flush
    armed = False

    async def flush(*args: Any, **kwargs: Any) -> FlushOutcome:
        nonlocal armed
        out = await real_flush(*args, **kwargs)
        armed = True
        return out

    async def append_during_the_read(*args: Any, **kwargs: Any) -> list[Item]:
        nonlocal armed
        out = await real_list(*args, **kwargs)
        if armed:  # once, after the flush, while the read lists the tail
            armed = False
            await j.append(TENANT, "read", fields(2), extra("during"))
        return out

    await j.append(TENANT, "read", fields(1), extra("t1"))
    counting.list = append_during_the_read  # type: ignore[method-assign]
    j.flush = flush  # type: ignore[method-assign]
    await j.read(TENANT, "read")
    assert (TENANT, "read") in j.dirty


async def test_a_read_that_finds_the_tail_folded_leaves_the_background_flusher_nothing(storage: Storage) -> None:
    """Another replica (or an earlier read) folded the agent's tail: a read
    that finds it empty clears the agent from this replica's due list too."""
    from fencepost_server.storage.counting import CountingStorage

    counting = CountingStorage(storage)
    j = Journal(counting, Limits(), JournalConfig(flush_seconds=0.0))
    other = Journal(storage, Limits(), JournalConfig(flush_seconds=0.0))
    await j.append(TENANT, "elsewhere", fields(0), extra("t0"))
    assert (await other.flush(TENANT, "elsewhere")).flushed == 1
    view = await j.read(TENANT, "elsewhere")
    assert view is not None and (TENANT, "elsewhere") not in j.dirty
    counting.reset()
    await j.flush_due()
    assert sum(counting.calls.values()) == 0
