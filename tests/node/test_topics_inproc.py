"""Topics in the node (issue 26), in process: the controller (group 0) bootstraps the cluster's
metadata and the default topic (group 1); topic_create starts one Raft group per partition on
the replicas placement chose; requests addressed by (topic, partition) reach exactly that
partition's group; unknown topics and partitions are refused naming what exists; admin requests
sent to a node that does not lead the controller are answered NOT_LEADER naming the leader;
topic_alter grows a topic; topic_delete stops the groups and drops their data on every node; a
restarted node brings its partitions back from its store; a controller entry this build does not
know stops the node loudly. Waiting is on conditions under trio.fail_after deadlines."""

from __future__ import annotations

from collections import Counter

import msgpack
import pytest
import trio

from inproc_cluster import (DEADLINE_S, Cluster, RawClient, fetched_values, running_cluster,
                            trio_test, values_payload)
from raft.core.types import Acks, Role
from raft.node.errors import NodeFailed
from raft.node.server import Node
from storage.api import LEGACY_GROUP
from storage.batch import Batch, BatchKind


async def metadata_everywhere(cluster: Cluster, check) -> None:
    """Until `check(metadata)` holds on every live node."""
    with trio.fail_after(DEADLINE_S):
        while not all(check(n.topics.metadata) for n in cluster.live):
            await trio.sleep(0.02)


async def controller_leader(cluster: Cluster) -> Node:
    with trio.fail_after(DEADLINE_S):
        while True:
            leaders = [n for n in cluster.live if n.controller_group.core.role == Role.LEADER]
            if len(leaders) == 1 and all(n.controller_group.core.leader_id == leaders[0].node_id
                                         for n in cluster.live):
                return leaders[0]
            await trio.sleep(0.02)


async def request(node: Node, t: str, **fields) -> dict:
    client = await RawClient.connect(node.address)
    try:
        return await client.request(t, **fields)
    finally:
        await client.aclose()


async def admin(cluster: Cluster, t: str, **fields) -> dict:
    """An admin request to the controller's leader (following a leader change)."""
    with trio.fail_after(DEADLINE_S):
        while True:
            reply = await request(await controller_leader(cluster), t, **fields)
            if reply["ok"] or reply["error"]["code"] not in ("NOT_LEADER", "TIMEOUT"):
                return reply
            await trio.sleep(0.02)


def group_of(node: Node, topic: str, partition: int) -> int:
    return node.topics.metadata.topics[topic].partitions[partition].group


async def partition_leader(cluster: Cluster, group: int) -> Node:
    with trio.fail_after(DEADLINE_S):
        while True:
            nodes = [n for n in cluster.live if group in n.registry]
            leaders = [n for n in nodes if n.registry.get(group).core.role == Role.LEADER]
            if len(leaders) == 1 and all(n.registry.get(group).core.leader_id
                                         == leaders[0].node_id for n in nodes):
                return leaders[0]
            await trio.sleep(0.02)


async def produce(cluster: Cluster, topic: str, partition: int, value: bytes) -> int:
    group = group_of(cluster.live[0], topic, partition)
    with trio.fail_after(DEADLINE_S):
        while True:
            leader = await partition_leader(cluster, group)
            reply = await request(leader, "produce", acks="quorum", timeout_ms=2000,
                                  payload=values_payload([value]), count=1, topic=topic,
                                  partition=partition)
            if reply["ok"]:
                return reply["base_offset"]
            assert reply["error"]["code"] in ("NOT_LEADER", "LEADERSHIP_LOST", "TIMEOUT"), reply
            await trio.sleep(0.02)


async def fetch_values(node: Node, topic: str, partition: int, upto: int) -> list[bytes]:
    group = node.registry.get(group_of(node, topic, partition))
    with trio.fail_after(DEADLINE_S):
        while group.core.high_watermark < upto:
            await trio.sleep(0.02)
    reply = await request(node, "fetch", offset=0, max_bytes=1 << 20, topic=topic,
                          partition=partition)
    assert reply["ok"], reply
    return [v for _, v in fetched_values(reply)]


async def all_partitions_led(cluster: Cluster, topic: str) -> None:
    meta = cluster.live[0].topics.metadata
    for p in meta.topics[topic].partitions:
        await partition_leader(cluster, p.group)


