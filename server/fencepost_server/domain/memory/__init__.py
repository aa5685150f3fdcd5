"""Agent memory (spec/memory.md): the record lane, its fold, and the rules.

- `rules`: the rules as pure functions (caps, tokenizer, validity,
  supersession, pin budget, topics, injection, ids).
- `fold`: lane records and the fold that turns them into state.
- `store`: `MemoryStore`, the operations over the storage contract.
"""

from .rules import Entry, Injection, Topic
from .store import EntryView, ImportResult, MemoryStore, NewEntry, PinOutcome, ReadResult, Usage

__all__ = [
    "Entry", "EntryView", "ImportResult", "Injection", "MemoryStore", "NewEntry", "PinOutcome",
    "ReadResult", "Topic", "Usage",
]
