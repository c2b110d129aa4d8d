"""Replica moves, carried out by each partition's leader (issue 26 item 2).

The controller's replica list of a partition is the DESIRED set (`MoveReplicas` changes it);
the group's own Raft configuration is the CURRENT one. On every node, for every partition group
it leads, this task drives the configuration toward the desired set with the membership changes
the core has, one single-server change at a time (the core refuses a second one while one is
uncommitted):

1. a desired node that is not a member is added as a LEARNER (the core promotes it to voter once
   its log reaches the leader's flushed offset: raft/core/confchange.py `_maybe_promote`);
2. a learner that is not desired is removed;
3. once every desired node votes, a voter that is not desired leaves. The leaving replica must
   see its own removal committed, since that is when it may stop and drop its copy
   (raft.node.reconciler), and a follower removed by someone else never hears of it (the leader
   stops sending to non-members). So the leader hands leadership to the leaving voter if it is
   reachable (heard from recently), and a leader that is itself not desired removes itself:
   it appends the configuration without itself, goes on managing the group (not counted
   toward its majority) and steps down once that commits (the core's `_on_commit`), so it sees
   the commit. An unreachable leaving voter is removed by the leader directly; its copy then
   stays on its disk until it learns otherwise (docs/DESIGN.md "Not yet").

Only with current metadata (`ControllerService.caught_up`): a leader replaying its controller log
after a restart would otherwise take the old replica list for the desired one and undo a move.

Bounded: at most MAX_CHANGES_PER_PASS groups get a change per pass, a pass every
MOVE_EVERY_TICKS ticks; each change is the core's own proposal (nobody waits for its answer:
the next pass sees the configuration it led to). `plan_step` is pure and tested alone.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Any

import trio

from raft.core.confchange import INTERNAL_REQUEST
from raft.core.types import Role

log = logging.getLogger("raftlog.node")

MOVE_EVERY_TICKS = 10
IDLE_MAX_S = 8.0  # the longest pause between passes while nothing is to be moved
MAX_CHANGES_PER_PASS = 8
# A leaving voter heard from within this many ticks is handed leadership (so it sees its own
# removal commit); one not heard from longer is removed by the leader directly.
REACHABLE_TICKS = 20


class MoveStep(str, Enum):
    DONE = "done"  # the configuration is the desired set
    ADD_LEARNER = "add_learner"
    CATCHING_UP = "catching_up"  # a desired learner waits for the core to promote it
    REMOVE = "remove"  # a member that is not desired, removed by the leader
    HAND_OVER = "hand_over"  # leadership to a leaving voter, which then removes itself
    REMOVE_SELF = "remove_self"  # the leader is not desired: it removes itself


@dataclass(slots=True, frozen=True)
class Step:
    kind: MoveStep
    node: int | None = None


def plan_step(voters: Collection[int], learners: Collection[int], desired: Collection[int],
              me: int, reachable: Collection[int]) -> Step:
    """The next single-server change toward `desired`, as the leader `me` sees it."""
    members = set(voters) | set(learners)
    want = set(desired)
    missing = want - members
    if missing:
        return Step(MoveStep.ADD_LEARNER, min(missing))
    extra_learners = set(learners) - want
    if extra_learners:
        return Step(MoveStep.REMOVE, min(extra_learners))
    if set(learners) & want:
        return Step(MoveStep.CATCHING_UP, min(set(learners) & want))
    extra = set(voters) - want
    if not extra:
        return Step(MoveStep.DONE)
    if me in extra:
        return Step(MoveStep.REMOVE_SELF, me)
    leaving = min(extra)
    return Step(MoveStep.HAND_OVER if leaving in reachable else MoveStep.REMOVE, leaving)


class ReplicaMover:
    """One per node (raft.node.topic_runtime.TopicRuntime starts it)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.changes = 0  # changes proposed so far (status, tests)
        self.steps: dict[int, Step] = {}  # group -> the step its last pass found (status)

    async def run(self) -> None:
        """A pass every MOVE_EVERY_TICKS while moves are under way; while every group this node
        leads is where the metadata wants it and the metadata does not change, the pause
        doubles up to IDLE_MAX_S: a pass walks every group, and an idle node with 1,000
        partitions must not pay that twice a second (issue 26: cost grows with bytes and
        nodes, not partitions). A new controller entry resets it at the next pass."""
        node = self.runtime.node
        base = MOVE_EVERY_TICKS * node.config.tick_ms / 1000
        interval, seen = base, None
        while True:
            await trio.sleep(interval)
            made = self.once()
            applied = self.runtime.metadata.applied
            idle = made == 0 and applied == seen and all(
                s.kind is MoveStep.DONE for s in self.steps.values())
            interval = min(interval * 2, IDLE_MAX_S) if idle else base
            seen = applied

    def once(self, limit: int = MAX_CHANGES_PER_PASS) -> int:
        """One pass over the groups this node leads; how many changes it proposed."""
        runtime, node = self.runtime, self.runtime.node
        meta = runtime.metadata
        made = 0
        if not runtime.controller.caught_up():
            return 0  # old replica lists (a restart replaying): never undo a move
        self.steps = {g: s for g, s in self.steps.items() if g in meta.groups}
        for group_id in node.registry.ids():
            p = meta.groups.get(group_id)
            group = node.registry.get(group_id)
            if (p is None or group_id in runtime.unmanaged or group is None or group.closing
                    or group.core is None or group.core.role != Role.LEADER):
                continue
            core = group.core
            cfg = core.config
            lead = core.leader
            reachable = {n for n, pr in lead.progress.items()
                         if pr.ticks_since_heard <= REACHABLE_TICKS} if lead else set()
            step = plan_step(cfg.voters, cfg.learners, p.replicas, node.node_id, reachable)
            self.steps[group_id] = step
            if step.kind in (MoveStep.DONE, MoveStep.CATCHING_UP):
                continue
            if made >= limit:
                break
            if core._config_change_blocked() or (lead is not None
                                                 and lead.transfer_target is not None):
                continue  # one change at a time: the next pass looks again
            if self._act(group, step, meta):
                made += 1
        self.changes += made
        return made

    def _act(self, group: Any, step: Step, meta: Any) -> bool:
        core, node = group.core, self.runtime.node
        n = step.node
        assert n is not None
        log.info("replica_move node=%d group=%d step=%s target=%d voters=%s learners=%s",
                 node.node_id, group.group_id, step.kind.value, n, list(core.config.voters),
                 list(core.config.learners))
        try:
            if step.kind is MoveStep.ADD_LEARNER:
                info = meta.nodes.get(n)
                address = info.address if info is not None else node.peer_address(n)
                core.propose_config(INTERNAL_REQUEST, add_learner=n, address=address)
            elif step.kind is MoveStep.REMOVE:
                core.propose_config(INTERNAL_REQUEST, remove=n)
            elif step.kind is MoveStep.HAND_OVER:
                core.transfer_leadership(n)
            else:  # REMOVE_SELF: managed until it commits, then the core steps down
                core._propose_config(INTERNAL_REQUEST, core.config.without(node.node_id))
        except ValueError as e:  # refused (not a voter, no longer leader): the next pass
            log.info("replica_move_refused node=%d group=%d error=%s", node.node_id,
                     group.group_id, e)
            return False
        group.kick()
        return True
