"""The ledger's key layout and the canonical encodings of its small items.

Per session (`{A}` = `{tenant}/sys/agentkit/v1/{agent}/durable-session/`):

    {A}id/{encoded session_key}     identity: the session id (put-if-absent)
    {A}act/{sid}                    current activity {t, u, s, b, k, p, w} (see activity.py)
    {A}ix/{17-digit inverted µs}/{sid}  activity index: ListSessions reads it newest first
    {A}ix-ready                     the agent's legacy act/ items have index entries
    {A}s/{sid}/meta                 immutable: key, agent, created, fork parent, seed_length
    {A}s/{sid}/gen                  FENCE: canonical generation + held/released flag
    {A}s/{sid}/lease                lease record {holder, gen, expires, released}
    {A}s/{sid}/head                 FENCE: canonical head seq
    {A}s/{sid}/size                 cache of the log's byte size {s, b} (ListSessions)
    {A}s/{sid}/log/{seq:020d}       one committed record (immutable)
    {A}s/{sid}/in/{inbox id}        one parked event (its presence is the fact "pending")
    {A}s/{sid}/dd/{sha256(dedupe)}  the inbox id a dedupe key parked (kept forever)
    {A}s/{sid}/cm/{sha256(commit)}  a commit's result, for idempotent retries
    {A}s/{sid}/fk/{child sid}       one fork of this session (written with the fork)
    {A}s/{sid}/forks                blind-put (empty) by every fork: DeleteSession's proof
                                    that no fork appeared while it checked (its version moves)

Server bookkeeping the janitor scans across tenants (`#/` never starts a tenant):

    #/ledger/pending/{shard}/{encoded tenant}/{sid}       "this session may have pending events"
    #/ledger/blob/{shard}/{encoded tenant}/{sid}/{inbox id}  payloads over the inline limit
    #/ledger/erase/{shard}/{encoded tenant}/{sid}        a tombstoned session not yet swept

A deleted session's gen item holds `erased_value(G + 1)` (suffix `x`) until
the sweep removes it; its meta, head, lease and identity went in the same
write, so every read and every fenced write misses from that write on.

The fence items hold values that are a pure function of what the caller
already knows (its generation, its expected seq), so every fenced write can
condition on `value == ...` without reading first.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
import time
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as json_str

from fencepost import reasons
from fencepost.keys import encode_segment

from ...storage import random_hex
from ..errors import InvalidArgument, NotFound
from ..keys import GLOBAL_PREFIX, tenant_keys

PENDING_SHARDS = 16  # fixed: changing it would hide existing entries from the janitor
PENDING_PREFIX = GLOBAL_PREFIX + "ledger/pending/"
BLOB_PREFIX = GLOBAL_PREFIX + "ledger/blob/"
ERASE_PREFIX = GLOBAL_PREFIX + "ledger/erase/"

#: an agent name is part of every session id of the agent (and so of every key
#: of its sessions): bounded so those keys fit every backend's key limits
MAX_AGENT_BYTES = 256

# matched with fullmatch: `$` alone also matches before a trailing newline
_SID = re.compile(r"^[0-9a-f]{32}\.[A-Za-z0-9_-]+$")
_INBOX_ID = re.compile(r"^[0-9]{20}-[0-9a-f]{8}$")


def new_session_id(agent: str) -> str:
    tag = base64.urlsafe_b64encode(agent.encode()).decode().rstrip("=")
    return f"{random_hex(16)}.{tag}"


def agent_of(session_id: str) -> str:
    """The agent a session id belongs to; SESSION_NOT_FOUND for a malformed id,
    and for one naming an agent longer than any session's: its keys would be
    over DynamoDB's key limits (a refusal there), so no backend looks it up."""
    if _SID.fullmatch(session_id) and len(session_id) <= _MAX_SID_CHARS:
        tag = session_id.split(".", 1)[1]
        try:
            return base64.urlsafe_b64decode(tag + "=" * (-len(tag) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError):
            pass
    raise session_not_found(session_id)


#: 32 hex digits, a dot, and the agent's MAX_AGENT_BYTES in unpadded base64
_MAX_SID_CHARS = 33 + (4 * MAX_AGENT_BYTES + 2) // 3


def session_not_found(session_id: str) -> NotFound:
    return NotFound(reasons.SESSION_NOT_FOUND, f"no session {session_id!r}", {"session_id": session_id})


def shard_of(session_id: str) -> int:
    return int(hashlib.sha256(session_id.encode()).hexdigest()[:8], 16) % PENDING_SHARDS


def new_inbox_id(now: float | None = None) -> str:
    """Arrival-ordered: nanoseconds since the epoch, then 32 random bits."""
    return inbox_id_at(time.time_ns() if now is None else int(now * 1e9))


def inbox_id_at(ns: int) -> str:
    return f"{ns:020d}-{random_hex(4)}"


def inbox_time(inbox_id: str) -> float:
    return int(inbox_id[:20]) / 1e9


def check_inbox_id(inbox_id: str, field: str) -> None:
    if not _INBOX_ID.fullmatch(inbox_id):
        raise InvalidArgument(reasons.FIELD_INVALID, f"{inbox_id!r} is not an inbox id", field=field)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class SessionKeys:
    """Every key of one session."""

    __slots__ = (
        "tenant", "sid", "agent", "root", "base", "meta", "gen", "lease", "head", "size", "act",
        "index", "log", "inbox", "dedupe", "commits", "pending", "blobs", "forks", "fork_entries", "erase",
    )

    def __init__(self, tenant: str, sid: str, agent: str | None = None) -> None:
        self.tenant, self.sid = tenant, sid
        self.agent = agent if agent is not None else agent_of(sid)
        self.root = agent_root(tenant, self.agent)
        self.base = f"{self.root}s/{sid}/"
        self.meta = self.base + "meta"
        self.gen = self.base + "gen"
        self.lease = self.base + "lease"
        self.head = self.base + "head"
        self.size = self.base + "size"
        self.log = self.base + "log/"
        self.inbox = self.base + "in/"
        self.dedupe = self.base + "dd/"
        self.commits = self.base + "cm/"
        self.forks = self.base + "forks"
        self.fork_entries = self.base + "fk/"
        self.act = f"{self.root}act/{sid}"
        self.index = index_prefix(self.root)
        shard = f"{shard_of(sid):02x}"
        self.pending = f"{PENDING_PREFIX}{shard}/{encode_segment(tenant)}/{sid}"
        self.blobs = f"{BLOB_PREFIX}{shard}/{encode_segment(tenant)}/{sid}/"
        self.erase = f"{ERASE_PREFIX}{shard}/{encode_segment(tenant)}/{sid}"

    def index_key(self, micros: int) -> str:
        """The session's activity-index entry for activity at `micros`."""
        return index_key(self.index, micros, self.sid)

    def listing_keys(self, act_value: bytes) -> list[str]:
        """Every activity-index entry of the session, derived from its act/
        item: the current one and the superseded ones still kept. Deleting
        the session's listing entries = deleting these keys (and act/)."""
        d = json.loads(act_value)
        current = activity_micros(d)
        return [self.index_key(u) for u in (*d.get("p", ()), current)]

    def log_key(self, seq: int) -> str:
        return f"{self.log}{seq:020d}"

    def inbox_key(self, inbox_id: str) -> str:
        return self.inbox + inbox_id

    def blob_key(self, inbox_id: str) -> str:
        return self.blobs + inbox_id

    def dedupe_key(self, dedupe: str) -> str:
        return self.dedupe + digest(dedupe)

    def commit_key(self, commit_id: str) -> str:
        return self.commits + digest(commit_id)

    def fork_entry(self, child_sid: str) -> str:
        return self.fork_entries + child_sid


@functools.lru_cache(maxsize=8192)
def session_keys(tenant: str, sid: str) -> SessionKeys:
    """The keys of one session, built once per (tenant, session) while in the
    cache: building them (segment encoding, shard) is a measurable part of a
    ledger call's own CPU. SessionKeys is never modified after it is built."""
    return SessionKeys(tenant, sid)


def agent_root(tenant: str, agent: str) -> str:
    return tenant_keys(tenant).agent(agent) + "durable-session/"


def inbox_key_under(tenant_segment: str, sid: str, inbox_id: str) -> str:
    """`SessionKeys(tenant, sid).inbox_key(inbox_id)` from the tenant's stored
    key segment, for the janitor, which reads that segment from a blob's key
    and cannot recover a hashed (over-long) name from it."""
    # the same layout with the tenant's segment left empty, then put in front
    return tenant_segment + SessionKeys("", sid).inbox_key(inbox_id)


#: Index keys hold INDEX_TOP - micros, fixed width, so key order is newest first.
INDEX_DIGITS = 17
INDEX_TOP = 10**INDEX_DIGITS - 1


def index_prefix(root: str) -> str:
    return root + "ix/"


def index_ready_key(root: str) -> str:
    return root + "ix-ready"


def index_key(prefix: str, micros: int, sid: str) -> str:
    return f"{prefix}{INDEX_TOP - micros:0{INDEX_DIGITS}d}/{sid}"


def index_start(prefix: str, micros: int) -> str:
    """The `start_after` that lists entries at or before `micros` (newest first)."""
    return f"{prefix}{INDEX_TOP - micros:0{INDEX_DIGITS}d}"


def parse_index_key(prefix: str, key: str) -> tuple[int, str]:
    """(micros, session id) of an index entry key."""
    inverted, sid = key[len(prefix):].split("/", 1)
    return INDEX_TOP - int(inverted), sid


def activity_micros(act: dict[str, object]) -> int:
    """An act/ item's activity in µs; items written before the index carry
    only float seconds `t`, rounded the same way wherever it is needed."""
    u = act.get("u")
    return int(u) if u is not None else round(float(act["t"]) * 1e6)  # type: ignore[arg-type]


def identity_key(tenant: str, agent: str, session_key: str) -> str:
    return f"{agent_root(tenant, agent)}id/{encode_segment(session_key)}"


# -- canonical values -------------------------------------------------------------
def gen_value(generation: int, held: bool) -> bytes:
    """The fence: a pure function of (generation, held)."""
    return f"{generation:020d}{'h' if held else 'r'}".encode()


def erased_value(generation: int) -> bytes:
    """The gen item of a deleted session (until swept): equal to no
    `gen_value`, so every fenced write fails from the delete on."""
    return f"{generation:020d}x".encode()


def parse_gen(value: bytes) -> tuple[int, bool]:
    text = value.decode()
    return int(text[:20]), text[20:] == "h"


def is_erased(value: bytes) -> bool:
    return value[20:] == b"x"


def seq_value(seq: int) -> bytes:
    return f"{seq:020d}".encode()


def parse_seq(value: bytes) -> int:
    return int(value.decode())


_CANONICAL = json.JSONEncoder(separators=(",", ":"), sort_keys=True)  # built once, not per value


def dumps(obj: object) -> bytes:
    return _CANONICAL.encode(obj).encode()


@dataclass(frozen=True, slots=True)
class LeaseState:
    holder: str
    generation: int
    expires: float
    released: bool

    def live(self, now: float) -> bool:
        return not self.released and now < self.expires

    def encode(self) -> bytes:
        """dumps({"h", "g", "e", "r"}), spelled out: every lease write encodes one."""
        return (f'{{"e":{self.expires!r},"g":{self.generation},"h":{json_str(self.holder)},'
                f'"r":{"true" if self.released else "false"}}}').encode()

    @staticmethod
    def decode(value: bytes) -> LeaseState:
        d = json.loads(value)
        return LeaseState(d["h"], int(d["g"]), float(d["e"]), bool(d["r"]))

    def fence(self) -> bytes:
        """The gen item's value while this lease record is current."""
        return gen_value(self.generation, not self.released)


NO_LEASE = LeaseState("", 0, 0.0, True)


@dataclass(frozen=True, slots=True)
class Meta:
    sid: str
    agent: str
    key: str
    created: float
    parent: str
    seed_length: int
    metadata: dict[str, str]

    def encode(self) -> bytes:
        return dumps({
            "sid": self.sid, "a": self.agent, "k": self.key, "c": self.created,
            "p": self.parent, "n": self.seed_length, "m": self.metadata,
        })

    @staticmethod
    def decode(value: bytes) -> Meta:
        d = json.loads(value)
        return Meta(d["sid"], d["a"], d["k"], float(d["c"]), d["p"], int(d["n"]), dict(d["m"]))


def encode_event(header: dict[str, object], payload: bytes) -> bytes:
    head = dumps(header)
    return len(head).to_bytes(4, "big") + head + payload


def encode_inline_event(dedupe_key: str, delivered: float, payload: bytes) -> bytes:
    """encode_event({"d": dedupe_key, "t": delivered}, payload), the header
    spelled out: every Deliver of an inline payload encodes one."""
    head = f'{{"d":{json_str(dedupe_key)},"t":{delivered!r}}}'.encode()
    return len(head).to_bytes(4, "big") + head + payload


@functools.lru_cache(maxsize=1024)
def pending_value(tenant: str) -> bytes:
    """The value of a session's pending-index entry (the same for a tenant's sessions)."""
    return dumps({"tenant": tenant})


def decode_event(value: bytes) -> tuple[dict[str, object], bytes]:
    n = int.from_bytes(value[:4], "big")
    return json.loads(value[4:4 + n]), value[4 + n:]
