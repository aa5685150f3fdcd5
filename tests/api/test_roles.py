"""Who may call what. Every RPC of every service is called with the service
and the operator token of one tenant, on every backend, and each outcome is
checked against the policy below; the `Roles:` line of every RPC's proto
comment must state the same policy."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from fencepost.v1 import journal_pb2, kv_pb2, memory_pb2, store_api_pb2
from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.storage import Storage
from tests.api.security_support import (
    PROTO_DIR,
    ManualClock,
    Rpc,
    every_rpc,
    reason_of,
    secs,
    struct,
    write_tokens,
)

#: RPCs only the operator role may call (PERMISSION_DENIED for a service token).
OPERATOR_ONLY = {
    "MemoryService/Audit", "MemoryService/ReassertTrust", "MemoryService/Import",
    "AdminService/EraseAgent", "AdminService/EraseTenant", "AdminService/GetOperation",
}
#: Calls gated by a field rather than by the RPC: Append may set every trust
#: label but MEMORY_TRUST_OPERATOR, which only an operator may claim.
OPERATOR_ONLY_CASES = {"MemoryService/Append(trust=operator)"}

ROLE_TOKENS = {"service": "token-tenant-a", "operator": "token-operator-a"}


@dataclass
class Run:
    """One role's walk through every RPC, with the ids earlier calls returned."""

    rpc: Rpc
    role: str
    clock: ManualClock
    got: dict[str, Any] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def agent(self) -> str:
        return f"agent-{self.role}"

    async def call(self, case: str, keep: Callable[[Any], None] | None = None, **fields: Any) -> None:
        """Record the outcome of one call under `case` ("Service/Method" or a
        variant of it): "OK" or "CODE/REASON"."""
        name = case.split("(")[0]
        try:
            response = await self.rpc(name, **fields)
        except grpc.aio.AioRpcError as exc:
            self.outcomes[case] = f"{exc.code().name}/{reason_of(exc)}"
            return
        self.outcomes[case] = "OK"
        if keep is not None:
            keep(response)


def _turn(i: int) -> journal_pb2.TurnRecord:
    return journal_pb2.TurnRecord(at=f"2026-11-29T00:00:{i:02d}Z", session_id="s", channel_id="c",
                                  status=journal_pb2.TURN_STATUS_COMPLETED, user_message="x" * 700)


