"""PERSISTENCE_UNCERTAIN is declared exactly where a call can leave a write of
unknown outcome.

Only a backend write can end uncertain (a read that fails is
BACKEND_UNAVAILABLE, tests/faults.py), so with every write failing as
uncertain, one representative call of each RPC shows which side it is on:
an RPC that declares the reason returns it, one that does not declare it
answers as usual (or, when a write of its own bookkeeping was uncertain, as
BACKEND_UNAVAILABLE: a read is simply retried). Every RPC of every service
needs a probe here, so a new RPC cannot skip the check. Each probe runs on a fresh server whose page-token
secret is not stored yet, so a listing's first use of a token is covered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fencepost import contract
from fencepost.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    evals_pb2,
    evals_pb2_grpc,
    journal_pb2,
    journal_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    ledger_pb2,
    ledger_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    schedule_pb2,
    schedule_pb2_grpc,
    store_api_pb2,
    store_api_pb2_grpc,
)
from fencepost_server.domain.paging import PAGE_KEY_ITEM
from fencepost_server.storage import PersistenceUncertain
from fencepost_server.storage.memory import MemoryStorage
from tests.conftest import running
from tests.faults import FaultyStorage

T = TypeVar("T")
MODULES = (admin_pb2, evals_pb2, journal_pb2, kv_pb2, ledger_pb2, memory_pb2, schedule_pb2, store_api_pb2)
#: background writers off (as tests/fuzz/harness.py): only the probe writes
QUIET = {"ledger_janitor": False, "journal_flush_seconds": 1e9, "journal_flush_bytes": 1 << 40,
         "request_sweep_seconds": 1e9}
AGENT = "probe-agent"
#: a probe's server settings besides QUIET: ClaimOrphan needs the janitor to find the orphan
SETTINGS: dict[str, dict[str, Any]] = {
    "LedgerService/ClaimOrphan": {"ledger_janitor": True, "ledger_janitor_seconds": 0.05,
                                  "ledger_orphan_grace_seconds": 0.05},
}


class UncertainWrites(FaultyStorage):
    """Reads pass; while armed, every write is applied and then raises
    PersistenceUncertain (its response lost), as a backend's can."""

    def __init__(self, inner: MemoryStorage) -> None:
        super().__init__(inner, 0, fail=0.0, timeout=0.0, lose=0.0)
        self.armed = False

    async def _write(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        result = await call()
        if self.armed:
            self._count("lose", name)
            raise PersistenceUncertain(f"injected lost response of {name}")
        return result

    async def close(self) -> None:
        pass  # the seeding server stops; the data outlives it


@dataclass
class Stubs:
    channel: grpc.aio.Channel
    names: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, service: str) -> Any:
        module = {
            "admin": admin_pb2_grpc.AdminServiceStub, "evals": evals_pb2_grpc.EvalServiceStub,
            "journal": journal_pb2_grpc.JournalServiceStub, "kv": kv_pb2_grpc.KvServiceStub,
            "ledger": ledger_pb2_grpc.LedgerServiceStub, "memory": memory_pb2_grpc.MemoryServiceStub,
            "schedule": schedule_pb2_grpc.ScheduleServiceStub, "store": store_api_pb2_grpc.StoreApiServiceStub,
        }[service]
        return module(self.channel)


def _struct(**kv: Any) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(kv)
    return out


def _turn() -> journal_pb2.TurnRecord:
    return journal_pb2.TurnRecord(
        at="2024-05-01T12:00:00Z", session_id="s1", channel_id="c1", status=journal_pb2.TURN_STATUS_COMPLETED
    )


TTL = duration_pb2.Duration(seconds=60)
AT = timestamp_pb2.Timestamp(seconds=1_714_564_800)


async def _stream(stream: Any) -> None:
    """Reads a server stream to its end; a deadline (a watch waiting) is no error."""
    try:
        async for _ in stream:
            pass
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise


