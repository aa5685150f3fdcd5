"""Tenant B, authenticated, reaches nothing of tenant A's — whatever real ids,
keys, agent names and page tokens of A's it sends, on every service (a fuzzed
corpus) — and learns nothing of A's activity from its own version tokens."""

from __future__ import annotations

import asyncio
import base64
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

import fencepost
from fencepost import errors
from fencepost.v1 import journal_pb2, memory_pb2
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.domain.paging import PAGE_KEY_ITEM
from fencepost_server.storage import Storage
from fencepost_server.storage.memory import MemoryStorage
from tests.api.security_support import SERVICES, ManualClock, Rpc, reason_of, secs, struct, write_tokens

TURN = {"at": "2026-11-29T00:00:00Z", "sessionId": "s", "channelId": "c", "status": "completed"}


@pytest.fixture
async def two_tenants(tmp_path: Path, storage: Storage):  # type: ignore[no-untyped-def]
    settings = Settings(listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json"),
                        ledger_janitor_seconds=0.1, ledger_orphan_grace_seconds=0.1)
    app = App(settings, storage=storage)
    await app.start()
    target = f"127.0.0.1:{app.port}"
    async with fencepost.AsyncClient(target, token="token-tenant-a", timeout=20) as a, \
            fencepost.AsyncClient(target, token="token-tenant-b", timeout=20, retry=fencepost.NO_RETRY) as b:
        yield a, b
    await app.stop(grace=0.2)


async def _corpus_of_a(a: fencepost.AsyncClient) -> dict[str, list[Any]]:
    """Real ids of tenant A: sessions (one orphaned with an event pending),
    inbox ids, memory entries, journals, eval runs, KV keys."""
    c: dict[str, list[Any]] = {k: [] for k in ("agent", "session", "key", "inbox", "entry", "gen", "run")}
    for i in range(3):
        agent, key = f"agent-{i}", f"chan/{i}/é"
        c["agent"].append(agent)
        c["key"].append(key)
        info = await a.open_session(agent, key)
        c["session"].append(info.session_id)
        lease = await a.acquire_lease(info.session_id, "a-holder", ttl=30)
        c["gen"].append(lease.generation)
        await a.commit(info.session_id, lease.generation, 0, [b"a-secret-record"])
        c["inbox"].append((await a.deliver(b"a-secret-event", session_id=info.session_id)).inbox_id)
        c["entry"].append((await a.memory_append(agent, f"a secret fact {i}", about=["secret"])).id)
        await a.append_turn(agent, {**TURN, "title": "a secret turn"})
        await a.put_eval_run(agent, f"run-{i}", {"score": i})
        c["run"].append(f"run-{i}")
        await a.put(key, b"a-secret-value")
    # one orphan: lease released by force with its event still pending
    await a.release_lease(c["session"][0], c["gen"][0], force=True)
    return c


async def _leaked(call: Callable[[], Awaitable[Any]], *, empty: Callable[[Any], bool] = lambda r: not r) -> bool:
    """True when B got something of A's back (anything but NOT_FOUND / an empty answer)."""
    try:
        result = await call()
    except (errors.NotFound, errors.LeaseFenced, errors.InboxEntryGone, errors.SequenceMismatch):
        return False
    return not empty(result)


async def _collect(agen: Any) -> list[Any]:
    return [x async for x in agen]


