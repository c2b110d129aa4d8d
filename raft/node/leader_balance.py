"""Leader balance (issue 26 item 2): each partition led by its preferred replica (the first
live one of its replica list), moved back a few at a time, never in a storm.

Who decides. Every node, for the partition groups it LEADS, calls the planner
(raft.controller.rebalance.plan_rebalance) with the leaders it knows for certain (its own
groups) and moves no replicas; the planner returns at most `max_transfers` leadership
transfers, each to the group's first live replica, and the node asks its own groups' cores for
them (transfer_leadership: the target is caught up first, then told to campaign). So nothing
has to report leaders anywhere (no new request, no traffic): the node that holds a leadership
is the one that knows it holds it and the only one that can hand it over. The bound is per
node and per round: at most `max_transfers` x (nodes leading something) transfers a round,
and a node that comes back gets its leaderships back that many at a time. (A controller-led
balancer would bound the total instead, at the price of a leaders report from every node; see
docs/DESIGN.md "Not yet".)

When. Only for a group this node has led for `stable_ms` without a replica move in progress
(raft.node.replica_moves says DONE), toward a replica that is a voter of its configuration on
a node the node-pair failure detector (raft.node.liveness) has reported up for `settle_ms`:
one view for every group, so a quiesced group, whose progress table stops counting ticks, is
not mistaken for one whose follower answers. The default topic's partition is left alone (its
leadership is what it was before topics: `transfer_leader`). Replica moves from the planner are
not made here: they change data placement and are the operator's (`raftlog topic move`;
`auto_rebalance_replicas` stays off).

How fast. A node keeps at most `max_in_flight` of its transfers under way at once (a transfer
is under way until the core gives it up or the leadership has gone) and asks for at most
`max_transfers` new ones a round, a round every `interval_ms`. A node that comes back after
an outage of a 3-node cluster with 1,000 partitions (~333 leaderships to get back) gets them
back from two nodes at ~8 a second: under 60 s, at most 2 x `max_in_flight` elections at a
time across the cluster, each a targeted one (TimeoutNow to a caught-up voter), never a storm.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from raft.controller.rebalance import plan_rebalance
from raft.core.types import Role
from raft.node.replica_moves import MoveStep

log = logging.getLogger("raftlog.node")


@dataclass(slots=True)
class BalanceSettings:
    """The knobs (documented like raft/node/config.py's; not command-line flags yet)."""

    # How often a node looks at the groups it leads (ms).
    interval_ms: int = 1_000
    # At most this many new leadership transfers per node per round: never a storm.
    max_transfers: int = 4
    # At most this many of a node's transfers under way at once (asked and not yet done or
    # given up): a slow target cannot make the rounds pile transfers up.
    max_in_flight: int = 4
    # A group is balanced only once this node has led it this long without a move (ms): a
    # cluster that just had an election or a restart settles first.
    stable_ms: int = 5_000
    # A node gets leaderships only once the failure detector has reported it up this long
    # (ms): a restarted node first starts its groups and catches up.
    settle_ms: int = 3_000
    # Replica moves proposed by the planner (data moves): off; operators decide (topic move).
    auto_rebalance_replicas: bool = False
    enabled: bool = True


IDLE_MAX_S = 8.0  # the longest pause between rounds while nothing is to be balanced


@dataclass(slots=True)
class LeaderBalancer:
    """One per node (raft.node.topic_runtime.TopicRuntime starts it)."""

    runtime: Any
    settings: BalanceSettings = field(default_factory=BalanceSettings)
    rounds: list[int] = field(default_factory=list)  # transfers asked per round (tests)
    _led_since: dict[int, float] = field(default_factory=dict)
    _unsettled: bool = False

    async def run(self) -> None:
        """A round every `interval_ms` while leadership moves or may need to; while rounds
        find nothing to do and neither the metadata nor the live nodes change, the pause
        doubles up to IDLE_MAX_S (a round walks every group: an idle node with 1,000
        partitions must not pay that every second). A node coming or going resets it."""
        base = self.settings.interval_ms / 1000
        interval, seen = base, None
        while True:
            await trio.sleep(interval)
            if not self.settings.enabled:
                continue
            now = trio.current_time()
            asked = self.once(now)
            state = (self.runtime.metadata.applied, frozenset(self._live(now)))
            quiet = asked == 0 and state == seen and not self._unsettled
            interval = min(interval * 2, IDLE_MAX_S) if quiet else base
            seen = state

    def once(self, now: float) -> int:
        """One round; how many transfers it asked for."""
        runtime, node = self.runtime, self.runtime.node
        meta = runtime.metadata
        if not runtime.controller.caught_up():
            self.rounds.append(0)
            return 0
        led: dict[int, int | None] = {}
        live = self._live(now)
        self._unsettled = False  # a group led for less than stable_ms, or a transfer under way
        voters: dict[int, tuple[int, ...]] = {}
        in_flight = 0
        for group_id in node.registry.ids():
            group = node.registry.get(group_id)
            core = None if group is None else group.core
            if group_id in runtime.unmanaged or core is None or core.role != Role.LEADER or group.closing:
                self._led_since.pop(group_id, None)
                continue
            since = self._led_since.setdefault(group_id, now)
            lead = core.leader
            if lead is not None and lead.transfer_target is not None:
                in_flight += 1
                self._unsettled = True
            if now - since < self.settings.stable_ms / 1000:
                self._unsettled = True
            step = runtime.mover.steps.get(group_id)
            moving = step is not None and step.kind is not MoveStep.DONE
            if (group_id in meta.groups and not moving and lead is not None
                    and lead.transfer_target is None
                    and now - since >= self.settings.stable_ms / 1000):
                led[group_id] = node.node_id
                voters[group_id] = core.config.voters
        room = min(self.settings.max_transfers, self.settings.max_in_flight - in_flight)
        if room <= 0:
            self.rounds.append(0)
            return 0
        plan = plan_rebalance(meta, live, led, max_moves=0, max_transfers=room)
        asked = 0
        for t in plan.transfers:
            if t.to_node not in voters.get(t.group, ()):
                continue  # (a move still under way: the replica list runs ahead)
            group = node.registry.get(t.group)
            try:
                group.core.transfer_leadership(t.to_node)
            except ValueError as e:
                log.info("leader_balance_refused node=%d group=%d to=%d error=%s",
                         node.node_id, t.group, t.to_node, e)
                continue
            group.kick()
            asked += 1
            log.info("leader_balance node=%d group=%d topic=%s partition=%d to=%d",
                     node.node_id, t.group, t.topic, t.partition, t.to_node)
        self.rounds.append(asked)
        del self.rounds[:-64]
        return asked

    def _live(self, now: float) -> set[int]:
        """This node and the peers the node's failure detector has reported up for at least
        `settle_ms` (all of them presumed up since the detector started, as it does)."""
        liveness = self.runtime.node.transport.liveness
        settle = self.settings.settle_ms / 1000
        return {self.runtime.node.node_id} | {
            p for p in liveness.peers() if liveness.up_for(p, now) >= settle}
