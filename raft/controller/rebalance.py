"""The rebalance planner: a few moves and leadership transfers toward balance, never a storm.

The controller's leader calls `plan_rebalance` on a timer once the cluster is stable (the
runtime decides what stable means: no node joined or left, no election, for a while) and carries
out what it returns: each move is a MoveReplicas command in the controller log (then the group's
own learner -> voter change), each transfer a leadership transfer in that group. Every call
returns at most `max_moves` moves and `max_transfers` transfers, so a node coming back after an
outage gets its leaderships back a few at a time (Redpanda moved 3-4 leaderships a second and
users still saw it, #4359; a storm of transfers is many elections at once). Called again after
those are done, it plans the next few; repeated, it reaches balance and then plans nothing.

What it balances, in order:
1. Replicas off decommissioned nodes (a drain), then replicas from the most to the least loaded
   eligible node (active and live) until every eligible node is within one of another.
2. Preferred leaders (the first replica): reordering a partition's replicas moves no data, so
   counts of first replicas are evened out the same way, where a partition allows it.
3. Leadership: each partition should be led by its first live replica; transfers go there,
   taking first from the nodes leading the most.
A partition is moved at most once per plan, and only when all its replicas are live (a change
of membership while a member is down is a risk the planner does not take on its own).
Pure and deterministic: the same inputs give the same plan, ties broken by node and group id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from raft.controller.commands import MoveReplicas
from raft.controller.placement import eligible_nodes
from raft.controller.state import ClusterMetadata, NodeStatus

DEFAULT_MAX_MOVES = 2
DEFAULT_MAX_TRANSFERS = 4


@dataclass(slots=True, frozen=True)
class LeaderTransfer:
    group: int
    topic: str
    partition: int
    from_node: int
    to_node: int


@dataclass(slots=True, frozen=True)
class RebalancePlan:
    moves: tuple[MoveReplicas, ...] = ()
    transfers: tuple[LeaderTransfer, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.moves and not self.transfers


def plan_rebalance(meta: ClusterMetadata, live: Iterable[int],
                   leaders: Mapping[int, int | None], *,
                   max_moves: int = DEFAULT_MAX_MOVES,
                   max_transfers: int = DEFAULT_MAX_TRANSFERS) -> RebalancePlan:
    """At most `max_moves` replica moves and `max_transfers` leadership transfers toward
    balance. `leaders`: group id -> the node leading it now (None or absent: no leader)."""
    alive = set(live)
    planner = _Planner(meta, alive, eligible_nodes(meta, alive))
    moves: list[MoveReplicas] = []
    for step in (planner.drain_step, planner.replica_step, planner.leader_order_step):
        while len(moves) < max_moves:
            move = step()
            if move is None:
                break
            moves.append(move)
    return RebalancePlan(tuple(moves), tuple(_transfers(meta, alive, leaders, max_transfers)))


class _Planner:
    """The assignment as it will be after the moves planned so far."""

    def __init__(self, meta: ClusterMetadata, alive: set[int], eligible: list[int]) -> None:
        self.meta = meta
        self.alive = alive
        self.eligible = eligible
        self.assignment = {g: list(p.replicas) for g, p in sorted(meta.groups.items())}
        self.touched: set[int] = set()
        self.draining = {n for n, i in meta.nodes.items()
                         if i.status is NodeStatus.DECOMMISSIONED}

    def _movable(self, group: int) -> bool:
        return group not in self.touched and all(n in self.alive or n in self.draining
                                                 for n in self.assignment[group])

    def _replica_counts(self) -> dict[int, int]:
        counts = {n: 0 for n in self.eligible}
        for replicas in self.assignment.values():
            for n in replicas:
                if n in counts:
                    counts[n] += 1
        return counts

    def _move(self, group: int, replicas: list[int]) -> MoveReplicas:
        self.assignment[group] = replicas
        self.touched.add(group)
        p = self.meta.groups[group]
        return MoveReplicas(p.topic, p.index, tuple(replicas))

    def drain_step(self) -> MoveReplicas | None:
        """One replica off a decommissioned node, to the least loaded eligible node."""
        counts = self._replica_counts()
        for group, replicas in self.assignment.items():
            if not self._movable(group):
                continue
            for pos, node in enumerate(replicas):
                if node not in self.draining:
                    continue
                targets = [n for n in self.eligible if n not in replicas]
                if targets:
                    target = min(targets, key=lambda n: (counts[n], n))
                    return self._move(group, replicas[:pos] + [target] + replicas[pos + 1:])
        return None

    def replica_step(self) -> MoveReplicas | None:
        """One replica from a node holding more than one above another to that other."""
        counts = self._replica_counts()
        by_load = sorted(self.eligible, key=lambda n: (-counts[n], n))
        for hi in by_load:
            for lo in reversed(by_load):
                if counts[hi] - counts[lo] <= 1:
                    break
                for group, replicas in self.assignment.items():
                    if hi in replicas and lo not in replicas and self._movable(group):
                        return self._move(group, [lo if n == hi else n for n in replicas])
        return None

    def leader_order_step(self) -> MoveReplicas | None:
        """Make a less-preferred node first in one partition of a node preferred for more than
        one above it (a reorder: no data moves)."""
        lead = {n: 0 for n in self.eligible}
        for replicas in self.assignment.values():
            if replicas[0] in lead:
                lead[replicas[0]] += 1
        by_lead = sorted(self.eligible, key=lambda n: (-lead[n], n))
        for hi in by_lead:
            for lo in reversed(by_lead):
                if lead[hi] - lead[lo] <= 1:
                    break
                for group, replicas in self.assignment.items():
                    if replicas[0] == hi and lo in replicas and self._movable(group):
                        order = [lo] + [n for n in replicas if n != lo]
                        return self._move(group, order)
        return None


def _transfers(meta: ClusterMetadata, alive: set[int], leaders: Mapping[int, int | None],
               limit: int) -> list[LeaderTransfer]:
    """Leadership to each partition's first live replica, the busiest leaders first."""
    led: dict[int, int] = {}
    for node in leaders.values():
        if node is not None:
            led[node] = led.get(node, 0) + 1
    wanted = []
    for group, p in sorted(meta.groups.items()):
        current = leaders.get(group)
        if current is None or current not in alive:
            continue  # electing, or its leader is gone: the group sorts that out itself
        desired = next((n for n in p.replicas if n in alive), None)
        if desired is not None and desired != current:
            wanted.append((-led.get(current, 0), group, current, desired))
    out = []
    for _, group, current, desired in sorted(wanted):
        if len(out) >= limit:
            break
        p = meta.groups[group]
        out.append(LeaderTransfer(group, p.topic, p.index, current, desired))
    return out