async def test_tenant_b_reaches_nothing_of_tenant_a(two_tenants: Any, scaled: Callable[[int, int], int]) -> None:
    a, b = two_tenants
    c = await _corpus_of_a(a)
    rng = random.Random(11)
    attempts = scaled(1000, 240)
    leaks: list[str] = []

    def pick(kind: str) -> Any:
        return rng.choice(c[kind])

    probes: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
        ("get_session", lambda: _leaked(lambda: b.get_session(pick("session")))),
        ("resolve_session", lambda: _leaked(lambda: b.resolve_session(pick("agent"), pick("key")))),
        ("read_log", lambda: _leaked(lambda: _collect(b.read_log(pick("session"))))),
        ("list_inbox", lambda: _leaked(lambda: _collect(b.list_inbox(pick("session"))))),
        ("list_sessions", lambda: _leaked(lambda: _collect(b.list_sessions(pick("agent"))))),
        ("acquire", lambda: _leaked(lambda: b.acquire_lease(pick("session"), "b-holder", ttl=1))),
        ("commit", lambda: _leaked(lambda: b.commit(pick("session"), pick("gen"), 1, [b"b"],
                                                    consume=[pick("inbox")]))),
        ("release", lambda: _leaked(lambda: b.release_lease(pick("session"), pick("gen"), force=True),
                                    empty=lambda r: False)),
        ("deliver", lambda: _leaked(lambda: b.deliver(b"b", session_id=pick("session")))),
        ("fork", lambda: _leaked(lambda: b.fork(pick("session"), 1, "b-child"))),
        ("memory_search", lambda: _leaked(lambda: b.memory_search(pick("agent"), "secret"),
                                          empty=lambda r: not r.entries)),
        ("memory_list", lambda: _leaked(lambda: _collect(b.memory_list_all(pick("agent"))))),
        ("memory_forget", lambda: _leaked(lambda: b.memory_forget(pick("agent"), pick("entry")))),
        ("memory_pin", lambda: _leaked(lambda: b.memory_pin(pick("agent"), pick("entry")),
                                       empty=lambda r: not r.pinned)),
        ("memory_topics", lambda: _leaked(lambda: b.memory_topics(pick("agent")))),
        ("read_journal", lambda: _leaked(lambda: b.read_journal(pick("agent")))),
        ("list_eval_runs", lambda: _leaked(lambda: _collect(b.list_eval_runs(pick("agent"))))),
        ("get_eval_run", lambda: _leaked(lambda: b.get_eval_run(pick("agent"), pick("run")))),
        ("kv_get", lambda: _leaked(lambda: b.get(pick("key")))),
        ("kv_list", lambda: _leaked(lambda: _collect(b.list("")))),
    ]
    for i in range(attempts):
        name, probe = probes[i % len(probes)]
        if await probe():
            leaks.append(name)
    # The janitor runs every 0.1 s: B's long-poll must never be handed A's orphan.
    claimed = await b.claim_orphan("b-worker", ttl=5, wait=0.5)
    if claimed is not None:
        leaks.append("claim_orphan")
    assert leaks == []
    # A still sees its own data, untouched by B's attempts.
    s0 = await a.get_session(c["session"][0])
    assert s0.seq == 1 and [e.inbox_id async for e in a.list_inbox(c["session"][0])] == [c["inbox"][0]]
    assert len((await a.memory_search(c["agent"][0], "secret")).entries) == 1
    recovered = await a.claim_orphan("a-worker", ttl=5, wait=5)
    assert recovered is not None and recovered.session_id == c["session"][0]


async def test_service_role_cannot_import_memory(two_tenants: Any) -> None:
    _, b = two_tenants
    with pytest.raises(errors.PermissionDenied) as info:
        await b.memory_import("agent", [])
    assert info.value.code == "PERMISSION_DENIED"
    await asyncio.sleep(0)


# -- page tokens of every listing, and the version side channel ------------------

#: every listing RPC (each takes page_size / page_token and returns next_page_token)
LISTINGS = [
    "KvService/List", "KvService/ListKeys", "LedgerService/ListSessions", "LedgerService/ListInbox",
    "JournalService/ListArchives", "MemoryService/List", "MemoryService/Audit", "ScheduleService/ListReminders",
    "ScheduleService/DueReminders", "EvalService/ListEvalRuns", "EvalService/ListAbSamples",
]


def _paged_rpcs() -> set[str]:
    return {f"{s.name}/{m.name}" for s in SERVICES.values() for m in s.methods
            if "page_token" in m.input_type.fields_by_name}


