"""Damaged flushed batches a log knows about, shared by both log implementations.

A flushed batch whose bytes no longer match their checksum is *damaged*: the log stops serving
it (a read stops before it, or raises CorruptBatch when it is the first batch asked for) and it
no longer counts as flushed in what the node reports (raft/core/repair.py), until `repair()` writes
the same batch again, fetched from a member that has a good copy. Its offsets and term are known
(from the log's own index, built when the batch was whole), which is what lets a repair put the
exact same entry back without moving anything around it.

The set lives in memory: a restart finds the damage again (the open-time check of the recent
tail, the scrubber, or the first read). Entries are whole batches, kept sorted by offset.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Damage:
    """One damaged flushed batch: offsets first..last, written in `term`."""

    first: int
    last: int
    term: int
    reason: str

    def describe(self) -> str:
        return f"offsets {self.first}..{self.last} (term {self.term}): {self.reason}"


class DamageSet:
    """Damaged batches, sorted; `version` moves on every new entry so a reader that polls it
    (the core, each tick) learns of new damage without a callback into storage."""

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._items: list[Damage] = []
        self.version = 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def all(self) -> list[Damage]:
        return list(self._items)

    def copy(self) -> DamageSet:
        """The same entries, for a reader that looks them up without the log's lock."""
        other = DamageSet()
        other._firsts, other._items, other.version = (list(self._firsts), list(self._items),
                                                      self.version)
        return other

    def first(self) -> int | None:
        """The lowest damaged offset, or None. Safe without the log's lock: one read of the
        list's head (a concurrent change is seen before or after, never torn)."""
        firsts = self._firsts
        try:
            return firsts[0]
        except IndexError:
            return None

    def find(self, offset: int) -> Damage | None:
        """The damaged batch holding `offset`, if any."""
        i = bisect.bisect_right(self._firsts, offset) - 1
        if i >= 0 and self._items[i].last >= offset:
            return self._items[i]
        return None

    def add(self, damage: Damage) -> bool:
        """Record a damaged batch; False if it was known already."""
        if self.find(damage.first) is not None:
            return False
        i = bisect.bisect_right(self._firsts, damage.first)
        self._firsts.insert(i, damage.first)
        self._items.insert(i, damage)
        self.version += 1
        return True

    def remove(self, first: int) -> None:
        i = bisect.bisect_left(self._firsts, first)
        if i < len(self._firsts) and self._firsts[i] == first:
            del self._firsts[i]
            del self._items[i]

    def drop_after(self, offset: int) -> None:
        """Forget damage past `offset` (a suffix truncation removed those batches)."""
        i = bisect.bisect_right(self._firsts, offset)
        del self._firsts[i:]
        del self._items[i:]

    def drop_before(self, offset: int) -> None:
        """Forget damage before `offset` (a prefix truncation removed those batches)."""
        i = bisect.bisect_left(self._firsts, offset)
        del self._firsts[:i]
        del self._items[:i]

    def clear(self) -> None:
        self._firsts.clear()
        self._items.clear()
