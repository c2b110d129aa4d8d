"""Cluster membership: who votes, who only learns, and where new members listen.

A configuration travels as a CONFIG batch in the log and is in force as soon as it is appended
(not when committed: the Raft dissertation's single-server change rule), so a truncation can
take it back. Only one change is in flight at a time, which keeps any two successive
configurations' majorities overlapping.

A configuration also records the incarnation (data-directory identity) of the members it knows
one of: set when a learner is promoted or a member that lost its disk is re-added, and for the
others whenever the leader makes a change anyway (raft/core/incarnation.py). Recording one never
changes who votes, so it rides along with any change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from storage.batch import Batch, BatchKind


@dataclass(slots=True, frozen=True)
class ClusterConfig:
    voters: tuple[int, ...]
    learners: tuple[int, ...] = ()
    # Addresses of members added at run time (bootstrap members' addresses come from the
    # node's own peer list).
    addresses: dict[int, str] = field(default_factory=dict)
    # member -> the incarnation it was added with (absent: not recorded yet).
    incarnations: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.voters:
            raise ValueError("a configuration needs at least one voter")
        if set(self.voters) & set(self.learners):
            raise ValueError(f"nodes {sorted(set(self.voters) & set(self.learners))} cannot be "
                             f"both voter and learner")

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.voters) | set(self.learners)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "voters": list(self.voters), "learners": list(self.learners),
            "addresses": {str(k): v for k, v in sorted(self.addresses.items())}}
        if self.incarnations:
            out["incarnations"] = {str(k): v for k, v in sorted(self.incarnations.items())}
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ClusterConfig":
        return ClusterConfig(tuple(int(v) for v in d["voters"]),
                             tuple(int(v) for v in d.get("learners", ())),
                             {int(k): str(v) for k, v in d.get("addresses", {}).items()},
                             {int(k): int(v) for k, v in d.get("incarnations", {}).items()})

    def to_batch(self, timestamp_ms: int = 0) -> Batch:
        return Batch.create(msgpack.packb(self.to_dict()), 1, kind=BatchKind.CONFIG,
                            timestamp_ms=timestamp_ms)

    @staticmethod
    def from_batch(batch: Batch) -> "ClusterConfig":
        return ClusterConfig.from_dict(msgpack.unpackb(batch.payload, strict_map_key=False))

    def with_learner(self, node_id: int, address: str | None) -> "ClusterConfig":
        addresses = dict(self.addresses)
        if address:
            addresses[node_id] = address
        return ClusterConfig(self.voters, tuple(sorted(self.learners + (node_id,))), addresses,
                             dict(self.incarnations))

    def promoted(self, node_id: int) -> "ClusterConfig":
        return ClusterConfig(tuple(sorted(self.voters + (node_id,))),
                             tuple(n for n in self.learners if n != node_id), dict(self.addresses),
                             dict(self.incarnations))

    def without(self, node_id: int) -> "ClusterConfig":
        return ClusterConfig(tuple(n for n in self.voters if n != node_id),
                             tuple(n for n in self.learners if n != node_id),
                             {k: v for k, v in self.addresses.items() if k != node_id},
                             {k: v for k, v in self.incarnations.items() if k != node_id})

    def rejoined(self, node_id: int, incarnation: int) -> "ClusterConfig":
        """A member that lost its disk, back as a learner with its new incarnation (a voter
        leaves the voters: one voter fewer, the single-server rule)."""
        return ClusterConfig(tuple(n for n in self.voters if n != node_id),
                             tuple(sorted(set(self.learners) | {node_id})), dict(self.addresses),
                             {**self.incarnations, node_id: incarnation})

    def with_recorded(self, incarnations: dict[int, int]) -> "ClusterConfig":
        """The same members, with these incarnations recorded for members that have none yet
        (a recorded incarnation changes only through `rejoined`)."""
        members = set(self.members)
        new = {k: v for k, v in incarnations.items()
               if k in members and v and k not in self.incarnations}
        return ClusterConfig(self.voters, self.learners, dict(self.addresses),
                             {**self.incarnations, **new})


@dataclass(slots=True)
class ConfigEntry:
    """A configuration and where it entered the log (offset -1: the bootstrap configuration,
    which is not in the log)."""

    offset: int
    term: int
    config: ClusterConfig