async def _fill(rpc: Rpc, clock: ManualClock) -> dict[str, dict[str, Any]]:
    """At least two pages of page_size 1 in every listing of one tenant (the same
    names in every tenant); the request fields of each listing."""
    sessions = []
    for key in ("s1", "s2"):
        sid = (await rpc("LedgerService/OpenSession", agent="ag", session_key=key)).session.session_id
        gen = (await rpc("LedgerService/AcquireLease", session_id=sid, holder_id="h", ttl=secs(60))).lease.generation
        await rpc("LedgerService/Commit", session_id=sid, generation=gen, expected_seq=0, records=[b"r"])
        sessions.append((sid, gen))
    sid, gen = sessions[0]
    for i in range(2):
        await rpc("KvService/Put", key=f"k/{i}", value=b"v")
        await rpc("LedgerService/Deliver", session_id=sid, payload=b"e")
        await rpc("ScheduleService/CreateReminder", session_id=sid, generation=gen, prompt="p", after_seconds=1)
        await rpc("MemoryService/Append", agent_id="ag", content=f"fact {i}")
        await rpc("EvalService/PutEvalRun", agent="ag", run_id=f"run-{i}", snapshot=struct({"i": i}))
        await rpc("EvalService/PutAbSample", agent="ag", experiment="x", session_id=f"s{i}",
                  at=timestamp_pb2.Timestamp(seconds=1_800_000_000), sample=struct({"i": i}))
    clock.now += 10
    for i in range(6):  # 700-byte turns over a 1500-byte journal: archives on the read
        record = journal_pb2.TurnRecord(at=f"2026-11-29T00:00:{i:02d}Z", session_id="s", channel_id="c",
                                        status=journal_pb2.TURN_STATUS_COMPLETED, user_message="x" * 700)
        await rpc("JournalService/AppendTurn", agent="ag", record=record)
    await rpc("JournalService/ReadJournal", agent="ag")
    return {
        "KvService/List": {"prefix": "k/"}, "KvService/ListKeys": {"prefix": "k/"},
        "LedgerService/ListSessions": {"agent": "ag"}, "LedgerService/ListInbox": {"session_id": sid},
        "JournalService/ListArchives": {"agent": "ag"}, "MemoryService/List": {"agent_id": "ag"},
        "MemoryService/Audit": {"agent_id": "ag"}, "ScheduleService/ListReminders": {"session_id": sid},
        "ScheduleService/DueReminders": {"session_id": sid}, "EvalService/ListEvalRuns": {"agent": "ag"},
        "EvalService/ListAbSamples": {"agent": "ag", "experiment": "x"},
    }


async def _refused(rpc: Rpc, name: str, fields: dict[str, Any], token: str) -> str:
    """'PAGE_TOKEN_INVALID' when the listing refused the token; else what it listed."""
    try:
        page = await rpc(name, page_size=1, page_token=token, **fields)
    except grpc.aio.AioRpcError as exc:
        return reason_of(exc) if exc.code() == grpc.StatusCode.INVALID_ARGUMENT else exc.code().name
    return f"listed {len(page.ListFields())} fields"


def _tampered(token: str) -> str:
    mid = len(token) // 2
    return token[:mid] + ("A" if token[mid] != "A" else "B") + token[mid + 1:]


@pytest.fixture
async def two_tenant_channel(tmp_path: Path, storage: Storage):  # type: ignore[no-untyped-def]
    clock = ManualClock()
    settings = Settings(listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json"),
                        schedule_clock=clock, max_journal_bytes=1500)
    app = App(settings, storage=storage)
    await app.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        yield channel, clock
    await app.stop(grace=0.2)


