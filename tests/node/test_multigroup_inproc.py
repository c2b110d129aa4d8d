"""Many Raft groups per node (issue 26), in process: three nodes, each running the controller (group 0), the default topic and
groups added by hand over one
peer link per node pair (raft.node.registry). Each group elects its own leader and replicates its
own log; a message for a group a node does not run is dropped and counted without harming the
others; removing a group stops it on that node while the others keep committing; client requests
are routed by their group field; and frames per node pair do not grow with the number of groups.
Waiting is on conditions (polled) under trio.fail_after deadlines, never on sleeps alone."""

from __future__ import annotations


import trio

from inproc_cluster import (DEADLINE_S, Cluster, RawClient, fetched_values, running_cluster,
                            trio_test, values_payload)
from raft.core import messages as m
from raft.core.types import Role
from raft.node.outbox import PeerStream
from raft.node.server import Node
from storage.api import LEGACY_GROUP
from storage.memory import MemoryLog

VOTERS = [1, 2, 3]
# A node runs the controller (group 0) and the default topic's partition (DEFAULT) from boot;
# the groups these tests add by hand take ids far above what the controller has allocated, so
# its reconciler leaves them alone (raft.controller.reconcile: ids it has not allocated).
DEFAULT = LEGACY_GROUP
EXTRA = [101, 102, 103, 104, 105, 106, 107]


async def add_groups(cluster: Cluster, groups: range | list[int]) -> None:
    for g in groups:
        for node in cluster.nodes:
            await node.add_group(g, VOTERS, MemoryLog())


def running(cluster: Cluster, g: int) -> list[Node]:
    return [n for n in cluster.live if n.registry.get(g) is not None]


async def group_leader(cluster: Cluster, g: int) -> Node:
    """The one node leading group `g` that every node running `g` knows as its leader."""
    with trio.fail_after(DEADLINE_S):
        while True:
            nodes = running(cluster, g)
            leaders = [n for n in nodes if n.registry.get(g).core.role == Role.LEADER]
            if len(leaders) == 1 and all(n.registry.get(g).core.leader_id == leaders[0].node_id
                                         for n in nodes):
                return leaders[0]
            await trio.sleep(0.02)


async def produce(cluster: Cluster, g: int, value: bytes) -> int:
    """Write `value` to group `g` with quorum acks (following leader changes); its offset."""
    with trio.fail_after(DEADLINE_S):
        while True:
            leader = await group_leader(cluster, g)
            client = await RawClient.connect(leader.address)
            try:
                reply = await client.request("produce", acks="quorum", timeout_ms=2000,
                                             payload=values_payload([value]), count=1, group=g)
            finally:
                await client.aclose()
            if reply["ok"]:
                return reply["base_offset"]
            assert reply["error"]["code"] in ("NOT_LEADER", "LEADERSHIP_LOST", "TIMEOUT"), reply
            await trio.sleep(0.02)  # a retry's backoff, not synchronisation


async def group_values(node: Node, g: int, upto: int) -> list[bytes]:
    """Group `g`'s records on `node`, once its high watermark covers `upto`."""
    client = await RawClient.connect(node.address)
    try:
        with trio.fail_after(DEADLINE_S):
            while node.registry.get(g).core.high_watermark < upto:
                await trio.sleep(0.02)
        reply = await client.request("fetch", offset=0, max_bytes=1 << 20, max_wait_ms=0,
                                     group=g)
        assert reply["ok"], reply
        return [v for _, v in fetched_values(reply) if v.startswith(b"g")]
    finally:
        await client.aclose()


@trio_test
async def test_each_group_elects_its_own_leader_and_replicates_its_own_log() -> None:
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        await add_groups(cluster, EXTRA[:3])
        groups = [DEFAULT, *EXTRA[:3]]
        for node in cluster.nodes:
            assert node.registry.ids() == [0, *groups]
            assert node.group is node.registry.get(DEFAULT)  # node.group: the default topic's
        written: dict[int, list[tuple[int, bytes]]] = {g: [] for g in groups}
        for i in range(3):
            for g in groups:
                value = f"g{g}-{i}".encode()
                written[g].append((await produce(cluster, g, value), value))
        for g in groups:
            last = written[g][-1][0]
            for node in cluster.nodes:  # every replica holds exactly its group's records
                assert await group_values(node, g, last) == [v for _, v in written[g]]


