"""Shared builders for the controller tests: a metadata with registered nodes, and a way to
apply commands at consecutive offsets."""

from __future__ import annotations

from raft.controller.bootstrap import bootstrap
from raft.controller.commands import Command
from raft.controller.state import ApplyResult, ClusterMetadata


def founded(nodes: int = 3) -> ClusterMetadata:
    """A cluster of nodes 1..nodes after its bootstrap (default topic, group 1)."""
    return bootstrap({n: f"127.0.0.1:{9000 + n}" for n in range(1, nodes + 1)})


def run(meta: ClusterMetadata, *commands: Command) -> list[ApplyResult]:
    """Apply commands at the offsets after the last applied one."""
    return [meta.apply(meta.applied + 1, c) for c in commands]


def replica_counts(meta: ClusterMetadata, nodes: list[int]) -> dict[int, int]:
    counts = {n: 0 for n in nodes}
    for p in meta.groups.values():
        for n in p.replicas:
            if n in counts:
                counts[n] += 1
    return counts