async def create(cluster: Cluster, name: str, partitions: int, replicas: int) -> dict:
    reply = await admin(cluster, "topic_create", name=name, partitions=partitions,
                        replicas=replicas)
    assert reply["ok"], reply
    await metadata_everywhere(cluster, lambda m: name in m.topics)
    return reply["topic"]


@trio_test
async def test_a_cluster_bootstraps_the_controller_and_the_default_topic() -> None:
    async with running_cluster(3) as cluster:
        await metadata_everywhere(cluster, lambda m: "default" in m.topics)
        for node in cluster.nodes:
            meta = node.topics.metadata
            assert sorted(meta.nodes) == [1, 2, 3]
            default = meta.topics["default"].partitions
            assert [(p.group, sorted(p.replicas)) for p in default] == [(LEGACY_GROUP,
                                                                          [1, 2, 3])]
            assert node.group is node.registry.get(LEGACY_GROUP)
            assert node.registry.ids() == [0, LEGACY_GROUP]
        reply = await request(cluster.nodes[1], "metadata")
        assert reply["ok"] and [t["name"] for t in reply["topics"]] == ["default"]
        leader = await controller_leader(cluster)
        assert reply["controller"] == leader.node_id
        assert reply["controller_address"] == leader.address
        assert [n["node_id"] for n in reply["nodes"]] == [1, 2, 3]
        # Today's requests (no topic) still reach the default topic.
        offset = await produce(cluster, "default", 0, b"plain")
        assert (await fetch_values(cluster.nodes[0], "default", 0, offset)) == [b"plain"]
        status = (await request(cluster.nodes[0], "status"))["status"]
        assert status["controller"]["leader"] == leader.node_id
        assert [(p["topic"], p["group"]) for p in status["partitions"]] == [("default", 1)]


@trio_test
async def test_a_second_bootstrap_by_a_later_leader_changes_nothing() -> None:
    """The state machine keeps a registered node and refuses a second default topic, so a
    later controller leader that proposes the bootstrap again is harmless."""
    async with running_cluster(3) as cluster:
        await metadata_everywhere(cluster, lambda m: "default" in m.topics)
        leader = await controller_leader(cluster)
        before = leader.topics.metadata.to_snapshot()
        ctl = leader.topics.controller
        ctl._bootstrapped_term = -1
        meta = leader.topics.metadata
        saved = dict(meta.nodes), dict(meta.topics)
        meta.nodes.clear()  # make it look unbootstrapped to the leader, for one proposal
        meta.topics.clear()
        proposed_from = leader.controller_group.log.dirty_offset
        ctl._maybe_bootstrap()
        meta.nodes.update(saved[0])
        meta.topics.update(saved[1])
        target = leader.controller_group.log.dirty_offset
        assert target >= proposed_from + 4  # three RegisterNode and the default topic again
        await metadata_everywhere(cluster, lambda m: m.applied >= target)
        for node in cluster.live:
            after = node.topics.metadata.to_snapshot()
            after["applied"] = before["applied"]
            assert after == before