@trio_test
async def test_a_message_for_an_unknown_group_is_dropped_and_counted_and_harms_no_other() -> None:
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        await add_groups(cluster, [101])
        leader1 = await group_leader(cluster, 101)
        target = next(n for n in cluster.nodes if n is not leader1)
        # A heartbeat of a high term: delivered to any group, it would depose its leader.
        hb = m.Heartbeat(leader1.node_id, target.node_id, 10_000, 0, 1)
        stream = PeerStream(leader1.links[target.node_id], 42)
        assert stream.send(hb)
        with trio.fail_after(DEADLINE_S):
            while target.registry.unknown_group_messages < 1:
                await trio.sleep(0.02)
        assert target.registry.unknown_group_messages == 1
        sample = target.metrics.registry.get_sample_value(
            "raftlog_peer_messages_unknown_group_total", {"peer": str(leader1.node_id)})
        assert sample == 1
        for g in (DEFAULT, 101):  # no term of either group moved to the stray message's
            assert all(n.registry.get(g).core.term < 10_000 for n in cluster.nodes)
            await produce(cluster, g, f"g{g}-after".encode())


@trio_test
async def test_removing_a_group_stops_it_on_that_node_while_the_others_keep_committing() -> None:
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        await add_groups(cluster, EXTRA[:3])
        groups = [DEFAULT, *EXTRA[:3]]
        for g in groups:
            await produce(cluster, g, f"g{g}-before".encode())
        # A follower of group 102 drops it (a leader that did would leave quiesced followers
        # waiting for a leader whose node is alive: the runtime transfers leadership first).
        node = next(n for n in cluster.nodes if n.registry.get(102).core.role != Role.LEADER)
        removed = node.registry.get(102)
        await node.remove_group(102)
        assert node.registry.ids() == [0, DEFAULT, 101, 103] and removed.closing
        term = removed.core.term
        # The other groups commit on all three nodes, group 102 on its other two; its leader
        # keeps sending to the node that dropped it (the new write wakes it if it was quiet),
        # which drops and counts those messages.
        for g in groups:
            offset = await produce(cluster, g, f"g{g}-after".encode())
            for other in running(cluster, g):
                assert (await group_values(other, g, offset))[-1] == f"g{g}-after".encode()
        with trio.fail_after(DEADLINE_S):
            while node.registry.unknown_group_messages < 1:
                await trio.sleep(0.02)
        assert removed.core.term == term  # nothing ticks or steps the removed group
        client = await RawClient.connect(node.address)
        reply = await client.request("status", group=102)
        await client.aclose()
        assert reply["ok"] is False and reply["error"]["groups"] == [0, DEFAULT, 101, 103]


@trio_test
async def test_a_request_for_a_group_the_node_does_not_run_names_the_groups_it_runs() -> None:
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        await add_groups(cluster, [105])
        client = await RawClient.connect(cluster.nodes[0].address)
        try:
            reply = await client.request("fetch", offset=0, group=7)
            assert reply["ok"] is False
            error = reply["error"]
            assert error["code"] == "BAD_REQUEST" and error["groups"] == [0, DEFAULT, 105]
            assert "group 7" in error["message"] and "[0, 1, 105]" in error["message"]
            ok = await client.request("status", group=105)  # the connection goes on
            assert ok["ok"] and ok["status"]["node_id"] == cluster.nodes[0].node_id
        finally:
            await client.aclose()


@trio_test
async def test_add_group_refuses_a_duplicate_and_unknown_voters_and_group_zero_stays() -> None:
    async with running_cluster(3) as cluster:
        node = cluster.nodes[0]
        await node.add_group(101, VOTERS, MemoryLog())
        for g, voters, fragment in ((101, VOTERS, "already runs"), (DEFAULT, VOTERS,
                                                                     "already runs"),
                                    (102, [1, 9], "unknown: [9]"), (102, [], "non-empty")):
            try:
                await node.add_group(g, voters, MemoryLog())
            except ValueError as e:
                assert fragment in str(e)
            else:
                raise AssertionError(f"add_group({g}, {voters}) was accepted")
        for g in (0, DEFAULT):  # the controller and the default topic run with the node
            try:
                await node.remove_group(g)
            except ValueError as e:
                assert f"group {g}" in str(e)
            else:
                raise AssertionError(f"group {g} was removed")


