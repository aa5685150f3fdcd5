"""Comparing two stores (or a store and an archive) range by range.

Both sides are read in key order. The *reference* side cuts the keyspace
into ranges of `range_size` of its items; each range is `(previous
boundary, boundary]` on both sides, so a missing or extra key on one side
changes only the range it falls in. Per range and side: the item count and
a sha256 over every item's key, value and version (length-prefixed, so no
two different item lists hash alike by concatenation). Any difference in
count or digest is reported with the range's bounds.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field

from ..storage import Item

RANGE_SIZE = 1000


@dataclass(frozen=True)
class RangeDifference:
    after: str | None  # exclusive lower bound (None: the start of the keyspace)
    through: str | None  # inclusive upper bound (None: the end of the keyspace)
    reference: tuple[int, str]  # (count, sha256) on the reference side
    other: tuple[int, str]

    def __str__(self) -> str:
        low = "start" if self.after is None else repr(self.after)
        high = "end" if self.through is None else repr(self.through)
        return (f"range ({low}, {high}]: {self.reference[0]} items (sha256 {self.reference[1][:12]}) vs "
                f"{self.other[0]} items (sha256 {self.other[1][:12]})")


@dataclass
class Comparison:
    reference_items: int = 0
    other_items: int = 0
    ranges: int = 0
    mismatched: int = 0
    differences: list[RangeDifference] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differences


def _feed(digest: hashlib._Hash, item: Item) -> None:
    for part in (item.key.encode(), item.value, item.version.encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)


@dataclass(frozen=True)
class RangeSummary:
    through: str | None  # inclusive upper bound; None for the last range (to the end)
    count: int
    sha256: str


class RangeDigester:
    """Cuts a key-ordered item stream into ranges of `range_size` items and
    summarises each; `finish()` closes the last range (to the end)."""

    def __init__(self, range_size: int = RANGE_SIZE) -> None:
        self.range_size = range_size
        self.summaries: list[RangeSummary] = []
        self._digest = hashlib.sha256()
        self._count = 0

    def add(self, items: Iterable[Item]) -> None:
        for item in items:
            _feed(self._digest, item)
            self._count += 1
            if self._count == self.range_size:
                self.summaries.append(RangeSummary(item.key, self._count, self._digest.hexdigest()))
                self._digest, self._count = hashlib.sha256(), 0

    def finish(self) -> list[RangeSummary]:
        self.summaries.append(RangeSummary(None, self._count, self._digest.hexdigest()))
        return self.summaries


async def summarize(pages: AsyncIterable[list[Item]], range_size: int = RANGE_SIZE) -> AsyncIterator[RangeSummary]:
    digester = RangeDigester(range_size)
    async for page in pages:
        digester.add(page)
        while digester.summaries:
            yield digester.summaries.pop(0)
    for summary in digester.finish():
        yield summary


async def _flatten(pages: AsyncIterable[list[Item]]) -> AsyncIterator[Item]:
    async for page in pages:
        for item in page:
            yield item


async def compare_ranges(
    reference: AsyncIterable[RangeSummary], other: AsyncIterable[list[Item]], *, keep: int = 20
) -> Comparison:
    """Check `other` (key-ordered pages) against the reference's range
    summaries; at most `keep` differences are described."""
    result = Comparison()
    items = _flatten(other)
    pending = await anext(items, None)
    after: str | None = None
    async for summary in reference:
        bound = None if summary.through is None else summary.through.encode()
        digest, count = hashlib.sha256(), 0
        while pending is not None and (bound is None or pending.key.encode() <= bound):
            _feed(digest, pending)
            count += 1
            pending = await anext(items, None)
        result.ranges += 1
        result.reference_items += summary.count
        result.other_items += count
        mine = (summary.count, summary.sha256)
        theirs = (count, digest.hexdigest())
        if mine != theirs:
            result.mismatched += 1
            if len(result.differences) < keep:
                result.differences.append(RangeDifference(after, summary.through, mine, theirs))
        after = summary.through
    return result


async def compare(
    reference: AsyncIterable[list[Item]], other: AsyncIterable[list[Item]], *, range_size: int = RANGE_SIZE
) -> Comparison:
    """Compare two key-ordered page streams range by range."""
    return await compare_ranges(summarize(reference, range_size), other)
