"""The controller in the node: group 0's log applied to the cluster metadata, its bootstrap, and
the admin commands proposed through it (issue 26; docs/DESIGN.md "The controller in the node").

- Following: every node applies each committed controller entry in log order
  (raft.controller.follower.MetadataFollower) after each Ready in which group 0's commit index
  moved, at most APPLY_BATCHES batches per step with a checkpoint between steps, so a long
  controller log never holds the event loop. An entry this build does not know
  (UnsupportedCommand) or a log start with no metadata stored with it (MetadataGap) stops the
  node loudly (fail-stop): skipping it would make this node's metadata diverge.
- Bootstrap: the controller group's leader proposes `bootstrap_commands(founders)` when the
  metadata it has applied is empty, everything in its log is committed and applied, and it has
  not proposed them in this term. A later leader that proposes them again is harmless: the
  state machine keeps a registered node's address and refuses a second `default` topic
  (tests/node/test_topics_inproc.py checks the state is the same).
- Admin commands: the leader proposes one command as a CONTROL batch (quorum acks) and answers
  once the entry committed AND this node applied it, with the verdict its own apply reached.
- Listeners (`on_applied`) hear of every applied step: the reconciler starts and stops groups.

Retention: the controller's log is cut by its own size limit (`controller_retention_bytes`);
the metadata at the new log start travels with it as a snapshot section of group 0 only
(raft.controller.section, passed in RaftConfig.snapshot_sections), so a restarted node, or one
whose log a state transfer reset, restores it from there. Retention never cuts past what this
node has applied (the `metadata` hold).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from raft.controller.bootstrap import bootstrap_commands
from raft.controller.commands import Command, MalformedCommand, UnsupportedCommand, encode_command
from raft.controller.follower import MetadataFollower, MetadataGap
from raft.controller.state import ApplyResult, ClusterMetadata
from raft.core.retention import Hold
from raft.core.types import Acks, ErrorCode, Role
from storage.batch import Batch, BatchKind

if TYPE_CHECKING:
    from raft.node.group import RaftGroup

log = logging.getLogger("raftlog.node")

APPLY_BATCHES = 256  # controller batches applied per step before yielding
RESULTS_KEPT = 4096  # verdicts kept for proposers that wait for theirs
WAKE_EVERY_S = 1.0  # a safety net only: every change that matters wakes the follower


@dataclass(slots=True, frozen=True)
class Proposed:
    """What proposing a command came to: its offset and verdict, or the error to answer."""

    offset: int = -1
    result: ApplyResult | None = None
    error: ErrorCode | None = None
    message: str = ""


class ControllerService:
    """One node's follower of the controller log (group 0), and its proposer when it leads."""

    def __init__(self, group: RaftGroup, founders: Callable[[], Mapping[int, str]]) -> None:
        self.group = group
        self._founders = founders  # {node id: address} of the controller's voters, when asked
        self.follower: MetadataFollower | None = None
        self._results: OrderedDict[int, ApplyResult] = OrderedDict()
        self._applied = trio.Event()
        self._bootstrapped_term = -1
        self.on_applied: list[Callable[[], None]] = []
        self.shards = 1  # what the bootstrap registers each founder with (docs/SHARDS.md)

    @property
    def metadata(self) -> ClusterMetadata:
        """The metadata applied so far (empty before the log is open)."""
        return self.follower.metadata if self.follower is not None else ClusterMetadata()

    @property
    def applied(self) -> int:
        return self.metadata.applied

    def open(self) -> None:
        """The group's log is open: restore the metadata stored with its start (if cut) and
        apply what is committed later, step by step (`run`)."""
        assert self.group.log is not None
        try:
            self.follower = MetadataFollower(self.group.log)
        except MetadataGap as e:
            self.group.fail(e, "controller restore")
            raise
        retention = self.group.retention
        if retention is not None:  # never cut what this node has not applied yet: proposers
            # wait for their entries' verdicts, and listeners for each step's effects
            retention.holders.register("metadata", self._retention_holds)

    def _retention_holds(self) -> list[Hold]:
        follower = self.follower
        return [] if follower is None else [Hold("metadata", follower.position, False)]

    def caught_up(self) -> bool:
        """Whether the metadata here is as current as this node can know: every controller
        entry it knows committed is applied, and the controller has a leader. A node replaying
        its controller log after a restart holds old replica lists meanwhile: acting on them
        (raft.node.replica_moves) would undo moves already carried out."""
        core = self.group.core
        return (self.follower is not None and core is not None and core.leader_id is not None
                and self.follower.position > core.commit_index)

    def leader(self) -> int | None:
        core = self.group.core
        return None if core is None else core.leader_id

    # -- following -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Apply committed controller entries whenever group 0's commit index moves; propose
        the bootstrap when this node leads a controller with nothing applied."""
        group = self.group
        while not group.closing:
            before = self.follower.position if self.follower is not None else None
            self.step()
            if group.failure is not None:
                return
            self._maybe_bootstrap()
            moved = self.follower is not None and self.follower.position != before
            caught_up = (self.follower is not None
                         and self.follower.position > group.core.commit_index)
            if caught_up or not moved:  # (not moved: a damaged batch waits for its repair)
                await self._wait_change()
            else:
                await trio.lowlevel.checkpoint()

    async def _wait_change(self) -> None:
        """Until a Ready moved group 0's commit index or its role/term/leader changed (the
        bootstrap waits for leadership), or WAKE_EVERY_S passed: no polling while idle."""
        group = self.group
        with trio.move_on_after(WAKE_EVERY_S):
            async with trio.open_nursery() as nursery:
                async def until(wait: Callable[[], Awaitable[None]]) -> None:
                    await wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until, group.wait_hw_change)
                nursery.start_soon(until, group.wait_state_change)

    def step(self, max_batches: int = APPLY_BATCHES) -> int:
        """Apply at most `max_batches` committed batches; how many entries were applied."""
        if self.follower is None or self.group.core is None or self.group.failure is not None:
            return 0
        try:
            applied = self.follower.catch_up(self.group.core.commit_index, max_batches)
        except (UnsupportedCommand, MetadataGap) as e:
            self.group.fail(e, "controller apply (upgrade this node to the cluster's version)"
                            if isinstance(e, UnsupportedCommand) else "controller apply")
            return 0
        for a in applied:
            self._results[a.offset] = a.result
            if not a.result.ok:
                log.info("controller_refused node=%d offset=%d refusal=%s reason=%s",
                         self.group.node_id, a.offset, a.result.refusal.value, a.result.reason)
        while len(self._results) > RESULTS_KEPT:
            self._results.popitem(last=False)
        if applied:
            self._applied.set()
            self._applied = trio.Event()
            for listener in list(self.on_applied):
                listener()
        return len(applied)

    async def wait_applied(self, offset: int) -> bool:
        """Until the metadata applied `offset` (False if the group closed first)."""
        while self.metadata.applied < offset:
            if self.group.closing:
                return False
            await self._applied.wait()
        return True

    # -- bootstrap ---------------------------------------------------------------------------------
    def _maybe_bootstrap(self) -> None:
        group, core = self.group, self.group.core
        if (core is None or core.role != Role.LEADER or group.closing
                or self._bootstrapped_term == core.term or self.follower is None):
            return
        meta = self.follower.metadata
        if meta.nodes or meta.topics:
            return
        # Everything in the log committed and applied: no earlier leader's bootstrap waits.
        if (group.log.dirty_offset != core.commit_index
                or self.follower.position <= core.commit_index):
            return
        self._bootstrapped_term = core.term
        founders = dict(self._founders())
        log.info("controller_bootstrap node=%d term=%d founders=%s", group.node_id, core.term,
                 founders)
        now = int(time.time() * 1000)
        for command in bootstrap_commands(founders, shards=self.shards):
            batch = Batch.create(encode_command(command), 1, kind=BatchKind.CONTROL,
                                 timestamp_ms=now)
            try:
                core.propose(0, batch, Acks.LEADER)  # answered to nobody; applied by all
            except Exception as e:  # a refusal (not leader any more): the next leader does it
                log.warning("controller_bootstrap_refused node=%d error=%s", group.node_id, e)
                return
        group.kick()

    # -- proposing ---------------------------------------------------------------------------------
    async def propose(self, command: Command, timeout_s: float) -> Proposed:
        """Propose `command` (this node must lead the controller) and wait until it committed
        and was applied here; its verdict."""
        try:
            payload = encode_command(command)
        except MalformedCommand as e:
            return Proposed(error=ErrorCode.BAD_REQUEST, message=str(e))
        batch = Batch.create(payload, 1, kind=BatchKind.CONTROL,
                             timestamp_ms=int(time.time() * 1000))
        deadline = trio.current_time() + timeout_s
        try:
            answer = await self.group.propose_and_wait(batch, Acks.QUORUM, timeout_s)
        except ValueError as e:
            return Proposed(error=ErrorCode.BAD_REQUEST, message=str(e))
        if answer.error != ErrorCode.OK:
            return Proposed(error=answer.error)
        offset = answer.base_offset
        with trio.move_on_at(deadline):
            if not await self.wait_applied(offset):
                return Proposed(offset, error=ErrorCode.SHUTTING_DOWN)
        result = self._results.get(offset)
        if result is None:
            return Proposed(offset, error=ErrorCode.TIMEOUT,
                            message=f"the controller entry at {offset} committed but is not "
                                    f"applied on this node yet; ask `metadata` for the result")
        return Proposed(offset, result)