# -- frames per node pair do not grow with the number of groups ----------------------------------

async def settled(cluster: Cluster, groups: range) -> None:
    """Every group led by node 1 (leadership moved there) and idle: everything committed."""
    with trio.fail_after(DEADLINE_S * 2):
        while True:
            done = True
            for g in groups:
                leader = await group_leader(cluster, g)
                group = leader.registry.get(g)
                if leader.node_id != 1:
                    done = False
                    try:
                        group.core.transfer_leadership(1)
                    except ValueError:
                        pass  # a transfer already under way
                    group.kick()
                    continue
                end = group.log.dirty_offset
                if any(n.registry.get(g).core.commit_index < end for n in cluster.nodes):
                    done = False
            if done:
                return
            await trio.sleep(0.05)


async def frames_per_tick(cluster: Cluster, ticks: int = 50) -> dict[tuple[int, int], float]:
    """Raft frames written per tick on each node pair (both directions), over `ticks` ticks."""
    def counts() -> dict[tuple[int, int], int]:
        return {(n.node_id, p): link.sent_frames for n in cluster.nodes
                for p, link in n.links.items()}

    before, start = counts(), {n.node_id: n.registry.ticks for n in cluster.nodes}
    with trio.fail_after(DEADLINE_S):
        while any(n.registry.ticks < start[n.node_id] + ticks for n in cluster.nodes):
            await trio.sleep(0.02)
    after = counts()
    elapsed = {n.node_id: n.registry.ticks - start[n.node_id] for n in cluster.nodes}
    rates: dict[tuple[int, int], float] = {}
    for (src, dst), n in after.items():
        pair = (min(src, dst), max(src, dst))
        rates[pair] = rates.get(pair, 0.0) + (n - before[(src, dst)]) / elapsed[src]
    return rates


@trio_test
async def test_frames_per_node_pair_do_not_grow_with_the_number_of_groups() -> None:
    """One node ticks all its groups at once, so the heartbeats of the 8 groups it leads leave
    in one frame per peer per tick (and the followers' replies in one frame back), as the one
    group's did: frames per node pair stay within 2x of the one-group figure. Quiescence is
    off here (idle groups would go quiet and send nothing): this measures awake groups'
    heartbeats; test_quiesce_inproc.py measures quiet ones."""
    async with running_cluster(3, raft={"quiesce_ticks": 0}) as cluster:
        await cluster.wait_leader()
        await settled(cluster, [0, DEFAULT])
        one = await frames_per_tick(cluster)
        await add_groups(cluster, EXTRA[:6])
        await settled(cluster, [0, DEFAULT, *EXTRA[:6]])
        sent_before = sum(link.sent_messages for n in cluster.nodes for link in n.links.values())
        eight = await frames_per_tick(cluster)
        sent = sum(link.sent_messages for n in cluster.nodes for link in n.links.values())
        assert sent - sent_before > 8 * 50  # the 8 groups did send (heartbeats and replies)
        # (One group before was two since issue 26: the controller and the default topic.)
        for pair in ((1, 2), (1, 3)):
            assert one[pair] > 0.5, one  # a heartbeat and its reply most ticks
            assert eight[pair] <= 2 * one[pair], (one, eight)




@trio_test
async def test_a_group_on_lmdb_flushes_in_worker_threads_and_is_removed_cleanly(tmp_path) -> None:
    """With durable logs (flushes and metadata saves in worker threads), an added group commits,
    and removing it waits for its storage work, flushes and leaves its log intact."""
    from storage import open_log

    async with running_cluster(3, storage="lmdb", tmp_path=tmp_path) as cluster:
        await cluster.wait_leader()
        logs = {}
        for node in cluster.nodes:
            path = tmp_path / f"node-{node.node_id}-group-101"
            path.mkdir()
            logs[node.node_id] = open_log(path)
            await node.add_group(101, VOTERS, logs[node.node_id])
        try:
            offset = await produce(cluster, 101, b"g1-durable")
            for node in cluster.nodes:
                assert await group_values(node, 101, offset) == [b"g1-durable"]
            for node in cluster.nodes:
                await node.remove_group(101)
                assert logs[node.node_id].flushed_offset >= offset
            await produce(cluster, DEFAULT, b"g0-after")  # the default topic goes on
        finally:
            for log_storage in logs.values():
                log_storage.close()