async def _walk(r: Run) -> None:
    """Every RPC at least once (Append also with the operator label), in an order that lets each succeed."""
    a, g = r.agent, r.got
    # KvService
    await r.call("KvService/Put", lambda x: g.update(v=x.version), key="k/1", value=b"v")
    await r.call("KvService/Get", key="k/1")
    await r.call("KvService/GetWithVersion", key="k/1")
    await r.call("KvService/PutIfAbsent", key="k/2", value=b"v")
    await r.call("KvService/PutIfVersion", lambda x: g.update(v=x.version), key="k/1", value=b"w",
                 expected_version=g["v"])
    await r.call("KvService/List", prefix="k/", page_size=1)
    await r.call("KvService/ListKeys", prefix="k/", page_size=1)
    await r.call("KvService/Txn", success_ops=[kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="k/3", value=b"t"))])
    await r.call("KvService/DeleteIfVersion", key="k/1", expected_version=g["v"])
    await r.call("KvService/Delete", key="k/2")
    # LedgerService
    await r.call("LedgerService/OpenSession", lambda x: g.update(sid=x.session.session_id), agent=a,
                 session_key="chan")
    sid = g["sid"]
    await r.call("LedgerService/ResolveSession", agent=a, session_key="chan")
    await r.call("LedgerService/GetSession", session_id=sid)
    await r.call("LedgerService/AcquireLease", lambda x: g.update(gen=x.lease.generation), session_id=sid,
                 holder_id="h", ttl=secs(60))
    gen = g["gen"]
    await r.call("LedgerService/RenewLease", session_id=sid, generation=gen, ttl=secs(60), holder_id="h")
    await r.call("LedgerService/Deliver", lambda x: g.update(inbox=x.inbox_id), session_id=sid, payload=b"e")
    await r.call("LedgerService/ListInbox", session_id=sid)
    await r.call("LedgerService/WatchInbox", session_id=sid, generation=gen, first_only=True)
    await r.call("LedgerService/Commit", session_id=sid, generation=gen, expected_seq=0, records=[b"r"],
                 consume_inbox_ids=[g["inbox"]])
    await r.call("LedgerService/ReadLog", session_id=sid, from_seq=1)
    await r.call("LedgerService/ListSessions", agent=a)
    await r.call("LedgerService/Fork", parent_session_id=sid, at_seq=1, child_session_key="child")
    # ScheduleService (a fake clock makes the reminder due at once)
    await r.call("ScheduleService/CreateReminder", lambda x: g.update(rem=x.reminder.id), session_id=sid,
                 generation=gen, prompt="check", after_seconds=1)
    r.clock.now += 10
    await r.call("ScheduleService/ListReminders", session_id=sid)
    await r.call("ScheduleService/DueReminders", session_id=sid)
    await r.call("ScheduleService/WatchDue", session_id=sid, generation=gen, first_only=True)
    await r.call("ScheduleService/Dispatch", session_id=sid, generation=gen, id=g["rem"])
    await r.call("ScheduleService/DeleteReminder", session_id=sid, generation=gen, id=g["rem"])
    await r.call("LedgerService/ReleaseLease", session_id=sid, generation=gen)
    await r.call("LedgerService/ClaimOrphan", holder_id="rescuer", ttl=secs(5), wait=secs(0), agent=a)
    await r.call("LedgerService/OpenSession", lambda x: g.update(doomed=x.session.session_id), agent=a,
                 session_key="doomed")
    await r.call("LedgerService/DeleteSession", session_id=g["doomed"])
    # JournalService (three large turns rotate the journal once it is read)
    for i in range(3):
        await r.call("JournalService/AppendTurn", agent=a, record=_turn(i))
    await r.call("JournalService/ReadJournal", agent=a)
    await r.call("JournalService/ListArchives", lambda x: g.update(archive=x.archives[0].name), agent=a)
    await r.call("JournalService/ReadArchive", agent=a, name=g.get("archive", "none"))
    # StoreApiService
    turn = store_api_pb2.MemoryAppendPayload(agent=a, record=_turn(9))
    await r.call("StoreApiService/Call", v=1, call="memory.append", memory_append=turn)
    # MemoryService
    own = memory_pb2.MemoryProvenance(trust=memory_pb2.MEMORY_TRUST_OWN)
    await r.call("MemoryService/Append", lambda x: g.update(entry=x.entry.id), agent_id=a, content="deploys on friday",
                 about=["deploy"], provenance=own)
    operator = memory_pb2.MemoryProvenance(trust=memory_pb2.MEMORY_TRUST_OPERATOR)
    await r.call("MemoryService/Append(trust=operator)", agent_id=a, content="said by ops", provenance=operator)
    entry = g["entry"]
    await r.call("MemoryService/List", agent_id=a)
    await r.call("MemoryService/Search", agent_id=a, query="deploy")
    await r.call("MemoryService/Pin", agent_id=a, id=entry)
    await r.call("MemoryService/Pinned", agent_id=a)
    await r.call("MemoryService/Unpin", agent_id=a, id=entry)
    await r.call("MemoryService/Topics", agent_id=a)
    await r.call("MemoryService/BuildInjection", agent_id=a)
    await r.call("MemoryService/Audit", agent_id=a)
    await r.call("MemoryService/ReassertTrust", agent_id=a, id=entry, trust=memory_pb2.MEMORY_TRUST_USER)
    imported = memory_pb2.MemoryEntry(id="imported-1", content="from the old store",
                                      created_at=timestamp_pb2.Timestamp(seconds=1_700_000_000))
    await r.call("MemoryService/Import", agent_id=a, entries=[imported])
    await r.call("MemoryService/Forget", agent_id=a, id=entry)
    # EvalService
    await r.call("EvalService/PutEvalRun", agent=a, run_id="run-1", snapshot=struct({"score": 1}))
    await r.call("EvalService/GetEvalRun", agent=a, run_id="run-1")
    await r.call("EvalService/ListEvalRuns", agent=a)
    await r.call("EvalService/PutAbSample", agent=a, experiment="x", session_id=sid,
                 at=timestamp_pb2.Timestamp(seconds=1_800_000_000), sample=struct({"arm": "b"}))
    await r.call("EvalService/ListAbSamples", agent=a, experiment="x")
    await r.call("EvalService/PutAbSnapshot", agent=a, snapshot=struct({"arms": 2}))
    await r.call("EvalService/GetAbSnapshot", agent=a)
    await r.call("EvalService/DeleteEvalRun", agent=a, run_id="run-1")
    # AdminService, last: the tenant-wide erasure removes everything above
    await r.call("AdminService/EraseAgent", lambda x: g.update(op=x.operation.name), agent=f"{a}-gone")
    await r.call("AdminService/GetOperation", name=g.get("op", "operations/erase-none"))
    await r.call("AdminService/EraseTenant")


