"""The phases of an erasure operation, one bounded step at a time (the
operation, its claim and its marker: erasure.py, whose docstring describes
the phases). Each step asks `claim_held` before it deletes what it listed,
so a replica that stalled past its claim deletes nothing written after
`done` (erasure.py, `_Claim`)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

from fencepost.keys import encode_segment

from ..storage import Storage
from .errors import NotFound
from .keys import GLOBAL_PREFIX, TenantKeys
from .ledger import Ledger
from .ledger.layout import (
    BLOB_PREFIX, ERASE_PREFIX, PENDING_PREFIX, PENDING_SHARDS, agent_of, agent_root, digest,
)
from .prefix import erase_prefix

log = logging.getLogger("fencepost.erasure")

REQUEST_PREFIX = GLOBAL_PREFIX + "req/"
_END = "\U0010ffff"  # sorts after every character a key holds: "skip this subtree"
_SESSION = re.compile(r"^(.*/durable-session/)s/([^/]+)/")
_STEP_KEYS = 10_000  # keys one sweep step lists at most (progress is recorded after each step)
_PASSES = 3  # passes over a prefix from its start, at most, until one finds it empty
_DIRECTORY_NAMES = 1000  # partition names one directory batch handles at most ...
_DIRECTORY_BYTES = 64 * 1024  # ... and their bytes: they are kept in the operation record meanwhile


class EraseSteps:
    """The steps of an operation's phases (the Eraser runs them)."""

    storage: Storage
    ledger: Ledger
    claim_seconds: float

    async def _step(self, state: dict[str, object], claim_held: Callable[[], bool] = lambda: True) -> None:
        """One bounded piece of work; advances the cursor / phase."""
        tenant, agent = str(state["scope_tenant"]), state["agent"]
        if state["phase"] == "fence":
            await self._fence_next(tenant, agent if isinstance(agent, str) else None, state, claim_held)
            return
        if "prefixes" not in state:  # fixed once, so the cursor indexes the same list on every replica
            prefixes = await self._prefixes(tenant, agent if isinstance(agent, str) else None)
            if not claim_held():
                return  # listed late: forgetting markers now could reach writes made after `done`
            state["prefixes"] = prefixes
            # Request-id markers kept with the doomed items (SQLite) become items of
            # their own when the items go, as every backend keeps them. A tenant's go
            # too: forgotten here, since the marker buckets to sweep are already listed.
            # An agent's stay, as on every backend (they belong to the tenant, and a
            # retry within their window gets its first answer instead of writing again).
            if not isinstance(agent, str):
                for prefix in state["prefixes"]:  # type: ignore[attr-defined]
                    await self.storage.forget_markers(prefix)
        prefixes = list(state["prefixes"])  # type: ignore[call-overload]
        index = int(state["cursor"] or 0)  # type: ignore[call-overload]
        if state["phase"] == "sweep":
            if index < len(prefixes):
                after = state.get("key_after")
                removed, after, ended = await erase_prefix(
                    self.storage, prefixes[index], after if isinstance(after, str) else None, _STEP_KEYS,
                    claim_held)
                state["erased"] = int(state["erased"]) + removed  # type: ignore[call-overload]
                passes = int(state.get("passes") or 0)  # type: ignore[call-overload]
                if not ended:
                    state["key_after"] = after  # more under this prefix: the next step goes on
                elif after is not None and passes < _PASSES:
                    # the pass found keys: from the start again, until a pass finds none
                    # (a writer rewriting keys behind the pass only makes it end, see erase_prefix)
                    state["key_after"], state["passes"] = None, passes + 1
                else:
                    state["cursor"] = index + 1
                    state.pop("key_after", None)
                    state.pop("passes", None)
                return
            state["phase"], state["cursor"] = "directory", 0
            return
        if await self._directory_step(prefixes, state, claim_held):
            return
        # done: the record keeps no name of what it erased (the tenant's hash authorizes reads)
        state["phase"], state["cursor"] = "done", None
        for scratch in ("scope_tenant", "prefixes", "after", "forgotten", "waited", "key_after", "passes"):
            state.pop(scratch, None)
        if isinstance(agent, str):
            state["agent"], state["agent_hash"] = None, digest(agent)

    async def _directory_step(
        self, prefixes: list[str], state: dict[str, object], claim_held: Callable[[], bool] = lambda: True,
    ) -> bool:
        """One step of the directory phase (see the module's docstring);
        False once every prefix is done."""
        names = state.get("forgotten")
        if not isinstance(names, list):
            index, found = int(state["cursor"]), []  # type: ignore[call-overload]
            while index < len(prefixes):
                after = state.get("after")
                assert after is None or isinstance(after, str)
                found = await self.storage.partitions_under(prefixes[index], after, _DIRECTORY_NAMES)
                if found:
                    break
                index, state["after"] = index + 1, None
            state["cursor"] = index
            if index >= len(prefixes):
                return False
            size, names = 0, []
            for name in found:
                size += len(name.encode()) + 4
                if names and size > _DIRECTORY_BYTES:
                    break
                names.append(name)
            # recorded before any goes, so whoever finishes the batch settles every one
            state["forgotten"], state["waited"] = names, None
            return True
        if state.get("waited") is None:
            if not claim_held():
                return True  # past the claim, another replica may have settled these names already
            await self.storage.forget_partitions(names)
            state["waited"] = 0.0
            return True
        remaining = self.storage.partition_settle_seconds - float(state["waited"])  # type: ignore[arg-type]
        if remaining > 0:
            pause = min(remaining, self.claim_seconds / 3)  # saved after each pause: the claim stays ours
            await asyncio.sleep(pause)
            state["waited"] = float(state["waited"]) + pause  # type: ignore[arg-type]
            return True
        restored = await self.storage.settle_partitions(names)
        if restored:
            log.info("erasure: %d partition(s) written again during the erasure keep their directory record",
                     restored)
        state["after"], state["forgotten"], state["waited"] = names[-1], None, None
        return True

    async def _fence_next(
        self, tenant: str, agent: str | None, state: dict[str, object], claim_held: Callable[[], bool] = lambda: True,
    ) -> None:
        """Tombstone and sweep the next session in scope (skipping every other
        subtree with one list), or move to the sweep phase. Like the sweep, it
        asks `claim_held` between listing a session and tombstoning it: a
        replica that stalled past its claim would otherwise wake, go on
        walking the scope and erase a session opened after `done`."""
        scope = agent_root(tenant, agent) if agent is not None else TenantKeys(tenant).sys_root
        start = state["cursor"]
        for _ in range(64):  # bounded: progress is saved at least every 64 lists
            keys = await self.storage.list_keys(scope, start, 1)  # type: ignore[arg-type]
            if not keys:
                if agent is not None:
                    if not claim_held():
                        state["cursor"] = start
                        return
                    await self._finish_cut_short(tenant, agent, state)
                state["phase"], state["cursor"] = "sweep", 0
                return
            key = keys[0]
            m = _SESSION.match(key)
            if m is None:
                start = _skip(key, scope)
                continue
            if not claim_held():
                state["cursor"] = start  # the save renews the claim, or finds it taken over
                return
            sid = m.group(2)
            try:
                doomed = await self.ledger.tombstone(tenant, sid, force=True, descendants=True)
            except NotFound:
                doomed = []  # not a whole session (leftovers): the sweep phase deletes them
            for each in doomed:
                state["erased"] = int(state["erased"]) + await self.ledger.sweep_session(tenant, each)  # type: ignore[call-overload]
            state["fenced"] = int(state["fenced"]) + len(doomed)  # type: ignore[call-overload]
            state["cursor"] = m.group(0) + _END
            return
        state["cursor"] = start

    async def _finish_cut_short(self, tenant: str, agent: str, state: dict[str, object]) -> None:
        """Sweep the agent's sessions whose DeleteSession was cut short after
        its sweep removed the session's own keys: the walk finds nothing of
        them under the agent, but their payload blobs and to-do entries are
        under `#/ledger/`, named by session id (a tenant erasure sweeps those
        prefixes whole). Idempotent, as every sweep."""
        enc = encode_segment(tenant)
        for shard in range(PENDING_SHARDS):
            prefix, start = f"{ERASE_PREFIX}{shard:02x}/{enc}/", None
            while True:
                keys = await self.storage.list_keys(prefix, start, 1000)
                for key in keys:
                    sid = key[len(prefix):]
                    try:
                        ours = agent_of(sid) == agent
                    except NotFound:
                        ours = False  # not a session id: not a DeleteSession's entry
                    if ours:
                        swept = await self.ledger.sweep_session(tenant, sid)
                        state["erased"] = int(state["erased"]) + swept  # type: ignore[call-overload]
                if len(keys) < 1000:
                    break
                start = keys[-1]

    async def _prefixes(self, tenant: str, agent: str | None) -> list[str]:
        """Every prefix the sweep phase empties, in a stable order."""
        keys = TenantKeys(tenant)
        if agent is not None:
            return [keys.agent(agent), keys.kv(f"agentkit/v1/{encode_segment(agent)}/")]
        enc = encode_segment(tenant)
        ledger_index = [
            f"{prefix}{shard:02x}/{enc}/"
            for prefix in (PENDING_PREFIX, BLOB_PREFIX, ERASE_PREFIX) for shard in range(PENDING_SHARDS)
        ]
        # request-id markers live in hourly buckets (#/req/{hour}/{tenant}/...): a few at a time
        buckets, start = [], None
        while True:
            found = await self.storage.list_keys(REQUEST_PREFIX, start, 1)
            if not found:
                break
            bucket = found[0][len(REQUEST_PREFIX):].split("/", 1)[0]
            buckets.append(f"{REQUEST_PREFIX}{bucket}/{enc}/")
            start = f"{REQUEST_PREFIX}{bucket}/{_END}"
        return [keys.root, *ledger_index, *sorted(buckets)]


def _skip(key: str, scope: str) -> str:
    """A start_after that skips the subtree of `key`, which holds no session:
    the ledger's identities and listing (agent scope), or an agent's other
    subsystems (tenant scope: `{tenant}/sys/` + `agentkit/v1/{agent}/{subsystem}/`)."""
    rest = key[len(scope):].split("/")
    if scope.endswith("/durable-session/"):
        return scope + rest[0] + "/" + _END  # id/, act/: sessions are under s/
    if len(rest) > 4 and rest[:2] == ["agentkit", "v1"] and rest[3] == "durable-session":
        head = scope + "/".join(rest[:4]) + "/"
        return head + "s" if key < head + "s/" else key
    return scope + "/".join(rest[:4]) + "/" + _END
