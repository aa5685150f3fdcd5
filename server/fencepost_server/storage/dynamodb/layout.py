"""Where a storage key lives in the table: its partition and its sort key.

A key is cut after its first `d` `/`-separated segments: the head (ending in
`/`, or empty) is the partition, the rest is the sort key. `d` is chosen by
the longest *pattern* (a tuple of segments, `*` matching any one) that matches
the key's leading complete segments; a key matching none keeps everything in
partition "" (it has no `/` at all, since the pattern `*` matches any key with
one). The patterns follow the server's key layout (domain/keys.py), so that
the usual lists stay inside one partition while traffic spreads out:

    {tenant}/kv/...                      one partition per tenant's KV space
    {tenant}/sys/{subsystem}/...         one per tenant and subsystem
    {tenant}/sys/agentkit/v1/{agent}/... one per agent
    #/{index}/{shard}/...                one per shard of a global index
    #/req/{hour}/{tenant}/...            request-id markers: per hour and tenant
    {anything}/...                       otherwise one per first segment

The patterns are part of the table's format: changing them moves keys, so an
existing table must keep the patterns it was written with.

A list over `prefix` stays in one partition exactly when every key that starts
with `prefix` gets the same partition: the prefix already holds the whole
partition head and no longer pattern could still match a key extending it
(`partition_of_prefix`). Otherwise the keys under `prefix` can live in the
prefix's own partition (`home_of_prefix`) and in any partition whose name
starts with `prefix`, which the partition directory lists (see listing.py).
"""

from __future__ import annotations

from collections.abc import Sequence

Pattern = tuple[str, ...]

WILDCARD = "*"

DEFAULT_PATTERNS: tuple[Pattern, ...] = (
    ("*",),
    ("*", "kv"),
    ("*", "sys", "*"),
    ("*", "sys", "agentkit", "v1", "*"),
    ("#", "*", "*"),
    ("#", "req", "*", "*"),
)


def _matches(pattern: Sequence[str], segments: Sequence[str]) -> bool:
    return all(p == WILDCARD or p == s for p, s in zip(pattern, segments, strict=False))


class KeyLayout:
    """Maps keys to (partition, sort key) and prefixes to the partitions to query."""

    def __init__(self, patterns: Sequence[Pattern] = DEFAULT_PATTERNS) -> None:
        if any(not p for p in patterns):
            raise ValueError("a partition pattern needs at least one segment")
        # Longest first: the first pattern that matches is the deepest one.
        self.patterns: tuple[Pattern, ...] = tuple(sorted(set(patterns), key=len, reverse=True))
        self._max_depth = max((len(p) for p in self.patterns), default=0)

    def _complete_segments(self, text: str) -> list[str]:
        """The `/`-terminated segments at the start of `text` (as many as any
        pattern can look at)."""
        return text.split("/", self._max_depth)[:-1]

    def _depth(self, segments: Sequence[str]) -> int:
        for pattern in self.patterns:
            if len(pattern) <= len(segments) and _matches(pattern, segments):
                return len(pattern)
        return 0

    @staticmethod
    def _head_length(segments: Sequence[str], depth: int) -> int:
        return sum(len(s) + 1 for s in segments[:depth])

    def split(self, key: str) -> tuple[str, str]:
        """(partition, rest) with `partition + rest == key`."""
        segments = self._complete_segments(key)
        cut = self._head_length(segments, self._depth(segments))
        return key[:cut], key[cut:]

    def home_of_prefix(self, prefix: str) -> str:
        """The partition that keys under `prefix` get when no longer pattern
        applies to them (it is a prefix of `prefix`)."""
        return self.split(prefix)[0]

    def partition_of_prefix(self, prefix: str) -> str | None:
        """The one partition holding every key under `prefix`, or None when
        such keys may be spread over several partitions."""
        segments = self._complete_segments(prefix)
        for pattern in self.patterns:
            if len(pattern) > len(segments) and _matches(pattern, segments):
                return None  # a deeper pattern may still match a longer key
        return self.home_of_prefix(prefix)