def expected(role: str, cases: set[str]) -> dict[str, str]:
    gated = OPERATOR_ONLY | OPERATOR_ONLY_CASES
    return {c: "PERMISSION_DENIED/PERMISSION_DENIED" if role == "service" and c in gated else "OK" for c in cases}


@pytest.fixture
async def one_tenant(tmp_path: Path, storage: Storage) -> AsyncIterator[tuple[App, ManualClock]]:
    clock = ManualClock()
    settings = Settings(listen="127.0.0.1:0", tokens_file=write_tokens(tmp_path / "tokens.json"),
                        schedule_clock=clock, max_journal_bytes=1500)
    app = App(settings, storage=storage)
    await app.start()
    yield app, clock
    await app.stop(grace=0.2)


async def test_role_matrix_every_rpc_both_roles(one_tenant: tuple[App, ManualClock]) -> None:
    app, clock = one_tenant
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        for role, token in ROLE_TOKENS.items():
            run = Run(Rpc(channel, token), role, clock)
            await _walk(run)
            called = {case.split("(")[0] for case in run.outcomes}
            assert called == every_rpc(), f"RPCs missing from the matrix: {sorted(every_rpc() - called)}"
            assert run.outcomes == expected(role, set(run.outcomes)), role


def _roles_lines() -> dict[str, str]:
    """`Service/Method` -> the `Roles:` sentence of its proto comment."""
    out: dict[str, str] = {}
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        service, comment = "", []
        for line in proto.read_text().splitlines():
            stripped = line.strip()
            if m := re.match(r"service (\w+)", stripped):
                service = m.group(1)
            if stripped.startswith("//"):
                comment.append(stripped[2:].strip())
                continue
            if m := re.match(r"rpc (\w+)\(", stripped):
                text = " ".join(comment)
                roles = re.search(r"Roles: (.*?)(?:\.(?:\s|$)|$)", text)
                out[f"{service}/{m.group(1)}"] = roles.group(1) if roles else ""
            comment = []
    return out


def test_proto_comments_state_each_rpcs_roles() -> None:
    lines = _roles_lines()
    assert set(lines) == every_rpc()
    missing = sorted(name for name, text in lines.items() if not text)
    assert missing == [], f"RPC comments without a 'Roles:' sentence: {missing}"
    for name, text in lines.items():
        if name in OPERATOR_ONLY:
            assert text.startswith("operator only"), (name, text)
        else:
            assert text.startswith("service and operator"), (name, text)
    assert "the operator trust label (provenance.trust) needs the operator role" in lines["MemoryService/Append"]


def test_readme_security_table_names_every_rpc_and_its_roles() -> None:
    readme = (PROTO_DIR.parents[2] / "README.md").read_text()
    section = readme.split("## Security: who may do what", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, str] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 4 and cells[0].endswith("Service"):
            for method in re.findall(r"\b([A-Z]\w+)\b(?: \([^)]*\))?", cells[1]):
                listed[f"{cells[0]}/{method}"] = cells[2]
    assert set(listed) == every_rpc()
    assert {name for name, service_role in listed.items() if service_role == "no"} == OPERATOR_ONLY
