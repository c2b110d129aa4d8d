"""The node's reconciler and topic routing without a cluster (issue 26): a fake node host over
a MemoryStore; the reconciler starts the partitions placed on its node from the store, stops
those moved away (keeping their data), drops a deleted topic's data, never touches the
controller or the default topic, and does a bounded amount of work per pass. `resolve` sends a
request for (topic, partition) to exactly that partition's group (called through its module, so
the mutation tests' patch of it reaches here)."""

from __future__ import annotations

import trio

from raft.controller.bootstrap import bootstrap
from raft.controller.commands import CreateTopic, DeleteTopic, MoveReplicas, RegisterNode
from raft.controller.state import ClusterMetadata
from raft.node.reconciler import MAX_ACTIONS_PER_PASS, Reconciler
from raft.node import topics
from raft.node.topics import metadata_map
from raft.core.types import ErrorCode
from storage.api import LEGACY_GROUP
from storage.memory import MemoryStore

FOUNDERS = {1: "a:1", 2: "b:2", 3: "c:3"}


class FakeHost:
    """The part of a Node the reconciler drives."""

    def __init__(self, node_id: int, meta: ClusterMetadata) -> None:
        self.node_id = node_id
        self.metadata = meta
        self.store = MemoryStore()
        self.running: dict[int, tuple[list[int], object]] = {}
        self.known: dict[int, str] = {}
        self.named: set[int] = set()  # groups whose configuration still names this node
        self.founders: dict[int, tuple[int, ...]] = {
            g: p.replicas for g, p in meta.groups.items()}  # (as created: before any move)
        for g in (0, LEGACY_GROUP):  # the controller and the default topic run from boot
            self.running[g] = ([1, 2, 3], self.store.open_log(g))

    def running_groups(self) -> list[int]:
        return sorted(self.running)

    def know_node(self, node_id: int, address: str) -> None:
        self.known[node_id] = address

    def founders_of(self, group_id):
        return self.founders.get(group_id)

    def still_named(self, group_id):
        return group_id in self.named

    async def add_group(self, group_id, voters, log_storage, *, owns_log=False):
        assert owns_log and group_id not in self.running
        self.running[group_id] = (voters, log_storage)

    async def remove_group(self, group_id):
        _, log_storage = self.running.pop(group_id)
        log_storage.close()


def metadata_with(*commands) -> ClusterMetadata:
    meta = bootstrap(FOUNDERS)
    for command in commands:
        assert meta.apply(meta.applied + 1, command).ok
    return meta


def test_the_reconciler_starts_stops_and_drops_what_the_metadata_says() -> None:
    async def main() -> None:
        meta = metadata_with(CreateTopic("a", ((1, 2), (2, 3), (3, 1))),
                             CreateTopic("b", ((1, 3),)))
        host = FakeHost(1, meta)
        rec = Reconciler(host)
        assert not await rec.reconcile_once()
        groups = {p.topic + str(p.index): p.group for p in meta.groups.values()}
        assert host.running_groups() == sorted([0, LEGACY_GROUP, groups["a0"], groups["a2"],
                                                groups["b0"]])
        assert host.running[groups["a0"]][0] == [1, 2]  # founded with the partition's replicas
        assert host.known == {1: "a:1", 2: "b:2", 3: "c:3"}
        # Topic b deleted, a's partition 2 moved off this node: b's data is dropped; a2 keeps
        # running while its configuration still names this node, then stops and is dropped.
        assert meta.apply(meta.applied + 1, DeleteTopic("b")).ok
        assert meta.apply(meta.applied + 1, MoveReplicas("a", 2, (3, 2))).ok
        host.named.add(groups["a2"])
        assert not await rec.reconcile_once()
        assert host.running_groups() == sorted([0, LEGACY_GROUP, groups["a0"], groups["a2"]])
        assert groups["b0"] not in host.store.group_ids()  # deleted: data dropped
        assert groups["a2"] in host.store.group_ids()  # still a member: running, data kept
        assert rec.dropped == [groups["b0"]] and rec.leaving == {groups["a2"]}
        host.named.discard(groups["a2"])  # its removal committed
        assert not await rec.reconcile_once()
        assert host.running_groups() == sorted([0, LEGACY_GROUP, groups["a0"]])
        assert groups["a2"] not in host.store.group_ids()
        assert rec.dropped == [groups["b0"], groups["a2"]]
        # A restart: the store holds a0; a new host over the same store starts it again.
        again = FakeHost.__new__(FakeHost)
        again.__dict__.update(node_id=1, metadata=meta, store=host.store, known={},
                              running={}, named=set(), founders=host.founders)
        host.running[groups["a0"]][1].close()
        await Reconciler(again).reconcile_once()
        assert sorted(again.running) == [groups["a0"]]

    trio.run(main)


