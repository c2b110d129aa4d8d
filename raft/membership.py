"""Cluster membership: who votes, who only learns, and where new members listen.

A configuration travels as a CONFIG batch in the log and is in force as soon as it is appended
(not when committed: the Raft dissertation's single-server change rule), so a truncation can
take it back. Only one change is in flight at a time, which keeps any two successive
configurations' majorities overlapping.
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
        return {"voters": list(self.voters), "learners": list(self.learners),
                "addresses": {str(k): v for k, v in sorted(self.addresses.items())}}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "ClusterConfig":
        return ClusterConfig(tuple(int(v) for v in d["voters"]),
                             tuple(int(v) for v in d.get("learners", ())),
                             {int(k): str(v) for k, v in d.get("addresses", {}).items()})

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
        return ClusterConfig(self.voters, tuple(sorted(self.learners + (node_id,))), addresses)

    def promoted(self, node_id: int) -> "ClusterConfig":
        return ClusterConfig(tuple(sorted(self.voters + (node_id,))),
                             tuple(n for n in self.learners if n != node_id), dict(self.addresses))

    def without(self, node_id: int) -> "ClusterConfig":
        return ClusterConfig(tuple(n for n in self.voters if n != node_id),
                             tuple(n for n in self.learners if n != node_id),
                             {k: v for k, v in self.addresses.items() if k != node_id})


@dataclass(slots=True)
class ConfigEntry:
    """A configuration and where it entered the log (offset -1: the bootstrap configuration,
    which is not in the log)."""

    offset: int
    term: int
    config: ClusterConfig
