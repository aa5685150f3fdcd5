"""Durable session-local reminders folded from the session's ledger log
(spec/schedule.md, docs/schedule.md).

    records   the schedule/change v1 encoding, strict decoder and pure fold
    service   Schedule: create / delete / list / due / dispatch / watch over the ledger
"""

from __future__ import annotations

from .records import STREAM, Create, Delete, Dispatch, Fold, RecordError, Rejected, Reminder, decode, encode, fold
from .service import UNSUPPORTED_RULES, Listing, Schedule

__all__ = [
    "STREAM", "Create", "Delete", "Dispatch", "Fold", "RecordError", "Rejected", "Reminder", "decode", "encode",
    "fold", "Schedule", "Listing", "UNSUPPORTED_RULES",
]
