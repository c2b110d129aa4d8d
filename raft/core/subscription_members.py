"""A topic subscription's member: which partitions to keep, release and take this round.

A subscription over a topic is the same name in every partition's own subscription table
(raft/core/subscription_table.py): each partition has its own position and its own lease, in its
own log. There is no coordinator. Every member runs rounds: it sends each partition an `open`
that counts it as a member there (WATCH) or also takes the lease if nobody else's runs (TAKE),
and each answer says who holds that partition and which members it has seen recently. From the
last round's answers every member computes the same thing (`plan`):

- the members: every member seen by any partition, and itself;
- each member's quota: P // N partitions, and one more for the P % N members that hold the most
  now (ties by member id), so quotas add up to P and a settled assignment stays where it is
  (only the extra partitions move when someone joins or leaves: sticky);
- a member holding more than its quota releases the extra ones (after committing them); one
  holding fewer takes free partitions (no running lease) up to its quota.

Once the members agree on who is there (one round after the last join or departure), the quotas
add up to the partitions, so every free partition has a taker and nobody takes more than its
quota: the assignment converges in a few rounds and then does not move. Safety does not depend
on any of this: a partition's lease has one holder at a time, decided by its log, and a commit
from a member that lost the lease is refused.

Pure: the client (raft/client/topic_subscription.py) runs the rounds.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class PartitionView:
    """What one partition's answer said: its lease holder (None = free) and its members."""

    holder: str | None
    members: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class Plan:
    members: tuple[str, ...]
    quota: int
    keep: tuple[int, ...]  # held now and kept
    release: tuple[int, ...]  # held now, above the quota: commit, then release
    take: tuple[int, ...]  # free now, below the quota: ask for them (TAKE)

    @property
    def wanted(self) -> tuple[int, ...]:
        """The partitions to send TAKE this round (renew the kept ones, ask for new ones)."""
        return tuple(sorted(self.keep + self.take))


def members_of(me: str, views: Iterable[PartitionView]) -> tuple[str, ...]:
    seen = {me}
    for v in views:
        seen.update(v.members)
        if v.holder:
            seen.add(v.holder)
    return tuple(sorted(seen))


def quotas(members: Iterable[str], held: Mapping[str, int], partitions: int) -> dict[str, int]:
    """Each member's share: partitions // n, plus one for the partitions % n members holding
    the most (ties by id), so the quotas add up to `partitions` and favour the status quo."""
    ranked = sorted(members, key=lambda m: (-held.get(m, 0), m))
    base, extra = divmod(partitions, max(1, len(ranked)))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}


def plan(me: str, views: Mapping[int, PartitionView], partitions: Iterable[int]) -> Plan:
    """This member's round from the last answers (`views`: partition -> view; a partition
    without a view counts as free and memberless)."""
    parts = sorted(partitions)
    seen = [views[p] for p in parts if p in views]
    members = members_of(me, seen)
    held: dict[str, int] = {}
    for p in parts:
        v = views.get(p)
        if v is not None and v.holder:
            held[v.holder] = held.get(v.holder, 0) + 1
    quota = quotas(members, held, len(parts))[me]
    mine = [p for p in parts if p in views and views[p].holder == me]
    keep, release = mine[:quota], mine[quota:]
    free = [p for p in parts if p not in views or not views[p].holder]
    # Start at a place of our own among the free partitions, so members taking at the same
    # time mostly ask for different ones.
    if free:
        at = zlib.crc32(me.encode()) % len(free)
        free = free[at:] + free[:at]
    take = free[:max(0, quota - len(keep))]
    return Plan(members, quota, tuple(keep), tuple(release), tuple(sorted(take)))


__all__ = ["PartitionView", "Plan", "members_of", "plan", "quotas"]
