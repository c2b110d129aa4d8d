"""What one node should run, from the metadata: the groups to start, stop and delete.

A node follows the controller: after applying the controller log up to some offset it compares
the data groups it runs (and holds on disk) with the metadata at that offset, and acts on the
difference (the runtime's Node.add_group / remove_group and the storage's drop; wiring is the
runtime's work). Reconciling against the whole state, not only against the effects of the
entries just applied, makes it idempotent and lets a node that restarts, or that installs a
controller snapshot, converge the same way.

Safety: only a group the metadata says was deleted (`is_deleted`: allocated, and no longer
live) has its data deleted. A group id this node's metadata does not know yet (allocated by
entries it has not applied) is left alone: its metadata is behind, not the group wrong. A group
whose replica set no longer names this node is stopped but its data kept, since the membership
change that removes it may not have committed yet; the runtime deletes it once the group's own
configuration no longer holds this node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from raft.controller.state import ClusterMetadata, Partition


@dataclass(slots=True, frozen=True)
class ReconcilePlan:
    start: tuple[Partition, ...] = ()  # assigned here, not running: start (create if new)
    stop: tuple[int, ...] = ()  # running, not assigned here any more: stop, keep the data
    delete: tuple[int, ...] = ()  # deleted topics' groups held here: stop and drop the data
    unknown: tuple[int, ...] = ()  # ids this metadata has not allocated yet: leave alone

    @property
    def empty(self) -> bool:
        return not (self.start or self.stop or self.delete)


def reconcile(meta: ClusterMetadata, node_id: int, running: Iterable[int],
              on_disk: Iterable[int] = (), shard: int | None = None) -> ReconcilePlan:
    """The difference between what `node_id` runs / stores and what `meta` assigns it (on
    `shard` of it, when the node runs shards: docs/SHARDS.md). `running` and `on_disk` hold
    data group ids (the controller, group 0, is not one)."""
    running_set, disk = set(running), set(on_disk)
    assigned = meta.groups_of(node_id, shard)
    start = tuple(assigned[g] for g in sorted(assigned) if g not in running_set)
    held = running_set | disk
    delete = tuple(sorted(g for g in held if meta.is_deleted(g)))
    stop = tuple(sorted(g for g in running_set
                        if g not in assigned and not meta.is_deleted(g) and g in meta.groups))
    unknown = tuple(sorted(g for g in held if g >= meta.next_group_id))
    return ReconcilePlan(start, stop, delete, unknown)
