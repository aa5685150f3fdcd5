"""One set of limits, identical on every backend (DESIGN.md "Limits")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_key_bytes: int = 1024
    max_value_bytes: int = 256 * 1024
    default_page_size: int = 100
    max_page_size: int = 1000
    #: a list page's keys and values: a page ends early (with a token) rather
    #: than outgrow one response (half the default 8 MiB message limit)
    max_page_bytes: int = 4 * 1024 * 1024
    max_txn_ops: int = 100
    max_txn_bytes: int = 4 * 1024 * 1024
    max_journal_record_bytes: int = 16 * 1024
    max_memory_content_bytes: int = 4096
    max_about_keys: int = 12
    max_about_bytes: int = 512

    def page_size(self, requested: int) -> int:
        """AIP-158: 0 means the default, larger than the max is clamped.
        Negative values are refused by the caller (see paging.page_size)."""
        if requested <= 0:
            return self.default_page_size
        return min(requested, self.max_page_size)


DEFAULT_LIMITS = Limits()
