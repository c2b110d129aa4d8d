"""A peer that restarted faster than the failure detector's timeout (raft/node/liveness.py,
`peer_booted`): its silence never reached the timeout, so without more nothing reports it down
and up, and the quiet groups it led keep following a leader that is gone.

Every process has a random boot id, sent in the hello of each peer connection it opens and in
its answer to each one it accepts; a new one is a restart, reported down and at once up again.
The detector's verdicts are checked by hand in virtual time, and three in-process nodes over
loopback (trio's MockClock, as tests/node/test_quiesce_inproc.py) show the groups reacting."""

from __future__ import annotations

import trio
import trio.testing

from inproc_cluster import running_cluster
from raft.node.liveness import NodeLiveness
from raft.protocol.hello import Hello, HelloReply
from test_quiesce_inproc import (DEADLINE_S, DOWN_S, VOTERS, add_groups, agreed_leader,
                                 all_quiet, elected, lead_all_from, mock_clock_test, until)

GROUPS = range(5)  # 0 and 1 run from the start (as in test_quiesce_inproc)


def test_a_new_boot_id_is_a_restart_and_the_same_one_a_reconnect() -> None:
    async def main() -> None:
        seen: list[tuple[int, bool]] = []
        d = NodeLiveness(1, ping_s=0.1, down_s=0.5, peers=lambda: (2, 3))
        d.on_change = lambda peer, up: seen.append((peer, up))
        d.check(trio.current_time())
        d.peer_booted(2, 111)  # first heard of: nothing to compare with
        d.peer_booted(2, 111)  # a reconnect to the same process
        d.peer_booted(3, None)  # an older version says nothing
        assert seen == [] and d.restarts_seen == 0
        d.peer_booted(2, 222)  # restarted, never silent long enough to be seen down
        assert seen == [(2, False), (2, True)] and d.restarts_seen == 1
        assert not d.down
        # Restarted while already reported down: only the up (which its first frame would
        # also give).
        for _ in range(7):
            await trio.sleep(0.1)
            d.heard(3)
            d.check(trio.current_time())
        assert seen[-1] == (2, False) and 2 in d.down
        d.peer_booted(2, 333)
        assert seen[-2:] == [(2, False), (2, True)] and not d.down

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_boot_id_travels_in_the_peer_hello_and_its_answer() -> None:
    assert Hello.parse(Hello.peer(2, "c", True, boot=42).to_frame()).boot == 42
    assert Hello.parse(Hello.peer(2).to_frame()).boot is None  # older nodes: none
    assert HelloReply.parse(HelloReply(3, boot=7).to_frame()).boot == 7
    frame = Hello.peer(2, boot=42).to_frame()
    frame["boot"] = "x"  # malformed: as if none (a restart is then seen by silence only)
    assert Hello.parse(frame).boot is None


@mock_clock_test
async def test_quiet_groups_led_by_a_node_that_restarted_unseen_wake_at_once() -> None:
    """Node 1 leads every group, all quiet; it crashes and is back before the detector's
    timeout. Its peers see the restart in its handshake and their quiet followers wake at
    once: well before node 1's own election timer (one election timeout, 0.2 s, at the
    least) could have woken them, the core's fallback. Then every group has a leader all
    three nodes agree on."""
    async with running_cluster(3) as cluster:
        await elected(cluster)
        logs = await add_groups(cluster, range(2, len(GROUPS)))
        await lead_all_from(cluster, 1, GROUPS)
        await all_quiet(cluster.nodes)
        survivors = [cluster.node(2), cluster.node(3)]
        await cluster.stop(1, crash=True)
        for (node_id, _g), lg in logs.items():
            if node_id == 1:
                lg.crash()
        node = await cluster.restart(1)
        for g in range(2, len(GROUPS)):
            await node.add_group(g, VOTERS, logs[(1, g)])

        def awake() -> bool:
            return not any(n.registry.get(g).core.quiesced for n in survivors for g in GROUPS)

        await until(awake, "the survivors' groups woke when node 1 came back",
                    within_s=DOWN_S / 2)
        assert all(n.transport.liveness.restarts_seen == 1 for n in survivors)
        await until(lambda: all(agreed_leader(cluster.nodes, g) for g in GROUPS),
                    "every group has a leader again")
