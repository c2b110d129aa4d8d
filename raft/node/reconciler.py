"""The node's reconciler: the partition groups it runs follow the controller metadata it applied.

After every applied controller step (and once at start, which is how a restarting node brings
back the partitions its store holds) it compares the applied metadata with the groups the node
runs and stores (raft.controller.reconcile.reconcile) and acts:
- start: a partition assigned here that does not run: its log from the node's store
  (`store.open_log(group)`: the data a restart finds, or a new empty log) and `add_group` with
  the partition's replicas as the founding voters;
- stop: running but no longer assigned here: `remove_group`, the data kept (the group's own
  configuration change that drops this node may not have committed yet);
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
from raft.controller.state import ClusterMetadata
from storage.api import LEGACY_GROUP, IoMode, LogStorage, LogStore

log = logging.getLogger("raftlog.node")

MAX_ACTIONS_PER_PASS = 16
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

    async def add_group(self, group_id: int, voters: list[int], log_storage: LogStorage, *,
                        owns_log: bool = False) -> Any: ...

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

    def kick(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while await self.reconcile_once():
                await trio.lowlevel.checkpoint()  # more to do: the next pass, after others ran

    def plan(self) -> ReconcilePlan:
        host = self.host
        running = [g for g in host.running_groups() if g not in UNMANAGED]
        on_disk = [g for g in host.store.group_ids() if g not in UNMANAGED]
        return reconcile(host.metadata, host.node_id, running, on_disk)

    async def reconcile_once(self, limit: int = MAX_ACTIONS_PER_PASS) -> bool:
        """One bounded pass; True when work was left for the next one."""
        host = self.host
        meta = host.metadata
        if meta.applied < 0:
            return False
        plan = self.plan()
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
        for group_id in plan.stop:
            if actions >= limit:
                return True
            actions += 1
            await host.remove_group(group_id)
            log.info("partition_stopped node=%d group=%d (no longer assigned here; data kept)",
                     host.node_id, group_id)
        for partition in plan.start:
            if partition.group in UNMANAGED:
                continue
            if actions >= limit:
                return True
            actions += 1
            for node in partition.replicas:
                info = meta.nodes.get(node)
                if info is not None:
                    host.know_node(node, info.address)
            opened = await self._io(host.store.open_log, partition.group)
            await host.add_group(partition.group, list(partition.replicas), opened,
                                 owns_log=True)
            log.info("partition_started node=%d topic=%s partition=%d group=%d replicas=%s",
                     host.node_id, partition.topic, partition.index, partition.group,
                     list(partition.replicas))
        return False

    async def _io(self, fn: Any, *args: Any) -> Any:
        if self.host.store.io_mode is IoMode.INLINE:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args)


def data_groups(ids: Iterable[int]) -> list[int]:
    """The managed partition groups among `ids`."""
    return sorted(g for g in ids if g not in UNMANAGED)
