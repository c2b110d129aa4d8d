"""Replica moves (issue 26 item 2), in process: `topic_move` changes a partition's desired
replicas in the controller; the partition's leader carries it out one single-server change at
a time (the new replica added as a learner, promoted once caught up, the leaving one removed),
the moved-in replica joins as a non-member, and the moved-away one keeps running until the
group's committed configuration no longer names it, then stops and drops its data. A producer
writes all along and nothing acknowledged is lost. Waiting is on conditions under
trio.fail_after deadlines."""

from __future__ import annotations

import trio

from inproc_cluster import (DEADLINE_S, fetched_values, running_cluster, trio_test,
                            values_payload)
from raft.core.membership import ClusterConfig
from raft.core.types import Role
from raft.node.replica_moves import MoveStep, plan_step
from storage.batch import BatchKind
from test_topics_inproc import (admin, create, group_of, metadata_everywhere, partition_leader,
                                request)


def test_plan_step_adds_a_learner_first_and_removes_last() -> None:
    assert plan_step((1, 2, 3), (), (1, 2, 4), 1, {2, 3}).kind is MoveStep.ADD_LEARNER
    assert plan_step((1, 2, 3), (), (1, 2, 4), 1, {2, 3}).node == 4
    assert plan_step((1, 2, 3), (4,), (1, 2, 4), 1, {2, 3}).kind is MoveStep.CATCHING_UP
    # Every desired node votes: the leaving voter is handed leadership (it removes itself) ...
    step = plan_step((1, 2, 3, 4), (), (1, 2, 4), 1, {2, 3, 4})
    assert (step.kind, step.node) == (MoveStep.HAND_OVER, 3)
    # ... or, unreachable, removed by the leader; a leader that is leaving removes itself.
    assert plan_step((1, 2, 3, 4), (), (1, 2, 4), 1, {2, 4}).kind is MoveStep.REMOVE
    assert plan_step((1, 2, 3, 4), (), (1, 2, 4), 3, {1, 2, 4}).kind is MoveStep.REMOVE_SELF
    assert plan_step((1, 2, 3), (5,), (1, 2, 3), 1, ()).kind is MoveStep.REMOVE
    assert plan_step((1, 2, 4), (), (4, 1, 2), 1, ()).kind is MoveStep.DONE  # a reorder


def config_history(group) -> list[ClusterConfig]:
    """Every configuration entry in the group's log, in order."""
    out, offset, log = [], group.log.start_offset, group.log
    while offset <= log.dirty_offset:
        batches = log.read(offset, 1 << 20, 64)
        for b in batches:
            if b.kind == BatchKind.CONFIG:
                out.append(ClusterConfig.from_batch(b))
        offset = batches[-1].last_offset + 1
    return out


@trio_test
async def test_a_partition_moves_to_a_new_node_while_a_producer_writes() -> None:
    async with running_cluster(4) as cluster:
        await create(cluster, "m", 1, 3)
        node1 = cluster.node(1)
        group = group_of(node1, "m", 0)
        before = node1.topics.metadata.groups[group].replicas
        assert sorted(before) == [1, 2, 3]  # placement: the three lowest ids
        await partition_leader(cluster, group)
        acked: list[tuple[int, bytes]] = []
        moved = trio.Event()

        async def producer() -> None:
            n = 0
            while not moved.is_set() or n < 40:
                value = b"v%d" % n
                leader = await partition_leader(cluster, group)
                reply = await request(leader, "produce", acks="quorum", timeout_ms=2000,
                                      payload=values_payload([value]), count=1, topic="m",
                                      partition=0)
                if reply["ok"]:
                    acked.append((reply["base_offset"], value))
                    n += 1
                else:
                    assert reply["error"]["code"] in ("NOT_LEADER", "LEADERSHIP_LOST",
                                                      "TIMEOUT", "SHUTTING_DOWN",
                                                      "BAD_REQUEST"), reply
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            with trio.fail_after(DEADLINE_S):
                while len(acked) < 10:
                    await trio.sleep(0.01)
            reply = await admin(cluster, "topic_move", name="m", partition=0,
                                replicas=[1, 2, 4])
            assert reply["ok"], reply
            assert reply["previous"] == list(before)
            assert reply["topic"]["partitions"][0]["replicas"] == [1, 2, 4]
            node3, node4 = cluster.node(3), cluster.node(4)
            with trio.fail_after(DEADLINE_S):
                # Until the group's configuration is the desired set and node 3 dropped it.
                while True:
                    g4 = node4.registry.get(group)
                    done = (g4 is not None and g4.core.config.voters == (1, 2, 4)
                            and not g4.core.config.learners and group not in node3.registry
                            and group not in node3.group.log.store.group_ids())
                    if done:
                        break
                    if group not in node3.registry:
                        # Never stopped while the group's configuration names it: once it
                        # stopped, some majority of the others appended its removal.
                        others = [cluster.node(n).registry.get(group) for n in (1, 2, 4)]
                        assert not all(g is not None and 3 in g.core.config.members
                                       for g in others), "node 3 stopped while a member"
                    await trio.sleep(0.02)
            moved.set()
        assert group in node3.topics.reconciler.dropped
        # Node 4 was added as a learner first, then promoted (never a voter straight away).
        first = next(c for c in config_history(node4.registry.get(group)) if 4 in c.members)
        assert 4 in first.learners and 4 not in first.voters
        # Node 4 holds every acknowledged record, where it was acknowledged.
        last = max(offset for offset, _ in acked)
        g4 = node4.registry.get(group)
        with trio.fail_after(DEADLINE_S):
            while g4.core.high_watermark < last:
                await trio.sleep(0.02)
        reply = await request(node4, "fetch", offset=0, max_bytes=4 << 20, topic="m",
                              partition=0)
        assert reply["ok"], reply
        by_offset = dict(fetched_values(reply))
        for offset, value in acked:
            assert by_offset.get(offset) == value, (offset, value)
        leader = await partition_leader(cluster, group)
        assert leader.node_id in (1, 2, 4)
        assert leader.registry.get(group).core.role == Role.LEADER


