"""The controller's log is cut by retention (`controller_retention_bytes`), the metadata folded
into the state at the new log start (group 0's own snapshot section), and nothing is lost: every
node keeps the same metadata, a restarted node restores it from its own cut log, the founders of
every partition survive the cut (they decide who founds a group and who joins it), and data
partitions' snapshots do not carry the controller's section. Waiting is on conditions under
trio.fail_after deadlines."""

from __future__ import annotations

import msgpack
import pytest
import trio

from inproc_cluster import DEADLINE_S, Cluster, running_cluster
from raft.controller.section import SECTION_NAME
from raft.core.retention import Hold
from raft.core.snapshot import section_raw
from test_topics_inproc import all_partitions_led, create, fetch_values, group_of, produce

TOPICS = 12


def metadata_bytes(node) -> bytes:
    return msgpack.packb(node.topics.metadata.to_snapshot(), use_bin_type=True)


async def controller_cut_everywhere(cluster: Cluster) -> None:
    with trio.fail_after(DEADLINE_S):
        while not all(n.controller_group.log.start_offset > 0 for n in cluster.live):
            await trio.sleep(0.02)


async def same_metadata_everywhere(cluster: Cluster) -> None:
    with trio.fail_after(DEADLINE_S):
        while len({metadata_bytes(n) for n in cluster.live}) != 1:
            await trio.sleep(0.02)


@pytest.mark.parametrize("storage", ["memory", "lmdb"])
def test_a_cut_controller_log_keeps_the_metadata_and_a_restart_restores_it(storage,
                                                                           tmp_path) -> None:
    trio.run(_cut_and_restart, storage, tmp_path)


async def _cut_and_restart(storage: str, tmp_path) -> None:
    async with running_cluster(3, storage=storage, tmp_path=tmp_path,
                               controller_retention_bytes=1024) as cluster:
        for i in range(TOPICS):
            await create(cluster, f"t{i}", 1, 3)
        await controller_cut_everywhere(cluster)
        await same_metadata_everywhere(cluster)
        node = cluster.node(3)
        log = node.controller_group.log
        raw = section_raw(log.snapshot, SECTION_NAME)
        assert raw is not None, "the cut log keeps the metadata with its start"
        assert raw["applied"] == log.start_offset - 1
        before = metadata_bytes(node)
        meta = node.topics.metadata
        assert {frozenset(p.founders) for p in meta.groups.values()} == {frozenset((1, 2, 3))}, \
            "every partition keeps the replicas it was created with"
        # Retention never cuts what this node has not applied (its proposers and listeners
        # wait for each entry's verdict and effects).
        position = node.topics.controller.follower.position
        assert Hold("metadata", position, False) in \
            node.controller_group.retention.holders.gather()
        # A data partition's snapshot carries no controller section (it is group 0's only).
        default = node.group.log
        assert section_raw(default.snapshot, SECTION_NAME) is None

        await all_partitions_led(cluster, "t0")
        offset = await produce(cluster, "t0", 0, b"kept")
        await cluster.stop(3)
        node = await cluster.restart(3)
        assert node.controller_group.log.start_offset > 0, "the restart reads the cut log"
        await same_metadata_everywhere(cluster)
        with trio.fail_after(DEADLINE_S):
            while not all(p.group in node.registry.ids() for p in meta.groups.values()):
                await trio.sleep(0.02)
        assert node.topics.metadata.applied >= msgpack.unpackb(before)["applied"]
        assert await fetch_values(node, "t0", 0, offset) == [b"kept"]
        assert group_of(node, "t0", 0) in node.topics.store.group_ids()
