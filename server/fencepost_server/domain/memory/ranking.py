"""Search orders beyond recency.

`relevance` is Okapi BM25 over an agent's entries: each entry's terms are
its content's and its about keys' tokens (tokenized exactly as matching
does); document frequencies, the corpus size and the average length come
from the agent's whole lane (every entry ever appended: the lane is
append-only, so forgotten and superseded entries still count). `hybrid`
fuses the relevance order with the recency order by reciprocal rank (an
entry scores 1/(60 + rank) in each), so a fresh fact and a strong match both
surface. Ties keep the recency order, so every order is deterministic for a
given lane.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .rules import Entry, recall_key, tokenize

K1 = 1.2  # term-frequency saturation
B = 0.75  # length normalisation
RRF_K = 60  # reciprocal-rank damping (the usual constant)


@dataclass(frozen=True, slots=True)
class Terms:
    """One entry's term counts and length, computed once when it is folded."""

    counts: Counter[str]
    length: int


def terms_of(e: Entry) -> Terms:
    tokens = tokenize(e.content)
    for key in e.about:
        tokens += tokenize(key)
    return Terms(Counter(tokens), len(tokens))


class Corpus(Protocol):
    """The statistics BM25 needs (the fold keeps them)."""

    def terms(self, entry_id: str) -> Terms: ...
    def doc_freq(self, token: str) -> int: ...
    def size(self) -> int: ...
    def average_length(self) -> float: ...


def bm25(terms: Terms, query: Iterable[str], corpus: Corpus) -> float:
    avg = corpus.average_length()
    norm = K1 * (1 - B + B * terms.length / avg) if avg > 0 else K1
    n = corpus.size()
    score = 0.0
    for q in set(query):
        tf = terms.counts.get(q, 0)
        if tf:
            df = corpus.doc_freq(q)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            score += idf * tf * (K1 + 1) / (tf + norm)
    return score


def rank(found: Sequence[Entry], query: Sequence[str], strategy: str, corpus: Corpus) -> list[Entry]:
    """`found` ordered by `strategy` (recency, relevance or hybrid)."""
    by_recency = sorted(found, key=recall_key)
    if strategy == "recency" or len(by_recency) < 2:
        return by_recency
    scores = {e.id: bm25(corpus.terms(e.id), query, corpus) for e in by_recency}
    # sorted() is stable: equal scores keep the recency order
    by_relevance = sorted(by_recency, key=lambda e: -scores[e.id])
    if strategy == "relevance":
        return by_relevance
    fused = {e.id: 1 / (RRF_K + i) for i, e in enumerate(by_recency, 1)}
    for i, e in enumerate(by_relevance, 1):
        fused[e.id] += 1 / (RRF_K + i)
    return sorted(by_recency, key=lambda e: -fused[e.id])