@trio_test
async def test_a_move_to_an_unknown_node_is_refused() -> None:
    async with running_cluster(3) as cluster:
        await create(cluster, "r", 1, 3)
        for replicas in ([1, 2, 9], [1, 2, 2], [1, 2]):
            reply = await admin(cluster, "topic_move", name="r", partition=0,
                                replicas=replicas)
            assert not reply["ok"] and reply["error"]["code"] == "BAD_REQUEST", reply
        reply = await admin(cluster, "topic_move", name="nope", partition=0, replicas=[1])
        assert reply["error"]["code"] == "UNKNOWN_TOPIC"
        await metadata_everywhere(cluster, lambda m: sorted(m.topics["r"].partitions[0]
                                                            .replicas) == [1, 2, 3])


@trio_test
async def test_the_cli_moves_a_partition_and_waits_until_its_configuration_follows() -> None:
    from cli_helpers import raftlog
    async with running_cluster(4) as cluster:
        topic = await create(cluster, "c", 1, 3)
        before = topic["partitions"][0]["replicas"]
        assert sorted(before) == [1, 2, 3]
        servers = ",".join(n.address for n in cluster.nodes)
        res = await trio.to_thread.run_sync(lambda: raftlog(
            "topic", "move", "c", "--partition", "0", "--replicas", "4,1,2",
            "--servers", servers, "--timeout", "60"))
        assert res.returncode == 0, res.stderr
        assert f"replicas {before} -> [4, 1, 2]" in res.stdout
        assert "  leader " in res.stdout  # progress, as the leader carries it out
        assert "moved: the partition's voters are [1, 2, 4]" in res.stdout
        group = group_of(cluster.node(1), "c", 0)
        # Done means what it says: the group's configuration is the new set.
        leader = await partition_leader(cluster, group)
        assert leader.registry.get(group).core.config.voters == (1, 2, 4)
        bad = await trio.to_thread.run_sync(lambda: raftlog(
            "topic", "move", "c", "--partition", "0", "--replicas", "1,2,9",
            "--servers", servers, "--no-wait"))
        assert bad.returncode != 0 and "node 9 is not registered" in bad.stderr


async def all_leaderships_to_node_1(cluster, partitions: int) -> dict[int, int]:
    """A topic "b" whose every partition node 1 leads (its preferred leaders spread over the
    three nodes), the balancers' timers off: {group: preferred node}."""
    for node in cluster.nodes:  # rounds driven by the test, not the timer
        node.topics.balancer.settings.enabled = False
        node.topics.balancer.settings.stable_ms = 0
        node.topics.balancer.settings.settle_ms = 0
    await create(cluster, "b", partitions, 3)
    meta = cluster.node(1).topics.metadata
    groups = {p.group: p.replicas[0] for p in meta.topics["b"].partitions}
    assert len(set(groups.values())) == 3  # placement spreads the preferred leaders
    with trio.fail_after(DEADLINE_S):
        while True:
            leaders = {g: await partition_leader(cluster, g) for g in groups}
            if all(n.node_id == 1 for n in leaders.values()):
                break
            for g, n in leaders.items():
                core = n.registry.get(g).core
                if n.node_id != 1 and core.leader.transfer_target is None:
                    core.transfer_leadership(1)
                    n.registry.get(g).kick()
            await trio.sleep(0.05)
    return groups


