"""The node's reconciler: the partition groups it runs follow the controller metadata it applied.

After every applied controller step (and once at start, which is how a restarting node brings
back the partitions its store holds) it compares the applied metadata with the groups the node
runs and stores (raft.controller.reconcile.reconcile) and acts. The metadata's replica list is
the DESIRED set; the group's own Raft configuration is the CURRENT one, which only the
partition's leader changes (raft.node.replica_moves, one single-server change at a time):
- start: a partition assigned here that does not run: its log from the node's store
  (`store.open_log(group)`: the data a restart finds, or a new empty log). A founding replica
  (named in the replica list the group was created with) founds it with those voters; a
  replica moved in later starts as a NON-member (empty log, its bootstrap configuration
  without itself, like `--join`), never campaigns, and waits for the leader to add it as a
  learner and promote it once caught up;
- stop: running but no longer assigned here: only once the group's configuration in force,
  committed, no longer names this node (the leaving replica removes itself as the group's
  leader, so it sees that commit); then the group stops and its data is dropped. Until then
  it keeps running: stopping a voter still counted toward the group's majority would cost
  availability, dropping its data could lose acknowledged records;
- a group held on disk, not assigned and not running (a restart before the removal was seen)
  runs again, to see its removal;
- delete: a deleted topic's group running or stored here: `remove_group` if it runs, then
  `store.drop_log` (topic delete removes the data on every node).
At most MAX_ACTIONS_PER_PASS actions per pass with a checkpoint between passes: creating or
deleting a topic of many partitions never holds the event loop.

Two groups are never touched: the controller (group 0), and the default topic's partition
(storage.api.LEGACY_GROUP): its replicas are every member node, whatever its metadata replica
list says (membership changes its configuration directly, as before topics; docs/DESIGN.md
"The controller in the node").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

import trio

from raft.controller.reconcile import ReconcilePlan, reconcile
from raft.controller.state import ClusterMetadata, Partition
from storage.api import LEGACY_GROUP, IoMode, LogStorage, LogStore

log = logging.getLogger("raftlog.node")

MAX_ACTIONS_PER_PASS = 16
# While a moved-away replica waits for its removal to commit, the reconciler looks again this
# often (nothing else wakes it: the change is the group's, not the controller's).
RECHECK_S = 0.2
UNMANAGED = frozenset({0, LEGACY_GROUP})  # the controller and the default topic's partition


class ReconcileHost(Protocol):
    """What the reconciler needs of the node (raft.node.server.Node)."""

    node_id: int

    @property
    def metadata(self) -> ClusterMetadata: ...

    @property
    def store(self) -> LogStore: ...

    def running_groups(self) -> list[int]: ...

    def know_node(self, node_id: int, address: str) -> None: ...

    def founders_of(self, group_id: int) -> tuple[int, ...] | None:
        """The replica list `group_id` was created with (None: not known here)."""

    def still_named(self, group_id: int) -> bool:
        """Whether the running group's configuration in force names this node, or a newer
        configuration is not committed yet (it could be taken back)."""

    async def add_group(self, group_id: int, voters: list[int], log_storage: LogStorage, *,
                        owns_log: bool = False, translated: bool = False) -> Any: ...

    async def remove_group(self, group_id: int) -> Any: ...


class Reconciler:
    """See the module docstring. `kick()` after every applied controller step; `run()` is the
    node's task."""

    def __init__(self, host: ReconcileHost) -> None:
        self.host = host
        self._wake = trio.Event()
        self._wake.set()  # the first pass runs at start: a restart brings its groups back
        self.passes = 0
        self.dropped: list[int] = []  # groups whose data this node dropped (tests, status)
        self.leaving: set[int] = set()  # moved away, still named by their configuration

    def kick(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(RECHECK_S if self.leaving else float("inf")):
                await self._wake.wait()
            self._wake = trio.Event()
            while await self.reconcile_once():
                await trio.lowlevel.checkpoint()  # more to do: the next pass, after others ran

    def plan(self, stored: list[int] | None = None) -> ReconcilePlan:
        host = self.host
        running = [g for g in host.running_groups() if g not in UNMANAGED]
        stored = host.store.group_ids() if stored is None else stored
        on_disk = [g for g in stored if g not in UNMANAGED]
        return reconcile(host.metadata, host.node_id, running, on_disk, _shard(host))

    async def reconcile_once(self, limit: int = MAX_ACTIONS_PER_PASS) -> bool:
        """One bounded pass; True when work was left for the next one."""
        host = self.host
        meta = host.metadata
        if meta.applied < 0:
            return False
        # Off the event loop, once a pass: listing the store's groups takes the store's write
        # lock, which every group's fsynced term/vote save holds; during a create of 1,000
        # partitions (hundreds of elections, each saving its vote) the loop waited on it at
        # every pass (docs/PERFORMANCE.md).
        stored = await self._io(host.store.group_ids)
        plan = self.plan(stored)
        self.passes += 1
        actions = 0
        running = set(host.running_groups())
        for group_id in plan.delete:
            if actions >= limit:
                return True
            actions += 1
            if group_id in running:
                await host.remove_group(group_id)
            await self._io(host.store.drop_log, group_id)
            self.dropped.append(group_id)
            log.info("partition_dropped node=%d group=%d (its topic was deleted)",
                     host.node_id, group_id)
        self.leaving = set()
        for group_id in plan.stop:
            if host.still_named(group_id):
                self.leaving.add(group_id)
                continue  # a member still: the leader removes it first (module docstring)
            if actions >= limit:
                return True
            actions += 1
            await host.remove_group(group_id)
            await self._io(self.host.store.drop_log, group_id)  # (moved away: not deleted)
            self.dropped.append(group_id)
            log.info("partition_moved_away node=%d group=%d (its configuration no longer "
                     "names this node: stopped, data dropped)", host.node_id, group_id)
        assigned = meta.groups_of(host.node_id, _shard(host))
        gone = set(self.dropped[-actions:]) if actions else set()  # dropped by this pass
        resume = sorted(g for g in stored if g not in UNMANAGED and g not in gone
                        and g in meta.groups and g not in assigned and g not in running)
        for group_id in resume:
            if actions >= limit:
                return True
            actions += 1
            self.leaving.add(group_id)  # (looked at again by the next pass)
            await self._start(meta, meta.groups[group_id], joining=True)
        for partition in plan.start:
            if partition.group in UNMANAGED:
                continue
            if actions >= limit:
                return True
            actions += 1
            founders = host.founders_of(partition.group)
            await self._start(meta, partition, joining=founders is not None
                              and host.node_id not in founders)
        return False

    async def _start(self, meta: ClusterMetadata, partition: Partition, *,
                     joining: bool) -> None:
        """Run `partition`'s group here: founding (its creation's replicas as voters) or
        joining (a bootstrap configuration without this node: it waits to be added)."""
        host = self.host
        founders = host.founders_of(partition.group) or partition.replicas
        for node in {*founders, *partition.replicas}:
            info = meta.nodes.get(node)
            if info is not None:
                host.know_node(node, info.address)
        voters = list(founders)
        if joining:
            voters = [n for n in founders if n != host.node_id] or \
                [n for n in partition.replicas if n != host.node_id]
        opened = await self._io(host.store.open_log, partition.group)
        await host.add_group(partition.group, voters, opened, owns_log=True)
        log.info("partition_started node=%d topic=%s partition=%d group=%d replicas=%s "
                 "voters=%s joining=%s", host.node_id, partition.topic, partition.index,
                 partition.group, list(partition.replicas), voters, joining)

    async def _io(self, fn: Any, *args: Any) -> Any:
        if self.host.store.io_mode is IoMode.INLINE:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args)


def _shard(host: Any) -> int | None:
    """The shard whose partitions this process runs (None: a host without shards)."""
    return getattr(host, "shard", None)


def data_groups(ids: Iterable[int]) -> list[int]:
    """The managed partition groups among `ids`."""
    return sorted(g for g in ids if g not in UNMANAGED)
