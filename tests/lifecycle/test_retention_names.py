"""Retention reaches agents and tenants whose key segment is hashed.

A name whose encoded segment is over 256 bytes (a long or non-ASCII agent or
tenant) is stored under `sha256:<hex>`, so the walk cannot read the name back
from the key. The sweeps that only need the key prefix (journal archives,
commit markers) run on the prefix; idle sessions take the agent from their
session id and the tenant from the tenants the server knows."""

from __future__ import annotations

from pathlib import Path

from fencepost.keys import encode_segment

from fencepost_server.app import App
from fencepost_server.config import Settings
from fencepost_server.domain.journal import Journal, JournalConfig
from fencepost_server.domain.ledger import Ledger
from fencepost_server.domain.limits import Limits
from fencepost_server.domain.retention import Retention, RetentionConfig
from fencepost_server.storage import Storage
from fencepost_server.storage.memory import MemoryStorage
from tests.api.security_support import write_spiffe, write_tokens
from tests.domain.test_journal import extra, fields
from tests.domain.test_ledger import FakeClock
from tests.raw_store import raw_keys_naming

HOUR = 3600.0
LONG_AGENT = "агент-памяти-" * 8  # 192 UTF-8 bytes (the ledger allows 256), 544 encoded: hashed
LONG_TENANT = "mandant-" + "ü" * 90  # ~550 bytes encoded: hashed
SHORT = "tenant"


def _config() -> RetentionConfig:
    return RetentionConfig(idle_session_seconds=2 * HOUR, archive_seconds=2 * HOUR, commit_marker_seconds=2 * HOUR)


async def _rotate(journal: Journal, tenant: str, agent: str, tag: str) -> None:
    for i in range(12):
        await journal.append(tenant, agent, fields(i), extra(f"{tag}{i}"))
    await journal.flush(tenant, agent)


async def _old_and_new(storage: Storage, tenant: str, agent: str) -> tuple[Ledger, Journal, FakeClock, dict[str, str]]:
    """Three hours ago: an idle session, a held session with a commit marker,
    two archives. Now: one more archive and a fresh session."""
    assert encode_segment(tenant).startswith("sha256:") or encode_segment(agent).startswith("sha256:")
    clock = FakeClock()
    ledger = Ledger(storage, clock=clock)
    journal = Journal(storage, Limits(), JournalConfig(max_journal_bytes=600), clock=clock)

    async def session(key: str) -> str:
        sid = (await ledger.open(tenant, agent, key))[0].session_id
        lease = await ledger.acquire(tenant, sid, "h", ttl=5)
        await ledger.commit(tenant, sid, lease.generation, 0, [b"r"], commit_id=f"{key}-c")
        await ledger.release(tenant, sid, lease.generation)
        return sid

    sids = {"idle": await session("idle"), "held": await session("held")}
    await _rotate(journal, tenant, agent, "old")
    await _rotate(journal, tenant, agent, "old2")
    clock.now += 3 * HOUR
    await ledger.acquire(tenant, sids["held"], "h2", ttl=60)  # held: not idle, but its marker is old
    sids["fresh"] = await session("fresh")
    await _rotate(journal, tenant, agent, "new")
    return ledger, journal, clock, sids


async def _archives(journal: Journal, tenant: str, agent: str) -> list[str]:
    return [a.name for a in (await journal.list_archives(tenant, agent)).archives]


async def _markers(storage: Storage, sid: str) -> list[str]:
    return [k for k in raw_keys_naming(storage, sid) if "/cm/" in k]


async def test_old_archives_of_a_long_non_ascii_agent_are_expired(storage: Storage) -> None:
    ledger, journal, clock, sids = await _old_and_new(storage, SHORT, LONG_AGENT)
    before = await _archives(journal, SHORT, LONG_AGENT)
    assert len(before) >= 3 and await _markers(storage, sids["held"])

    counts = await Retention(storage, ledger, journal, _config(), clock=clock).sweep_pass()

    after = await _archives(journal, SHORT, LONG_AGENT)
    assert counts.archives_erased == len(before) - len(after) >= 2 and len(after) >= 1
    assert counts.commit_markers_erased >= 1 and not await _markers(storage, sids["held"])
    assert counts.sessions_erased == 1 and not raw_keys_naming(storage, sids["idle"])
    assert counts.sessions_waiting == 1  # the held one
    for kept in ("held", "fresh"):
        assert (await ledger.get(SHORT, sids[kept])).session_id == sids[kept]


async def test_a_long_tenant_is_swept_when_the_server_knows_it(storage: Storage) -> None:
    ledger, journal, clock, sids = await _old_and_new(storage, LONG_TENANT, LONG_AGENT)
    before = await _archives(journal, LONG_TENANT, LONG_AGENT)

    retention = Retention(storage, ledger, journal, _config(), clock=clock, tenants=lambda: [SHORT, LONG_TENANT])
    counts = await retention.sweep_pass()

    after = await _archives(journal, LONG_TENANT, LONG_AGENT)
    assert counts.archives_erased == len(before) - len(after) >= 2 and len(after) >= 1
    assert not await _markers(storage, sids["held"])
    assert counts.sessions_erased == 1 and not raw_keys_naming(storage, sids["idle"])
    assert (await ledger.get(LONG_TENANT, sids["fresh"])).session_id == sids["fresh"]


async def test_an_unknown_long_tenant_still_loses_its_archives_and_markers(storage: Storage) -> None:
    """A hashed tenant the server has no identity for: archives and markers go
    (they need no name); its idle session cannot be erased (the tombstone
    records the tenant for the janitor) and is counted as waiting."""
    ledger, journal, clock, sids = await _old_and_new(storage, LONG_TENANT, "a")
    before = await _archives(journal, LONG_TENANT, "a")

    counts = await Retention(storage, ledger, journal, _config(), clock=clock).sweep_pass()

    after = await _archives(journal, LONG_TENANT, "a")
    assert counts.archives_erased == len(before) - len(after) >= 2
    assert not await _markers(storage, sids["held"])
    assert counts.sessions_erased == 0 and counts.sessions_waiting == 2  # idle (tenant unknown), held
    assert (await ledger.get(LONG_TENANT, sids["idle"])).session_id == sids["idle"]


def test_the_server_knows_its_tenants_from_the_identity_files(tmp_path: Path) -> None:
    """What retention is handed: every tenant a token or SPIFFE id maps to, and
    the default tenant."""
    tokens = write_tokens(tmp_path / "tokens.json", {"tok-1": (LONG_TENANT, "service"), "tok-2": ("b", "operator")})
    spiffe = write_spiffe(tmp_path / "spiffe.json", {"spiffe://x/ns/a/sa/s": ("c", "service")})
    app = App(Settings(listen="127.0.0.1:0", tokens_file=tokens, spiffe_map=spiffe, trust_xfcc=True),
              storage=MemoryStorage())
    assert app.known_tenants() >= {LONG_TENANT, "b", "c"}
    assert App(Settings(listen="127.0.0.1:0"), storage=MemoryStorage()).known_tenants() == {
        Settings().default_tenant
    }