@trio_test
async def test_leadership_goes_back_to_preferred_replicas_a_few_at_a_time() -> None:
    async with running_cluster(3) as cluster:
        groups = await all_leaderships_to_node_1(cluster, 6)
        misplaced = sum(1 for preferred in groups.values() if preferred != 1)
        assert misplaced == 4
        limit = 2
        for node in cluster.nodes:
            node.topics.balancer.settings.max_transfers = limit
        rounds: list[int] = []
        with trio.fail_after(DEADLINE_S):
            while True:
                leaders = {g: (await partition_leader(cluster, g)).node_id for g in groups}
                if leaders == groups:
                    break
                asked = sum(n.topics.balancer.once(trio.current_time()) for n in cluster.live)
                rounds.append(asked)
                assert asked <= limit  # one node leads them all: at most `limit` a round
                # Until the round's transfers are over (no transfer pending anywhere).
                while any(n.registry.get(g).core.leader is not None
                          and n.registry.get(g).core.leader.transfer_target is not None
                          for n in cluster.live for g in groups):
                    await trio.sleep(0.02)
        assert rounds[0] == limit  # more were wanted than one round may move
        assert sum(rounds) >= misplaced and len([r for r in rounds if r]) >= 2


@trio_test
async def test_the_balancer_bounds_transfers_under_way_and_waits_for_a_settled_node() -> None:
    """Transfers still under way count against `max_in_flight` (rounds do not pile them up),
    and a node the failure detector has not reported up for `settle_ms` gets none."""
    async with running_cluster(3) as cluster:
        groups = await all_leaderships_to_node_1(cluster, 6)
        balancer = cluster.node(1).topics.balancer
        with trio.fail_after(DEADLINE_S):  # a round does nothing before the node caught up
            while not cluster.node(1).topics.controller.caught_up():
                await trio.sleep(0.02)
        balancer.settings.max_transfers = 4
        balancer.settings.settle_ms = 10**9  # nobody has been up that long
        assert balancer.once(trio.current_time()) == 0
        balancer.settings.settle_ms = 0
        balancer.settings.max_in_flight = 1
        # Two rounds with no await between them: the first transfer is still under way.
        assert balancer.once(trio.current_time()) == 1
        assert balancer.once(trio.current_time()) == 0
        balancer.settings.max_in_flight = 4
        with trio.fail_after(DEADLINE_S):
            while True:
                leaders = {g: (await partition_leader(cluster, g)).node_id for g in groups}
                if leaders == groups:
                    break
                under_way = sum(1 for g in groups
                                if (c := cluster.node(1).registry.get(g).core).leader is not None
                                and c.leader.transfer_target is not None)
                assert under_way <= 4
                balancer.once(trio.current_time())
                await trio.sleep(0.05)


@trio_test
async def test_after_a_move_restarted_nodes_keep_the_new_configuration() -> None:
    async with running_cluster(4) as cluster:
        topic = await create(cluster, "s", 1, 3)
        group = topic["partitions"][0]["group"]
        offset = None
        with trio.fail_after(DEADLINE_S):
            while offset is None:
                leader = await partition_leader(cluster, group)
                reply = await request(leader, "produce", acks="quorum", timeout_ms=2000,
                                      payload=values_payload([b"before"]), count=1, topic="s",
                                      partition=0)
                offset = reply["base_offset"] if reply["ok"] else None
        reply = await admin(cluster, "topic_move", name="s", partition=0, replicas=[4, 1, 2])
        assert reply["ok"], reply
        with trio.fail_after(DEADLINE_S):
            while not (group in cluster.node(4).registry
                       and cluster.node(4).registry.get(group).core.config.voters == (1, 2, 4)
                       and group not in cluster.node(3).group.log.store.group_ids()):
                await trio.sleep(0.02)
        # The moved-in replica restarts from its data as a voter; the moved-away one does not
        # bring the group back (its data is gone, and it is not assigned).
        for n in (4, 3):
            await cluster.stop(n, crash=True)
            await cluster.restart(n)
        node4 = cluster.node(4)
        await metadata_everywhere(cluster, lambda m: m.applied >= 0 and "s" in m.topics)
        with trio.fail_after(DEADLINE_S):
            while group not in node4.registry or \
                    node4.registry.get(group).core.high_watermark < offset:
                await trio.sleep(0.02)
        assert node4.registry.get(group).core.config.voters == (1, 2, 4)
        assert group not in cluster.node(3).registry
        reply = await request(node4, "fetch", offset=offset, max_bytes=1 << 20, topic="s",
                              partition=0)
        assert reply["ok"] and dict(fetched_values(reply))[offset] == b"before"