async def _seed(s: Stubs) -> None:
    """Something for every read to find (a session holding events, records,
    reminders, memory entries, a journal turn, eval runs, KV keys)."""
    n = s.names
    for i in range(3):
        await s.kv.Put(kv_pb2.PutRequest(key=f"k{i}", value=b"v"))
    got = await s.kv.GetWithVersion(kv_pb2.GetWithVersionRequest(key="k0"))
    n["version"] = got.version
    opened = await s.ledger.OpenSession(ledger_pb2.OpenSessionRequest(agent=AGENT, session_key="main"))
    sid = n["sid"] = opened.session.session_id
    lease = await s.ledger.AcquireLease(ledger_pb2.AcquireLeaseRequest(session_id=sid, holder_id="h", ttl=TTL))
    gen = n["gen"] = lease.lease.generation
    await s.ledger.Commit(ledger_pb2.CommitRequest(session_id=sid, generation=gen, expected_seq=0, records=[b"r1"]))
    for i in range(2):
        await s.ledger.Deliver(ledger_pb2.DeliverRequest(session_id=sid, payload=b"e%d" % i))
    inbox = await s.ledger.ListInbox(ledger_pb2.ListInboxRequest(session_id=sid))
    n["inbox_id"] = inbox.events[0].inbox_id
    for i in range(2):
        rem = await s.schedule.CreateReminder(
            schedule_pb2.CreateReminderRequest(session_id=sid, generation=gen, prompt=f"p{i}", after_seconds=1)
        )
        n["reminder"] = rem.reminder.id
    other = await s.ledger.OpenSession(ledger_pb2.OpenSessionRequest(agent=AGENT, session_key="spare"))
    n["spare"] = other.session.session_id
    orphan = await s.ledger.OpenSession(ledger_pb2.OpenSessionRequest(agent=AGENT, session_key="orphan"))
    await s.ledger.Deliver(ledger_pb2.DeliverRequest(session_id=orphan.session.session_id, payload=b"o"))
    for i in range(2):
        appended = await s.memory.Append(memory_pb2.MemoryServiceAppendRequest(
            agent_id=AGENT, content=f"fact {i}", kind=memory_pb2.MEMORY_KIND_SEMANTIC, about=["topic"]
        ))
        n[f"entry{i}"] = n["entry"] = appended.entry.id
    await s.memory.Pin(memory_pb2.MemoryServicePinRequest(agent_id=AGENT, id=n["entry"]))
    for _ in range(2):  # the seeding server rotates at once: an archive, then a live journal
        await s.journal.AppendTurn(journal_pb2.AppendTurnRequest(agent=AGENT, record=_turn()))
        await _stream(s.journal.ReadJournal(journal_pb2.ReadJournalRequest(agent=AGENT)))
    archives = await s.journal.ListArchives(journal_pb2.ListArchivesRequest(agent=AGENT))
    n["archive"] = archives.archives[0].name
    for i in range(3):
        await s.evals.PutEvalRun(evals_pb2.PutEvalRunRequest(agent=AGENT, run_id=f"r{i}", snapshot=_struct(i=i)))
        await s.evals.PutAbSample(evals_pb2.PutAbSampleRequest(
            agent=AGENT, experiment="x", session_id=f"s{i}", at=AT, sample=_struct(i=i)
        ))
    await s.evals.PutAbSnapshot(evals_pb2.PutAbSnapshotRequest(agent=AGENT, snapshot=_struct(a=1)))
    erasing = await s.admin.EraseAgent(admin_pb2.EraseAgentRequest(agent="gone-agent"))
    n["operation"] = erasing.operation.name


async def _pages(first: Callable[[str], Awaitable[Any]]) -> None:
    """A first page of one entry, then the page its token resumes."""
    page = await first("")
    assert page.next_page_token, "the probe needs a second page"
    await first(page.next_page_token)


