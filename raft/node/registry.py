"""The Raft groups a node runs, by group id: their tasks, their one ticker, and peer routing.

A node runs many groups (issue 26: each partition of a topic is a group) over one peer link per
node pair. The consensus core does not know group ids; the runtime does, here:

- `add` / `remove` start and stop one group's tasks (raft.node.group.RaftGroup.start) in a
  nursery of its own under the node's, so one group can be stopped (a topic deleted, a replica
  moved away) while the node and its other groups go on. The node calls these
  (`Node.add_group` / `Node.remove_group`), and so will the controller's reconciler.
- One ticker for the node, not one timer task per group: each tick calls `tick` on every awake
  group in one step, so whatever the groups send in a tick (above all the leaders' heartbeats)
  is queued before any peer link writes, and leaves in one frame per peer. Frames per node pair
  then grow with the nodes, not with the groups.
- Only awake groups are ticked. A quiesced core's tick does nothing (raft/core/quiesce.py), so
  the registry keeps the set of groups that may not be quiet (`_awake`): a group joins it on
  any input that reaches its core (RaftGroup.kick, which every input path calls: a peer
  message, a proposal, a flush report, a liveness report, `wake`), and the ticker drops it when
  it finds its core quiesced. A quiesced group then costs no per-tick work at all: the ticker
  never visits it, and while no group is awake the ticker itself sleeps until one wakes.
- Node liveness (raft.node.liveness, owned by the node's transport): every peer frame
  delivered here, pings included, counts as hearing from its sender; the detector's verdicts go
  to every group's core (`peer_down` / `peer_up`: a core ignores nodes outside its
  configuration and keeps the verdict should one join it), and a group added later is told
  which nodes are down when it is added.
- Peer frames are routed by the group id of each message's envelope
  (raft.protocol.raft_frames): each group gets its messages in the order they came; messages
  for a group this node does not run (not created here yet, or already removed) are dropped and
  counted (`unknown_group_messages`, the metric raftlog_peer_messages_unknown_group_total, and
  a rate-limited log line naming the group and the sender). Raft tolerates lost messages; a
  group that starts later catches up from its leader.
- Client requests are routed by their `group` field (the node asks `api`).
- After a burst of `add`s or `remove`s settles, the collector is refrozen (raft.node.gc_freeze):
  the new groups' objects leave the collections, the removed groups' cycles are freed first.
- A group's role, term or leader change is passed to every `on_state_change` hook with its
  id (the link manager starts a mirror partition's puller when this node becomes its leader):
  no timer, nothing at all while leadership stays put.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from raft.node.gc_freeze import GcRefreezer
from raft.node.group import DELIVER_SLICE_S, RaftGroup
from raft.protocol.raft_frames import GroupMessage

if TYPE_CHECKING:
    from raft.node.liveness import NodeLiveness
    from raft.node.metrics import NodeMetrics

log = logging.getLogger("raftlog.node")

# At most one log line per this many seconds about messages for groups the node does not run
# (a removed topic's peers keep sending until they remove it too).
UNKNOWN_GROUP_LOG_EVERY_S = 10.0


@dataclass(slots=True, eq=False)
class _Entry:
    """One registered group: the group, what its client requests see, its tasks' scope."""

    group: RaftGroup
    api: Any  # raft.node.api.ApiContext (kept opaque: the registry routes, it does not serve)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: bool = False
    done: trio.Event = field(default_factory=trio.Event)


