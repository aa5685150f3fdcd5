"""fencepost client SDK: typed async + sync clients over the generated stubs.

    import fencepost
    with fencepost.Client("127.0.0.1:50051") as fp:
        fp.put("greeting", b"hello")
        print(fp.get("greeting").value)
"""

from . import errors, journal, reasons
from ._version import __version__
from ._journal import ArchiveEntry, JournalContent
from ._call import DEFAULT_RETRY, NO_RETRY, RetryPolicy
from ._evals import AbSample, AbSnapshot, EvalRun
from ._kv import CasResult, Entry, TxnResult, compare, delete_op, put_op
from ._schedule import RejectedRecord, Reminder, ReminderPage
from ._admin import Operation
from ._ledger import Commit, Deletion, Delivery, InboxEvent, Lease, Record, Session, SessionInfo, SessionSummary
from .client import AsyncClient, Client
from .errors import FencepostError
from .keys import author_kv, encode_segment
from .mirror import JournalMirror
from .worker import SessionWorker, WorkerResult

__all__ = [
    "__version__", "AsyncClient", "Client", "FencepostError", "RetryPolicy", "DEFAULT_RETRY", "NO_RETRY",
    "Entry", "CasResult", "TxnResult", "compare", "put_op", "delete_op",
    "EvalRun", "AbSample", "AbSnapshot",
    "author_kv", "encode_segment", "errors", "reasons",
    "Session", "SessionInfo", "SessionSummary", "Lease", "Record", "InboxEvent", "Commit", "Delivery",
    "Deletion", "Operation",
    "journal", "JournalContent", "ArchiveEntry",
    "JournalMirror", "SessionWorker", "WorkerResult",
    "Reminder", "ReminderPage", "RejectedRecord",
]