def test_a_replica_moved_in_joins_and_a_founding_one_founds() -> None:
    async def main() -> None:
        meta = metadata_with(CreateTopic("a", ((1, 2, 3),)), RegisterNode(4, "d:4"))
        group = meta.topics["a"].partitions[0].group
        assert meta.apply(meta.applied + 1, MoveReplicas("a", 0, (1, 2, 4))).ok
        host = FakeHost(4, meta)
        host.founders[group] = (1, 2, 3)
        await Reconciler(host).reconcile_once()
        # Not a founder: its bootstrap configuration leaves it out (it waits to be added).
        assert host.running[group][0] == [1, 2, 3]
        founder = FakeHost(1, meta)
        founder.founders[group] = (1, 2, 3)
        await Reconciler(founder).reconcile_once()
        assert founder.running[group][0] == [1, 2, 3]  # the creation's voters, not (1, 2, 4)

    trio.run(main)


def test_the_reconciler_never_touches_the_controller_or_the_default_topic() -> None:
    async def main() -> None:
        meta = metadata_with(MoveReplicas("default", 0, (2, 3, 1)))
        host = FakeHost(4, meta)  # not even a replica of the default topic in the metadata
        await Reconciler(host).reconcile_once()
        assert host.running_groups() == [0, LEGACY_GROUP]
        assert host.store.group_ids() == [0, LEGACY_GROUP]

    trio.run(main)


def test_a_pass_does_a_bounded_amount_of_work() -> None:
    async def main() -> None:
        count = 2 * MAX_ACTIONS_PER_PASS + 3
        meta = metadata_with(CreateTopic("many", tuple((1,) for _ in range(count))))
        host = FakeHost(1, meta)
        rec = Reconciler(host)
        assert await rec.reconcile_once()  # work left
        assert len(host.running) == 2 + MAX_ACTIONS_PER_PASS
        while await rec.reconcile_once():
            pass
        assert len(host.running) == 2 + count

    trio.run(main)


def test_resolve_sends_a_partition_to_its_own_group() -> None:
    meta = metadata_with(CreateTopic("a", ((1,), (2,), (3,), (1,))))
    groups = [p.group for p in meta.topics["a"].partitions]
    for index, group in enumerate(groups):
        assert topics.resolve(meta, "a", index, lambda g: True, FOUNDERS.get).group == group
    unknown = topics.resolve(meta, "x", 0, lambda g: True, FOUNDERS.get).refusal
    assert unknown.code == ErrorCode.UNKNOWN_TOPIC and unknown.details["topics"] == ["a",
                                                                                     "default"]
    missing = topics.resolve(meta, "a", 4, lambda g: True, FOUNDERS.get).refusal
    assert missing.code == ErrorCode.UNKNOWN_TOPIC and missing.details["partitions"] == 4
    elsewhere = topics.resolve(meta, "a", 1, lambda g: g != groups[1], FOUNDERS.get).refusal
    assert elsewhere.code == ErrorCode.NOT_LEADER
    assert (elsewhere.details["replicas"], elsewhere.details["replica_addresses"]) == (
        [2], ["b:2"])
    shown = metadata_map(meta, ["a", "nope"], lambda g: (None, None), (2, "b:2"))
    assert [t["name"] for t in shown["topics"]] == ["a"]
    assert [p["group"] for p in shown["topics"][0]["partitions"]] == groups
    assert (shown["controller"], shown["applied"]) == (2, meta.applied)
