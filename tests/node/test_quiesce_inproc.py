"""Quiescence in the runtime and the node-pair failure detector (issue 26 item 3), in process:
three nodes on MemoryLogs over real loopback sockets, under trio's MockClock (rate 0, autojump),
so timeouts are deterministic in virtual time: the clock only moves when every task waits.

- An idle cluster quiesces, and then its links carry only liveness pings: no Raft message, no
  group tick, and the same frames per node pair per second with 1 group and with 50.
- A write to a quiesced group wakes it and commits.
- Killing (abort) the node leading 50 quiesced groups: no group stirs before the detector's
  timeout (no thundering herd), then every group elects a new leader with about one election
  each; the killed node restarting is seen up, and its groups are caught up.

Waiting is on conditions (polled) under trio.fail_after deadlines, in virtual time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from inproc_cluster import Cluster, RawClient, running_cluster, values_payload
from raft.core.types import Role
from raft.node.server import Node
from storage.memory import MemoryLog

VOTERS = [1, 2, 3]
# Virtual seconds any one wait may take. The longest a passing run waits is the fail-over's
# elections, about 0.7 s (measured under a load of 20 on 2 cores: the clock only jumps when
# every task waits, so load barely moves virtual time); ten seconds is ample. It is what a
# broken rule costs: the mutants killed here (tests/raft/test_mutants.py) wait it out, and
# each virtual second costs real ones, about 100 clock jumps of 5 ms at the least.
DEADLINE_S = 10.0
# Test cluster timing (inproc_cluster): tick 10 ms, election 20 ticks: down after 200 ms of
# silence, pings after 40 ms without a write.
DOWN_S = 0.2
PING_S = 0.04


def mock_clock_test(fn: Callable) -> Callable:
    """Run an async test under trio with a MockClock that jumps whenever every task waits."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        clock = trio.testing.MockClock(autojump_threshold=0.005)
        return trio.run(functools.partial(fn, *args, **kwargs), clock=clock)
    return wrapper


async def add_groups(cluster: Cluster, groups: range) -> dict[tuple[int, int], MemoryLog]:
    logs = {}
    for g in groups:
        for node in cluster.nodes:
            logs[(node.node_id, g)] = MemoryLog()
            await node.add_group(g, VOTERS, logs[(node.node_id, g)])
    return logs


def cores(nodes: list[Node]) -> list[Any]:
    return [group.core for node in nodes for group in node.registry.groups()]


async def until(cond: Callable[[], bool], what: str, within_s: float = DEADLINE_S) -> None:
    with trio.fail_after(within_s):
        while not cond():
            await trio.sleep(0.02)
    assert cond(), what


async def elected(cluster: Cluster) -> Node:
    """The cluster's leader, within this file's deadline (the harness allows more)."""
    with trio.fail_after(DEADLINE_S):
        return await cluster.wait_leader()


def leaders_of(nodes: list[Node], g: int) -> list[int]:
    return [n.node_id for n in nodes if n.registry.get(g).core.role == Role.LEADER]


def agreed_leader(nodes: list[Node], g: int) -> int | None:
    leaders = leaders_of(nodes, g)
    if len(leaders) != 1:
        return None
    if all(n.registry.get(g).core.leader_id == leaders[0] for n in nodes):
        return leaders[0]
    return None


async def all_quiet(nodes: list[Node]) -> None:
    await until(lambda: all(c.quiesced for c in cores(nodes)), "every group quiesced")


async def lead_all_from(cluster: Cluster, target: int, groups: range) -> None:
    """Move the leadership of every group to node `target` (transfer requests, retried)."""
    with trio.fail_after(DEADLINE_S):
        while True:
            moved = True
            for g in groups:
                leader = agreed_leader(cluster.nodes, g)
                if leader == target:
                    continue
                moved = False
                if leader is not None:
                    group = cluster.node(leader).registry.get(g)
                    try:
                        group.core.transfer_leadership(target)
                    except ValueError:
                        pass  # one already under way
                    group.kick()
            if moved:
                return
            await trio.sleep(0.05)