async def test_page_tokens_are_bound_to_their_tenant_and_listing(two_tenant_channel: Any) -> None:
    channel, clock = two_tenant_channel
    assert set(LISTINGS) == _paged_rpcs(), "a listing is missing from this test"
    # Service tokens, as in normal traffic; operator tokens where the listing needs them (Audit).
    service = {"a": Rpc(channel, "token-tenant-a"), "b": Rpc(channel, "token-tenant-b")}
    operator = {"a": Rpc(channel, "token-operator-a"), "b": Rpc(channel, "token-operator-b")}
    fields_a, fields_b = await _fill(operator["a"], clock), await _fill(operator["b"], clock)
    outcomes: dict[str, dict[str, str]] = {}
    for name in LISTINGS:
        a, b = (operator["a"], operator["b"]) if name == "MemoryService/Audit" else (service["a"], service["b"])
        first = await a(name, page_size=1, **fields_a[name])
        token = first.next_page_token
        assert token, f"{name}: no second page to resume"
        assert (await a(name, page_size=1, page_token=token, **fields_a[name])).ListFields()
        outcomes[name] = {
            "foreign": await _refused(b, name, fields_b[name], token),
            "tampered": await _refused(a, name, fields_a[name], _tampered(token)),
            "truncated": await _refused(a, name, fields_a[name], token[:-3]),
            "garbage": await _refused(a, name, fields_a[name], "not-a-token"),
        }
    # The same tenant, another listing or other parameters: also refused.
    a = operator["a"]
    kv = (await a("KvService/List", page_size=1, prefix="k/")).next_page_token
    outcomes["other listing / parameters"] = {
        "Audit": await _refused(a, "MemoryService/Audit", {"agent_id": "ag"},
                                (await a("MemoryService/List", page_size=1, agent_id="ag")).next_page_token),
        "prefix": await _refused(a, "KvService/List", {"prefix": "k"}, kv),
        "validity": await _refused(
            a, "MemoryService/List", {"agent_id": "ag", "validity": memory_pb2.MEMORY_VALIDITY_FILTER_ALL},
            (await a("MemoryService/List", page_size=1, agent_id="ag")).next_page_token,
        ),
    }
    assert outcomes == {name: dict.fromkeys(cases, "PAGE_TOKEN_INVALID") for name, cases in outcomes.items()}
    # No position in the clear: the last key listed is nowhere in the token.
    raw = base64.urlsafe_b64decode(kv + "=" * (-len(kv) % 4))
    assert b"k/0" not in raw and "k/0" not in kv


async def test_versions_say_nothing_about_other_tenants_writes(two_tenant_channel: Any) -> None:
    channel, _ = two_tenant_channel
    a, b = Rpc(channel, "token-tenant-a"), Rpc(channel, "token-tenant-b")
    versions, gaps_expected = [], []
    for i in range(20):
        versions.append((await b("KvService/Put", key="mine", value=b"x")).version)
        for j in range(i):  # A writes i times between B's writes i and i+1
            await a("KvService/Put", key=f"busy/{j}", value=b"y")
        gaps_expected.append(i + 1)
    numbers = [int(v, 16) for v in versions]
    gaps = [later - earlier for earlier, later in zip(numbers, numbers[1:])]
    # A shared counter would make B's versions increase by exactly 1 + A's writes.
    assert all(len(v) == 32 for v in versions) and len(set(versions)) == len(versions)
    assert numbers != sorted(numbers)
    assert not any(gap == want for gap, want in zip(gaps, gaps_expected))


async def test_a_supplied_page_token_key_is_the_deployments(tmp_path: Path) -> None:
    """--page-token-key-file: servers given one key accept each other's tokens
    (whatever backend each runs on); a server with another key refuses them."""
    keys = {"one": "ab" * 32, "other": "cd" * 32}
    for name, hex_key in keys.items():
        (tmp_path / name).write_text(hex_key)
    apps = [App(Settings(listen="127.0.0.1:0", page_token_key_file=tmp_path / key), storage=MemoryStorage())
            for key in ("one", "one", "other")]
    for app in apps:
        await app.start()
    try:
        tokens = []
        for app in apps:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
                rpc = Rpc(channel)
                for i in range(3):
                    await rpc("KvService/Put", key=f"k/{i}", value=b"v")
                tokens.append((await rpc("KvService/List", prefix="k/", page_size=1)).next_page_token)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{apps[1].port}") as channel:
            rpc = Rpc(channel)
            resumed = await rpc("KvService/List", prefix="k/", page_size=1, page_token=tokens[0])
            assert [e.key for e in resumed.entries] == ["k/1"]
            assert await _refused(rpc, "KvService/List", {"prefix": "k/"}, tokens[2]) == "PAGE_TOKEN_INVALID"
        # the backend-kept key was never minted: the file's key is the only one
        assert await apps[0].storage.get(PAGE_KEY_ITEM) is None
    finally:
        for app in apps:
            await app.stop(grace=0.2)
