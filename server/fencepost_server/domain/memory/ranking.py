"""Search orders beyond recency.

`relevance` is Okapi BM25 over an agent's entries: each entry's tokens are
its content's and its about keys' (tokenized exactly as matching does), the
document frequencies and average length come from the agent's whole lane.
`hybrid` fuses the relevance order with the recency order by reciprocal
rank (an entry scores 1/(60 + rank) in each), so a fresh fact and a strong
match both surface. Ties keep the recency order, so every order is
deterministic for a given lane.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from .rules import Entry, recall_key, tokenize

K1 = 1.2  # term-frequency saturation
B = 0.75  # length normalisation
RRF_K = 60  # reciprocal-rank damping (the usual constant)


def entry_terms(e: Entry) -> list[str]:
    """Every token occurrence an entry is matched on."""
    terms = tokenize(e.content)
    for key in e.about:
        terms += tokenize(key)
    return terms


def bm25(terms: Sequence[str], query: Iterable[str], doc_freq: Callable[[str], int], corpus: int,
         avg_len: float) -> float:
    counts = Counter(terms)
    norm = K1 * (1 - B + B * len(terms) / avg_len) if avg_len > 0 else K1
    score = 0.0
    for q in set(query):
        tf = counts.get(q, 0)
        if tf:
            df = doc_freq(q)
            idf = math.log(1 + (corpus - df + 0.5) / (df + 0.5))
            score += idf * tf * (K1 + 1) / (tf + norm)
    return score


def rank(found: Sequence[Entry], query: Sequence[str], strategy: str, doc_freq: Callable[[str], int],
         corpus: int, avg_len: float) -> list[Entry]:
    """`found` ordered by `strategy` (recency, relevance or hybrid)."""
    by_recency = sorted(found, key=recall_key)
    if strategy == "recency" or len(by_recency) < 2:
        return by_recency
    scores = {e.id: bm25(entry_terms(e), query, doc_freq, corpus, avg_len) for e in by_recency}
    # sorted() is stable: equal scores keep the recency order
    by_relevance = sorted(by_recency, key=lambda e: -scores[e.id])
    if strategy == "relevance":
        return by_relevance
    fused = {e.id: 1 / (RRF_K + i) for i, e in enumerate(by_recency, 1)}
    for i, e in enumerate(by_relevance, 1):
        fused[e.id] += 1 / (RRF_K + i)
    return sorted(by_recency, key=lambda e: -fused[e.id])