class GroupRegistry:
    """The node's groups by id; see the module docstring."""

    def __init__(self, node_id: int, metrics: NodeMetrics | None = None,
                 liveness: NodeLiveness | None = None) -> None:
        self.node_id = node_id
        self._metrics = metrics
        self._entries: dict[int, _Entry] = {}
        # The groups the ticker visits: every group but those it found quiesced (see the
        # module docstring). Insertion-ordered, so ticks go in the order groups woke.
        self._awake: dict[_Entry, None] = {}
        self.group_ticks = 0  # group ticks done (a quiesced group adds none)
        self._liveness = liveness
        if liveness is not None:
            liveness.on_change = self.peer_state
        self._nursery: trio.Nursery | None = None
        self.ticks = 0  # ticks of the node's ticker so far (tests count frames per tick)
        self.sleeps = 0  # times the ticker found no group awake and slept until one woke
        self._any_awake = trio.Event()  # set by every input (`_woke`): the ticker's alarm
        self.unknown_group_messages = 0
        self.on_state_change: list[Callable[[int], None]] = []  # (group id): see the docstring
        self._unknown_logged_at: float | None = None
        self._unknown_since_log = 0
        # Refreezes the collector once a burst of group creations or deletions settles.
        self.gc = GcRefreezer()

    # -- the groups --------------------------------------------------------------------------------
    def get(self, group_id: int) -> RaftGroup | None:
        """The group `group_id` if this node runs it."""
        entry = self._entries.get(group_id)
        return None if entry is None else entry.group

    def api(self, group_id: int) -> Any:
        """What a client request for `group_id` is served with (None: not a group of ours)."""
        entry = self._entries.get(group_id)
        return None if entry is None else entry.api

    def ids(self) -> list[int]:
        return sorted(self._entries)

    def groups(self) -> Iterator[RaftGroup]:
        """The registered groups, by id."""
        return iter([self._entries[g].group for g in sorted(self._entries)])

    def __contains__(self, group_id: int) -> bool:
        return group_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def awake_count(self) -> int:
        """Groups the ticker visits now (not found quiesced since their last input)."""
        return len(self._awake)

    def status(self) -> dict[str, Any]:
        """For `status`: how many groups run here, how many are quiesced (their core says so)
        and how many the ticker visits."""
        quiesced = sum(1 for e in self._entries.values()
                       if e.group.core is not None and e.group.core.quiesced)
        return {"count": len(self._entries), "quiesced": quiesced, "awake": len(self._awake)}

    # -- node liveness -----------------------------------------------------------------------
    def peer_state(self, node_id: int, up: bool) -> None:
        """The node's failure detector changed its verdict on `node_id`: tell every group's
        core (peer_up / peer_down), and let each one's Ready loop and the ticker see it."""
        for entry in list(self._entries.values()):
            entry.group.peer_state(node_id, up)

    # -- lifecycle ---------------------------------------------------------------------------
    def add(self, group_id: int, group: RaftGroup, api: Any) -> None:
        """Register a group whose core runs (start_core done): it is routed to from now on, and
        its tasks start now if the node runs (else when it starts: `attach`)."""
        if isinstance(group_id, bool) or not isinstance(group_id, int) or group_id < 0:
            raise ValueError(f"a group id is an integer >= 0, got {group_id!r}")
        if group_id in self._entries:
            raise ValueError(f"group {group_id} already runs on node {self.node_id}; remove it "
                             f"first")
        if group.core is None:
            raise ValueError(f"group {group_id}: start its core before adding it")
        entry = self._entries[group_id] = _Entry(group, api)
        self.gc.changed(removed=False)
        group.on_input = lambda: self._woke(entry)
        group.on_state_change = lambda: self._state_changed(group_id)
        self._woke(entry)
        if self._liveness is not None:  # what the node's detector knows now
            for node_id in sorted(self._liveness.down):
                group.peer_state(node_id, False)
        if group.scrub_scheduler is not None:  # the node's one scrub task visits it
            group.scrub_scheduler.add(group.scrubber)
        if self._nursery is not None:
            self._start(entry)

    def attach(self, nursery: trio.Nursery, tick_s: float) -> None:
        """The node runs: start the registered groups' tasks and the ticker in `nursery`."""
        self._nursery = nursery
        for entry in self._entries.values():
            self._start(entry)
        nursery.start_soon(self._run_ticker, tick_s)
        nursery.start_soon(self.gc.run)

    def _start(self, entry: _Entry) -> None:
        assert self._nursery is not None and not entry.started
        entry.started = True

        async def run_group() -> None:
            try:
                with entry.scope:
                    async with trio.open_nursery() as nursery:
                        entry.group.start(nursery)
            finally:
                entry.done.set()

        self._nursery.start_soon(run_group)

    async def remove(self, group_id: int) -> RaftGroup:
        """Stop routing to, ticking and running group `group_id`, and wait until its tasks have
        ended (a running flush or metadata save is waited for, not abandoned). Its waiting
        client requests are answered SHUTTING_DOWN. The log is the caller's to flush and
        close."""
        entry = self._entries.pop(group_id, None)
        if entry is None:
            raise KeyError(f"group {group_id} does not run on node {self.node_id}; it runs "
                           f"{self.ids()}")
        self._awake.pop(entry, None)
        self.gc.changed(removed=True)
        entry.group.on_input = lambda: None
        entry.group.on_state_change = lambda: None
        entry.group.begin_shutdown()
        entry.scope.cancel()
        if entry.started:
            await entry.done.wait()
        if entry.group.scrub_scheduler is not None:  # not while a scrub reads its log
            await entry.group.scrub_scheduler.forget(entry.group.scrubber)
        entry.group.mark_closed()
        return entry.group

    def _state_changed(self, group_id: int) -> None:
        for hook in self.on_state_change:
            hook(group_id)

    def _woke(self, entry: _Entry) -> None:
        """An input reached `entry`'s group: the ticker visits it again (and wakes if asleep)."""
        self._awake[entry] = None
        self._any_awake.set()

    async def _run_ticker(self, interval: float) -> None:
        """One Raft tick for every awake group at a time (see the module docstring). While no
        group is awake the ticker sleeps on an event, not a timer: a node whose groups are all
        quiesced makes no tick wake-ups (20 a second at the default tick); the first input
        that wakes a group wakes the ticker, whose next tick comes one interval later."""
        deadline = trio.current_time()
        while True:
            if not self._awake:
                self.sleeps += 1
                while not self._awake:
                    if self._any_awake.is_set():
                        self._any_awake = trio.Event()
                    else:
                        await self._any_awake.wait()
                deadline = trio.current_time()
            deadline += interval
            now = trio.current_time()
            if deadline < now - 10 * interval:  # we were stalled: do not replay missed ticks
                deadline = now
            await trio.sleep_until(deadline)
            self.tick_awake()

    def tick_awake(self) -> None:
        """One tick of the node's ticker: tick each awake group; drop the ones found quiet."""
        self.ticks += 1
        awake = self._awake
        for entry in list(awake):
            if not entry.started:
                continue
            group = entry.group
            core = group.core
            if core is not None and core.quiesced:
                awake.pop(entry, None)  # back when an input reaches it (on_input)
                continue
            group.tick()
            self.group_ticks += 1
            if core is not None and core.quiesced:
                awake.pop(entry, None)

    # -- peer frames -----------------------------------------------------------------------------
    async def deliver_frame(self, items: list[GroupMessage], *, from_peer: int) -> None:
        """Hand each group its messages of one peer frame, in the order they came (a run of
        consecutive messages of one group at a time)."""
        if self._liveness is not None:
            self._liveness.heard(from_peer)
        i, n = 0, len(items)
        started = time.perf_counter()
        while i < n:
            if time.perf_counter() - started > DELIVER_SLICE_S:
                # A frame of many groups' messages is stepped in slices too, as one group's
                # are (RaftGroup.deliver_frame): a long step here is a silence the peers'
                # failure detectors would see.
                await trio.lowlevel.checkpoint()
                started = time.perf_counter()
            group_id = items[i][0]
            j = i + 1
            while j < n and items[j][0] == group_id:
                j += 1
            entry = self._entries.get(group_id)
            if entry is None:
                self._unknown_group(group_id, from_peer, j - i)
            elif not entry.group.closing:
                await entry.group.deliver_frame([msg for _, msg in items[i:j]],
                                                from_peer=from_peer)
            i = j

    def _unknown_group(self, group_id: int, from_peer: int, count: int) -> None:
        self.unknown_group_messages += count
        self._unknown_since_log += count
        if self._metrics is not None:
            self._metrics.unknown_group(from_peer, count)
        now = trio.current_time()
        if (self._unknown_logged_at is None
                or now - self._unknown_logged_at >= UNKNOWN_GROUP_LOG_EVERY_S):
            log.warning("peer_message_for_unknown_group node=%d group=%d from=%d dropped=%d "
                        "dropped_total=%d groups=%s: dropped; normal briefly while a group is "
                        "created or removed on its nodes, else check that the nodes agree on "
                        "which groups (partitions) this node runs", self.node_id, group_id,
                        from_peer, self._unknown_since_log, self.unknown_group_messages,
                        self.ids())
            self._unknown_logged_at = now
            self._unknown_since_log = 0