@trio_test
async def test_topics_are_placed_served_by_partition_grown_and_deleted() -> None:
    async with running_cluster(4) as cluster:
        await metadata_everywhere(cluster, lambda m: len(m.nodes) == 4 or "default" in m.topics)
        topic = await create(cluster, "orders", 8, 3)
        assert [p["partition"] for p in topic["partitions"]] == list(range(8))
        groups = [p["group"] for p in topic["partitions"]]
        assert len(set(groups)) == 8 and LEGACY_GROUP not in groups and 0 not in groups
        # Placement: every node within one of the mean replica count (24 over 4 nodes).
        held = Counter(n for p in topic["partitions"] for n in p["replicas"])
        assert max(held.values()) - min(held.values()) <= 1 and sum(held.values()) == 24
        await all_partitions_led(cluster, "orders")
        for node in cluster.nodes:  # each node runs exactly the partitions placed on it
            mine = {p["group"] for p in topic["partitions"] if node.node_id in p["replicas"]}
            assert set(node.registry.ids()) - {0, LEGACY_GROUP} == mine
        # Produce and fetch by (topic, partition): each partition holds its own records only.
        written = {}
        for p in range(8):
            written[p] = await produce(cluster, "orders", p, f"orders-{p}".encode())
        for p in range(8):
            group = groups[p]
            reader = next(n for n in cluster.nodes if group in n.registry)
            assert await fetch_values(reader, "orders", p, written[p]) == [
                f"orders-{p}".encode()]
        # Unknown topics and partitions name what exists; a node holding no replica says
        # which nodes do.
        reply = await request(cluster.nodes[0], "fetch", offset=0, topic="nope")
        assert reply["error"]["code"] == "UNKNOWN_TOPIC"
        assert reply["error"]["topics"] == ["default", "orders"]
        assert "default, orders" in reply["error"]["message"]
        reply = await request(cluster.nodes[0], "produce", payload=values_payload([b"x"]),
                              count=1, topic="orders", partition=8)
        assert reply["error"]["code"] == "UNKNOWN_TOPIC" and reply["error"]["partitions"] == 8
        assert "0..7" in reply["error"]["message"]
        outsider = next((n, p) for n in cluster.nodes for p in topic["partitions"]
                        if n.node_id not in p["replicas"])
        reply = await request(outsider[0], "fetch", offset=0, topic="orders",
                              partition=outsider[1]["partition"])
        assert reply["error"]["code"] == "NOT_LEADER"
        assert reply["error"]["replicas"] == outsider[1]["replicas"]
        # Grow: 8 -> 10 partitions, the new ones start and serve.
        reply = await admin(cluster, "topic_alter", name="orders", partitions=10)
        assert reply["ok"] and len(reply["topic"]["partitions"]) == 10
        await metadata_everywhere(cluster, lambda m: len(m.topics["orders"].partitions) == 10)
        await all_partitions_led(cluster, "orders")
        offset = await produce(cluster, "orders", 9, b"grown")
        new_group = group_of(cluster.nodes[0], "orders", 9)
        reader = next(n for n in cluster.nodes if new_group in n.registry)
        assert await fetch_values(reader, "orders", 9, offset) == [b"grown"]
        # Delete: every node stops the groups and drops their data.
        all_groups = set(groups) | {group_of(cluster.nodes[0], "orders", p) for p in (8, 9)}
        reply = await admin(cluster, "topic_delete", name="orders")
        assert reply["ok"], reply
        with trio.fail_after(DEADLINE_S):
            while any(all_groups & (set(n.registry.ids()) | set(n.topics.store.group_ids()))
                      for n in cluster.nodes):
                await trio.sleep(0.02)
        for node in cluster.nodes:
            assert set(node.topics.store.group_ids()) == {0, LEGACY_GROUP}
        reply = await request(cluster.nodes[0], "fetch", offset=0, topic="orders")
        assert reply["error"]["code"] == "UNKNOWN_TOPIC"


@trio_test
async def test_admin_requests_to_another_node_name_the_controller_leader() -> None:
    async with running_cluster(3) as cluster:
        await metadata_everywhere(cluster, lambda m: "default" in m.topics)
        leader = await controller_leader(cluster)
        other = next(n for n in cluster.nodes if n is not leader)
        for t, fields in (("topic_create", {"name": "t", "partitions": 1, "replicas": 1}),
                          ("topic_alter", {"name": "t", "partitions": 2}),
                          ("topic_delete", {"name": "t"})):
            reply = await request(other, t, **fields)
            assert reply["error"]["code"] == "NOT_LEADER", reply
            assert reply["error"]["leader_id"] == leader.node_id
            assert reply["error"]["leader_addr"] == leader.address
        reply = await admin(cluster, "topic_create", name="t", partitions=1, replicas=1,
                            max_record_bytes=4096)
        assert reply["ok"] and reply["topic"]["settings"] == {"max_record_bytes": 4096}
        altered = await admin(cluster, "topic_alter", name="t", retention_bytes=1 << 20)
        assert altered["topic"]["settings"] == {"max_record_bytes": 4096,
                                                "retention_bytes": 1 << 20}
        grown = await admin(cluster, "topic_alter", name="t", partitions=2)
        assert grown["ok"] and len(grown["topic"]["partitions"]) == 2
        refused = await admin(cluster, "topic_alter", name="t", partitions=1)
        assert refused["error"]["code"] == "BAD_REQUEST" and "grow" in refused["error"][
            "message"]
        too_many = await admin(cluster, "topic_create", name="u", partitions=1, replicas=4)
        assert too_many["error"]["code"] == "BAD_REQUEST", too_many
        again = await admin(cluster, "topic_create", name="t", partitions=1, replicas=1)
        assert again["error"]["code"] == "TOPIC_EXISTS"
        bad = await admin(cluster, "topic_create", name="bad name", partitions=1, replicas=1)
        assert bad["error"]["code"] == "BAD_REQUEST" and "letters" in bad["error"]["message"]
        gone = await admin(cluster, "topic_delete", name="never")
        assert gone["error"]["code"] == "UNKNOWN_TOPIC" and "t" in gone["error"]["topics"]
        default = await admin(cluster, "topic_delete", name="default")
        assert default["error"]["code"] == "BAD_REQUEST"
        # Clients cannot write the controller's log.
        reply = await request(leader, "produce", payload=values_payload([b"x"]), count=1,
                              group=0)
        assert reply["error"]["code"] == "BAD_REQUEST" and "controller" in reply["error"][
            "message"]