def pair_counts(nodes: list[Node]) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Per directed link: (frames, pings, raft messages) written so far."""
    return {(n.node_id, p): (link.sent_frames, link.sent_pings, link.sent_messages)
            for n in nodes for p, link in n.links.items()}


async def idle_rates(nodes: list[Node], seconds: float = 2.0) -> dict[str, Any]:
    """Over `seconds` of virtual time: frames per node pair per second (both directions), and
    the Raft messages and group ticks there were meanwhile."""
    before, ticks = pair_counts(nodes), sum(n.registry.group_ticks for n in nodes)
    node_ticks = sum(n.registry.ticks for n in nodes)
    started = trio.current_time()
    await trio.sleep(seconds)
    elapsed = trio.current_time() - started
    after = pair_counts(nodes)
    frames: dict[tuple[int, int], float] = {}
    messages = pings = 0
    for (src, dst), (f, p, m) in after.items():
        pair = (min(src, dst), max(src, dst))
        frames[pair] = frames.get(pair, 0.0) + (f - before[(src, dst)][0]) / elapsed
        pings += p - before[(src, dst)][1]
        messages += m - before[(src, dst)][2]
    return {"frames": frames, "pings": pings, "messages": messages,
            "group_ticks": sum(n.registry.group_ticks for n in nodes) - ticks,
            "node_ticks": sum(n.registry.ticks for n in nodes) - node_ticks}


async def produce(node: Node, g: int, value: bytes) -> dict[str, Any]:
    client = await RawClient.connect(node.address)
    try:
        return await client.request("produce", acks="quorum", timeout_ms=5000,
                                    payload=values_payload([value]), count=1, group=g)
    finally:
        await client.aclose()


@mock_clock_test
async def test_idle_groups_quiesce_and_links_carry_only_pings_with_1_and_50_groups() -> None:
    async with running_cluster(3) as cluster:
        await elected(cluster)
        await all_quiet(cluster.nodes)
        one = await idle_rates(cluster.nodes)
        await add_groups(cluster, range(2, 50))
        await all_quiet(cluster.nodes)
        fifty = await idle_rates(cluster.nodes)
        for rates in (one, fifty):
            # Quiet groups send nothing and are not ticked: only the detector's pings move.
            assert rates["messages"] == 0 and rates["group_ticks"] == 0, rates
            # ... and with no group awake the nodes' tickers sleep: no tick wake-ups either
            # (at most the one per node that finds its last group quiesced).
            assert rates["node_ticks"] <= len(cluster.nodes), rates
            assert rates["pings"] > 0, rates
            for pair in ((1, 2), (1, 3), (2, 3)):
                # One ping per direction per ping interval, at most.
                assert 0 < rates["frames"][pair] <= 2 / PING_S * 1.05, rates
        for pair in ((1, 2), (1, 3), (2, 3)):
            assert abs(fifty["frames"][pair] - one["frames"][pair]) <= 0.05 * one["frames"][
                pair], (one, fifty)
        node = cluster.nodes[0]
        assert node.registry.status() == {"count": 50, "quiesced": 50, "awake": 0}
        assert all(link["up"] for link in node.transport.link_status().values())


@mock_clock_test
async def test_a_write_to_a_quiesced_group_wakes_it_and_commits() -> None:
    async with running_cluster(3) as cluster:
        await elected(cluster)
        await add_groups(cluster, range(2, 6))
        await until(lambda: all(agreed_leader(cluster.nodes, g) for g in range(6)), "leaders")
        await all_quiet(cluster.nodes)
        leader = cluster.node(agreed_leader(cluster.nodes, 3))
        reply = await produce(leader, 3, b"wake-up")
        assert reply["ok"], reply
        offset = reply["base_offset"]
        # Committed on every node (the followers learn the commit index from the woken
        # leader's heartbeats, which a quiet group would never send).
        await until(lambda: all(n.registry.get(3).core.high_watermark >= offset
                                for n in cluster.nodes), "the write reached every node")
        # The other groups stayed asleep; the woken one goes quiet again.
        others = [n.registry.get(g).core for n in cluster.nodes for g in (1, 2, 4, 5)]
        assert all(c.quiesced for c in others)
        await all_quiet(cluster.nodes)


@mock_clock_test
async def test_killing_the_leader_of_50_quiesced_groups_fails_over_without_a_herd() -> None:
    groups = range(50)
    async with running_cluster(3) as cluster:
        await elected(cluster)
        logs = await add_groups(cluster, range(2, 50))
        await lead_all_from(cluster, 1, groups)
        await all_quiet(cluster.nodes)
        survivors = [cluster.node(2), cluster.node(3)]
        terms = {g: max(n.registry.get(g).core.term for n in survivors) for g in groups}
        killed_at = trio.current_time()
        await cluster.stop(1, crash=True)
        for (node_id, _g), lg in logs.items():
            if node_id == 1:
                lg.crash()
        # Nothing listens at node 1's address now: the survivors' links are refused when they
        # dial it again, and the detector reports it down at once, not after its timeout.
        await until(lambda: all(n.transport.liveness.down == {1} for n in survivors),
                    "the survivors report node 1 down", within_s=DOWN_S * 0.9)
        assert all(n.transport.liveness.refusals == 1 for n in survivors)
        # Then every group elects a new leader among the survivors.
        # (Within the fail-over bound asserted below: a run that would fail it stops here.)
        await until(lambda: all(agreed_leader(survivors, g) in (2, 3) for g in groups),
                    "every group has a leader again", within_s=10 * DOWN_S)
        failover_s = trio.current_time() - killed_at
        assert all(n.transport.liveness.down == {1} for n in survivors)
        elections = sum(max(n.registry.get(g).core.term for n in survivors) - terms[g]
                        for g in groups)
        # No herd: a herd (every group's survivors campaigning together) costs 2 or more
        # elections a group. The figure (<= 1.1 on average) is a bench target
        # (partitions.failover1000.elections_per_partition, docs/PERFORMANCE.md): with two
        # survivors whose randomised timeouts take one of election_ticks values, about one
        # group in ten sees both campaign in the same tick, so 50 groups land near 1.1 either
        # side run to run; asserting it here would be a coin toss, not a rule.
        assert elections / len(groups) <= 1.5, (elections, failover_s)
        assert failover_s < 10 * DOWN_S, failover_s
        # Writes go on meanwhile; the killed node will have to catch up on them.
        offsets = {}
        for g in (1, 7, 49):
            reply = await produce(cluster.node(agreed_leader(survivors, g)), g, b"after-kill")
            assert reply["ok"], reply
            offsets[g] = reply["base_offset"]
        # The killed node restarts with what it had flushed: its peers see it up, its groups
        # are caught up.
        node = await cluster.restart(1)
        for g in range(2, 50):
            await node.add_group(g, VOTERS, logs[(1, g)])
        await until(lambda: all(not n.transport.liveness.down for n in survivors),
                    "the survivors see node 1 up")
        await until(lambda: all(node.registry.get(g).core.high_watermark >= offsets[g]
                                for g in offsets), "node 1 caught up")
        await until(lambda: all(agreed_leader(cluster.nodes, g) for g in groups),
                    "node 1 knows every group's leader")
        await all_quiet(cluster.nodes)


@mock_clock_test
async def test_a_follower_catches_up_and_quiesces_only_with_ticks() -> None:
    """The ticker must tick awake groups: a new group elects (election timers are ticks),
    its leader heartbeats the commit index to its followers, and asks them to go quiet."""
    async with running_cluster(3) as cluster:
        await elected(cluster)
        await add_groups(cluster, range(2, 3))
        await until(lambda: all(agreed_leader(cluster.nodes, g) for g in range(3)), "leaders")
        leader = cluster.node(agreed_leader(cluster.nodes, 2))
        reply = await produce(leader, 2, b"x")
        assert reply["ok"], reply
        await until(lambda: all(n.registry.get(2).core.commit_index >= reply["base_offset"]
                                for n in cluster.nodes), "followers learned the commit index")
        await all_quiet(cluster.nodes)
