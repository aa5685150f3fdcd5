"""The session ledger (spec/ledger.md): identity, leases fenced by generation,
fenced commits, a durable inbox, forks and the janitor. Written against the
storage contract only, so it runs on every backend.

    layout    key layout + canonical encodings of the fence items
    core      configuration, caches, shared errors and views
    sessions  open / resolve / get, log sizes
    activity  act/ items and the activity index (what commits write for ListSessions)
    listing   ListSessions from the activity index
    fork      forks and fork-aware log reads
    leases    acquire / renew / release
    commits   fenced, idempotent commits
    inbox     deliver / list / watch
    erase     DeleteSession: the tombstone and the resumable sweep
    janitor   orphan recovery and sweeps (ClaimOrphan), unfinished erasures, retention
"""

from __future__ import annotations

from .commits import CommitMethods, CommitResult
from .core import LedgerBase, LedgerConfig, SessionView
from .erase import EraseMethods, EraseResult
from .fork import ForkMethods
from .inbox import Delivery, InboxEvent, InboxMethods
from .janitor import Janitor, JanitorStats
from .layout import LeaseState
from .sessions import SessionSummary


class Ledger(ForkMethods, InboxMethods, CommitMethods, EraseMethods):
    """The ledger over one backend. One instance per process (it holds caches
    that only ever save reads; see LedgerBase)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.janitor = Janitor(self)


__all__ = [
    "Ledger", "LedgerConfig", "LedgerBase", "SessionView", "SessionSummary", "LeaseState",
    "CommitResult", "EraseResult", "Delivery", "InboxEvent", "Janitor", "JanitorStats",
]