@pytest.mark.parametrize("storage", ["memory", "lmdb"])
def test_a_restarted_node_brings_its_partitions_back_from_its_store(storage, tmp_path) -> None:
    trio.run(_restart_brings_partitions_back, storage, tmp_path)


async def _restart_brings_partitions_back(storage: str, tmp_path) -> None:
    async with running_cluster(3, storage=storage, tmp_path=tmp_path) as cluster:
        await metadata_everywhere(cluster, lambda m: "default" in m.topics)
        await create(cluster, "events", 3, 3)
        await all_partitions_led(cluster, "events")
        offsets = [await produce(cluster, "events", p, f"e{p}".encode()) for p in range(3)]
        victim = cluster.node(3)
        for p in range(3):
            await fetch_values(victim, "events", p, offsets[p])
        await cluster.stop(3)
        node = await cluster.restart(3)
        groups = {group_of(cluster.nodes[0], "events", p) for p in range(3)}
        with trio.fail_after(DEADLINE_S):
            while not groups <= set(node.registry.ids()):
                await trio.sleep(0.02)
        for p in range(3):
            assert await fetch_values(node, "events", p, offsets[p]) == [f"e{p}".encode()]
        assert groups <= set(node.topics.store.group_ids())


def test_a_controller_entry_this_build_does_not_know_stops_the_node_loudly() -> None:
    with pytest.raises(BaseExceptionGroup) as raised:
        trio.run(_unknown_controller_entry)
    assert raised.group_contains(NodeFailed, match="upgrade")


async def _unknown_controller_entry() -> None:
    async with running_cluster(3) as cluster:
        await metadata_everywhere(cluster, lambda m: "default" in m.topics)
        leader = await controller_leader(cluster)
        payload = msgpack.packb({"ctl": "controller", "v": 99, "op": "teleport"})
        batch = Batch.create(payload, 1, kind=BatchKind.CONTROL, timestamp_ms=0)
        leader.controller_group.core.propose(0, batch, Acks.LEADER)
        leader.controller_group.kick()
        with trio.fail_after(DEADLINE_S):
            while not all(n._stopped.is_set() for n in cluster.nodes):
                await trio.sleep(0.02)
        for node in cluster.nodes:
            failure = node.controller_group.failure
            assert failure is not None and "upgrade" in str(failure)


@trio_test
async def test_the_controller_follows_the_default_topics_membership() -> None:
    """add_node / remove_node change the default topic's group (a replica on every member, as
    the single log was); the controller's leader mirrors the change into the controller group,
    so cluster membership is the controller's."""
    new_id, new_address = 4, "127.0.0.1:1"  # nothing listens: it stays a learner
    async with running_cluster(3) as cluster:
        await metadata_everywhere(cluster, lambda m: "default" in m.topics)
        leader = await cluster.wait_leader()
        added = await request(leader, "add_node", node_id=new_id, address=new_address)
        assert added["ok"], added

        def controller_members() -> set[int]:
            return set(cluster.nodes[0].controller_group.core.config.members)

        with trio.fail_after(DEADLINE_S):
            while new_id not in controller_members():
                await trio.sleep(0.02)
        ctl = cluster.nodes[0].controller_group.core.config
        assert new_id in ctl.learners and ctl.addresses[new_id] == new_address
        removed = await request(leader, "remove_node", node_id=new_id)
        assert removed["ok"], removed
        with trio.fail_after(DEADLINE_S):
            while new_id in controller_members():
                await trio.sleep(0.02)
        assert controller_members() == {1, 2, 3}