def _probes(s: Stubs) -> dict[str, Callable[[], Awaitable[Any]]]:
    n = s.names
    sid, gen = n["sid"], n["gen"]
    L, M, E, J, K, S = ledger_pb2, memory_pb2, evals_pb2, journal_pb2, kv_pb2, schedule_pb2
    short = {"timeout": 0.5}
    return {
        "AdminService/EraseAgent": lambda: s.admin.EraseAgent(admin_pb2.EraseAgentRequest(agent="other-agent")),
        "AdminService/EraseTenant": lambda: s.admin.EraseTenant(admin_pb2.EraseTenantRequest()),
        "AdminService/GetOperation": lambda: s.admin.GetOperation(admin_pb2.GetOperationRequest(name=n["operation"])),
        "EvalService/PutEvalRun": lambda: s.evals.PutEvalRun(E.PutEvalRunRequest(agent=AGENT, run_id="n", snapshot=_struct())),
        "EvalService/GetEvalRun": lambda: s.evals.GetEvalRun(E.GetEvalRunRequest(agent=AGENT, run_id="r0")),
        "EvalService/DeleteEvalRun": lambda: s.evals.DeleteEvalRun(E.DeleteEvalRunRequest(agent=AGENT, run_id="r0")),
        # the first page prunes past the window: a write
        "EvalService/ListEvalRuns": lambda: s.evals.ListEvalRuns(
            E.ListEvalRunsRequest(agent=AGENT, page_size=1, history_window=1)),
        "EvalService/PutAbSample": lambda: s.evals.PutAbSample(E.PutAbSampleRequest(
            agent=AGENT, experiment="x", session_id="n", at=AT, sample=_struct())),
        "EvalService/ListAbSamples": lambda: _pages(lambda t: s.evals.ListAbSamples(
            E.ListAbSamplesRequest(agent=AGENT, experiment="x", page_size=1, page_token=t))),
        "EvalService/PutAbSnapshot": lambda: s.evals.PutAbSnapshot(E.PutAbSnapshotRequest(agent=AGENT, snapshot=_struct())),
        "EvalService/GetAbSnapshot": lambda: s.evals.GetAbSnapshot(E.GetAbSnapshotRequest(agent=AGENT)),
        "JournalService/AppendTurn": lambda: s.journal.AppendTurn(J.AppendTurnRequest(agent=AGENT, record=_turn())),
        "JournalService/ReadJournal": lambda: _stream(s.journal.ReadJournal(J.ReadJournalRequest(agent=AGENT))),
        "JournalService/ListArchives": lambda: s.journal.ListArchives(J.ListArchivesRequest(agent=AGENT, page_size=1)),
        "JournalService/ReadArchive": lambda: _stream(s.journal.ReadArchive(J.ReadArchiveRequest(agent=AGENT, name=n["archive"]))),
        "KvService/Put": lambda: s.kv.Put(K.PutRequest(key="n", value=b"v")),
        "KvService/Get": lambda: s.kv.Get(K.GetRequest(key="k0")),
        "KvService/Delete": lambda: s.kv.Delete(K.DeleteRequest(key="k0")),
        "KvService/List": lambda: _pages(lambda t: s.kv.List(K.ListRequest(prefix="k", page_size=1, page_token=t))),
        "KvService/GetWithVersion": lambda: s.kv.GetWithVersion(K.GetWithVersionRequest(key="k0")),
        "KvService/PutIfAbsent": lambda: s.kv.PutIfAbsent(K.PutIfAbsentRequest(key="n", value=b"v")),
        "KvService/PutIfVersion": lambda: s.kv.PutIfVersion(
            K.PutIfVersionRequest(key="k0", value=b"w", expected_version=n["version"])),
        "KvService/DeleteIfVersion": lambda: s.kv.DeleteIfVersion(
            K.DeleteIfVersionRequest(key="k0", expected_version=n["version"])),
        "KvService/ListKeys": lambda: _pages(lambda t: s.kv.ListKeys(K.ListKeysRequest(prefix="k", page_size=1, page_token=t))),
        "KvService/Txn": lambda: s.kv.Txn(K.TxnRequest(success_ops=[K.TxnOp(put=K.KeyValuePut(key="n", value=b"v"))])),
        "LedgerService/OpenSession": lambda: s.ledger.OpenSession(L.OpenSessionRequest(agent=AGENT, session_key="new")),
        "LedgerService/ResolveSession": lambda: s.ledger.ResolveSession(
            L.ResolveSessionRequest(agent=AGENT, session_key="main")),
        "LedgerService/GetSession": lambda: s.ledger.GetSession(L.GetSessionRequest(session_id=sid)),
        "LedgerService/ListSessions": lambda: _pages(lambda t: s.ledger.ListSessions(
            L.ListSessionsRequest(agent=AGENT, page_size=1, page_token=t))),
        "LedgerService/Fork": lambda: s.ledger.Fork(
            L.ForkRequest(parent_session_id=sid, at_seq=1, child_session_key="child")),
        "LedgerService/AcquireLease": lambda: s.ledger.AcquireLease(
            L.AcquireLeaseRequest(session_id=n["spare"], holder_id="h", ttl=TTL)),
        "LedgerService/RenewLease": lambda: s.ledger.RenewLease(
            L.RenewLeaseRequest(session_id=sid, generation=gen, ttl=TTL, holder_id="h")),
        "LedgerService/ReleaseLease": lambda: s.ledger.ReleaseLease(
            L.ReleaseLeaseRequest(session_id=sid, generation=gen, force=True)),
        "LedgerService/Commit": lambda: s.ledger.Commit(
            L.CommitRequest(session_id=sid, generation=gen, expected_seq=1, records=[b"r2"])),
        "LedgerService/ReadLog": lambda: _stream(s.ledger.ReadLog(L.ReadLogRequest(session_id=sid))),
        "LedgerService/Deliver": lambda: s.ledger.Deliver(L.DeliverRequest(session_id=sid, payload=b"e")),
        "LedgerService/ListInbox": lambda: _pages(lambda t: s.ledger.ListInbox(
            L.ListInboxRequest(session_id=sid, page_size=1, page_token=t))),
        "LedgerService/WatchInbox": lambda: _stream(s.ledger.WatchInbox(
            L.WatchInboxRequest(session_id=sid, generation=gen), **short)),
        "LedgerService/ClaimOrphan": lambda: s.ledger.ClaimOrphan(
            L.ClaimOrphanRequest(holder_id="h", ttl=TTL, agent=AGENT, wait=duration_pb2.Duration(seconds=5)),
            timeout=10),
        "LedgerService/DeleteSession": lambda: s.ledger.DeleteSession(
            L.DeleteSessionRequest(session_id=n["spare"])),
        "MemoryService/Append": lambda: s.memory.Append(M.MemoryServiceAppendRequest(
            agent_id=AGENT, content="new", kind=M.MEMORY_KIND_SEMANTIC)),
        "MemoryService/List": lambda: _pages(lambda t: s.memory.List(
            M.MemoryServiceListRequest(agent_id=AGENT, page_size=1, page_token=t))),
        "MemoryService/Search": lambda: s.memory.Search(M.MemoryServiceSearchRequest(agent_id=AGENT, query="fact")),
        "MemoryService/Forget": lambda: s.memory.Forget(M.MemoryServiceForgetRequest(agent_id=AGENT, id=n["entry"])),
        "MemoryService/Audit": lambda: _pages(lambda t: s.memory.Audit(
            M.MemoryServiceAuditRequest(agent_id=AGENT, page_size=1, page_token=t))),
        "MemoryService/ReassertTrust": lambda: s.memory.ReassertTrust(M.MemoryServiceReassertTrustRequest(
            agent_id=AGENT, id=n["entry"], trust=M.MEMORY_TRUST_OPERATOR)),
        "MemoryService/Pin": lambda: s.memory.Pin(M.MemoryServicePinRequest(agent_id=AGENT, id=n["entry0"])),
        "MemoryService/Unpin": lambda: s.memory.Unpin(M.MemoryServiceUnpinRequest(agent_id=AGENT, id=n["entry"])),
        "MemoryService/Pinned": lambda: s.memory.Pinned(M.MemoryServicePinnedRequest(agent_id=AGENT)),
        "MemoryService/Topics": lambda: s.memory.Topics(M.MemoryServiceTopicsRequest(agent_id=AGENT)),
        "MemoryService/Import": lambda: s.memory.Import(M.MemoryServiceImportRequest(agent_id=AGENT, entries=[
            M.MemoryEntry(id="imported-1", content="imported", created_at=AT)])),
        "MemoryService/BuildInjection": lambda: s.memory.BuildInjection(M.MemoryServiceBuildInjectionRequest(agent_id=AGENT)),
        "ScheduleService/CreateReminder": lambda: s.schedule.CreateReminder(S.CreateReminderRequest(
            session_id=sid, generation=gen, prompt="p", after_seconds=1)),
        "ScheduleService/DeleteReminder": lambda: s.schedule.DeleteReminder(S.DeleteReminderRequest(
            session_id=sid, generation=gen, id=n["reminder"])),
        "ScheduleService/ListReminders": lambda: _pages(lambda t: s.schedule.ListReminders(
            S.ListRemindersRequest(session_id=sid, page_size=1, page_token=t))),
        "ScheduleService/DueReminders": lambda: s.schedule.DueReminders(
            S.DueRemindersRequest(session_id=sid, page_size=1)),
        "ScheduleService/Dispatch": lambda: s.schedule.Dispatch(S.DispatchRequest(
            session_id=sid, generation=gen, id=n["reminder"])),
        "ScheduleService/WatchDue": lambda: _stream(s.schedule.WatchDue(
            S.WatchDueRequest(session_id=sid, generation=gen), **short)),
        "StoreApiService/Call": lambda: s.store.Call(store_api_pb2.CallRequest(
            v=1, call="memory.append", memory_append=store_api_pb2.MemoryAppendPayload(agent=AGENT, record=_turn()))),
    }


