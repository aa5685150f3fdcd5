"""The server's key layout. Every key the server touches is under a tenant:

    {tenant}/kv/{caller key}                 KvService keys, as the caller named them
    {tenant}/sys/agentkit/v1/{agent}/...     framework keys (ledger, journal, memory, ...)
    #/...                                    server-global bookkeeping (request ids, the page-token key, ...)

`{tenant}` and every caller-controlled framework segment go through
`encode_segment`, so neither can contain `/`, and `#` (always percent-encoded)
can never start a tenant: the three spaces cannot collide.
"""

from __future__ import annotations

import functools

from fencepost.keys import encode_segment

from .errors import InvalidArgument

GLOBAL_PREFIX = "#/"

#: the longest agent name AdminService.EraseAgent takes (its operation record
#: keeps the name, and must fit one DynamoDB item); a service that keys data
#: by agent must refuse longer names, or that data could never be erased
#: agent-wide
MAX_ERASABLE_AGENT_BYTES = 65_536


def check_erasable_agent(agent: str, reason: str, field: str) -> None:
    """`reason` on `field` (with `limit` and `size`) unless EraseAgent can name
    `agent`. Any character is fine: every agent segment of a key is percent-encoded."""
    size = len(agent.encode("utf-8", "surrogatepass"))
    if agent and size <= MAX_ERASABLE_AGENT_BYTES:
        return
    problem = f"is {size} bytes, over the limit of {MAX_ERASABLE_AGENT_BYTES}" if agent else "must not be empty"
    raise InvalidArgument(reason, f"{field} {problem}", {"limit": MAX_ERASABLE_AGENT_BYTES, "size": size},
                          field=field)


class TenantKeys:
    """Key builder for one tenant."""

    __slots__ = ("tenant", "root", "kv_root", "sys_root")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.root = encode_segment(tenant) + "/"
        self.kv_root = self.root + "kv/"
        self.sys_root = self.root + "sys/"

    def kv(self, key: str) -> str:
        """Scope a caller's KvService key."""
        return self.kv_root + key

    def unscope_kv(self, stored: str) -> str:
        return stored[len(self.kv_root):]

    def agent(self, agent: str) -> str:
        """Prefix of every framework key of one agent (`.../agentkit/v1/{agent}/`)."""
        return f"{self.sys_root}agentkit/v1/{encode_segment(agent)}/"

    def sys(self, *segments: str) -> str:
        """A framework key from already-safe segments (encode caller parts first)."""
        return self.sys_root + "/".join(segments)


@functools.lru_cache(maxsize=1024)
def tenant_keys(tenant: str) -> TenantKeys:
    """The (immutable) key builder of `tenant`, built once: encoding the tenant
    segment is a measurable part of a KV call's own CPU."""
    return TenantKeys(tenant)
