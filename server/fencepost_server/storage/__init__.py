"""The storage contract and its backends (memory, sqlite, dynamodb)."""

from .base import (
    EXPORT_PAGE,
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    TXN_OP_OVERHEAD,
    BackendUnavailable,
    CasResult,
    Check,
    CountKeys,
    Delete,
    Expect,
    InvalidTransaction,
    Item,
    Marker,
    PersistenceUncertain,
    Put,
    RequestRejected,
    Storage,
    StorageError,
    TxnResult,
    Write,
    key_bytes,
    over_budget,
    random_hex,
)
from .registry import open_backend, register

__all__ = [
    "EXPORT_PAGE", "MAX_TXN_BYTES", "MAX_TXN_OPS", "TXN_OP_OVERHEAD", "BackendUnavailable", "CasResult", "Check",
    "CountKeys", "Delete", "Expect", "InvalidTransaction", "Item", "Marker", "PersistenceUncertain", "Put", "RequestRejected",
    "Storage",
    "StorageError", "TxnResult", "Write", "key_bytes", "open_backend", "over_budget", "random_hex", "register",
]