def _every_rpc() -> list[str]:
    return sorted(
        f"{service.name}/{method.name}"
        for module in MODULES for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    )


def _reason(exc: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    if status is None:
        return ""
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return info.reason


@contextlib.asynccontextmanager
async def _server(storage: UncertainWrites, **settings: Any) -> AsyncIterator[Stubs]:
    async with running(storage, **{**QUIET, **settings}) as srv:  # type: ignore[arg-type]
        async with grpc.aio.insecure_channel(srv.target) as channel:
            yield Stubs(channel)


def test_every_rpc_has_a_probe() -> None:
    probes = _probes(Stubs(None, {"sid": "", "gen": 0}))  # type: ignore[arg-type]
    assert sorted(probes) == _every_rpc()


@pytest.mark.parametrize("rpc", _every_rpc())
async def test_uncertain_exactly_where_declared(rpc: str) -> None:
    declared = "PERSISTENCE_UNCERTAIN" in (contract.declared_reasons(f"/fencepost.v1.{rpc}") or ())
    storage = UncertainWrites(MemoryStorage())
    async with _server(storage, max_journal_bytes=64) as s:
        await _seed(s)
        names = s.names
    await storage.inner.delete(PAGE_KEY_ITEM)  # minted again by the probe's server: a first use
    async with _server(storage, **SETTINGS.get(rpc, {})) as s:
        s.names.update(names)
        probe = _probes(s)[rpc]
        storage.armed = True
        try:
            await probe()
            reason = ""
        except grpc.aio.AioRpcError as exc:
            reason = _reason(exc) or exc.code().name
        finally:
            storage.armed = False
    await storage.inner.close()
    writes = sorted({name for _, name in storage.injected_by_call})
    if declared:
        assert reason == "PERSISTENCE_UNCERTAIN", f"{rpc} declares PERSISTENCE_UNCERTAIN; its probe got {reason!r}"
    else:
        assert reason != "PERSISTENCE_UNCERTAIN", (
            f"{rpc} returned PERSISTENCE_UNCERTAIN (writes tried: {writes}) but does not declare it"
        )
        # a read whose own bookkeeping write ended uncertain may fail as a read does
        assert reason == "" or (reason == "BACKEND_UNAVAILABLE" and writes), (
            f"{rpc}'s probe failed with {reason}: fix the probe")
