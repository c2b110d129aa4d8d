"""A node that hears from a peer redials it at once instead of waiting out its backoff.

After a partition heals, the peer's link to us can connect while ours to it still waits out
its reconnect backoff (up to reconnect_max_ms): every reply we owe the peer waits with it
(ci17: a healed old leader's replies waited up to 2 s). Hearing from the peer (its handshake,
any frame on its link to us) cuts the backoff short (raft/node/peer.py `heard_from_peer`), at
most once per HEARD_REDIAL_INTERVAL_S, so a peer that reaches us while we cannot reach it does
not make us dial once per frame.

Virtual time (trio's MockClock) over loopback, as tests/node/test_peer_restart.py: the
backoffs here are 60 s, so a link that waited one out would fail the tests' deadlines, which
are virtual seconds (no wall clock is read)."""

from __future__ import annotations

import dataclasses
import functools
import random

import trio

from inproc_cluster import running_cluster
from test_quiesce_inproc import mock_clock_test
from raft.node.peer import HEARD_REDIAL_INTERVAL_S, PeerLink
from raft.node.server import Node
from raft.protocol.framing import encode_frame
from raft.protocol.streams import FrameReader

BACKOFF_S = 60.0  # min = max: a link in backoff waits exactly this long


class Peer:
    """A listener standing in for node 2: while `cut`, it drops every connection before
    answering the hello (the link's dial fails and it backs off); healed, it answers."""

    def __init__(self) -> None:
        self.cut = True
        self.dials = 0
        self.port = 0

    async def handler(self, stream: trio.SocketStream) -> None:
        self.dials += 1
        if self.cut:
            await stream.aclose()
            return
        reader = FrameReader(stream, 1 << 20)
        await reader.receive()
        await stream.send_all(encode_frame({"t": "hello", "node_id": 2}))
        while await reader.receive() is not None:
            pass


def _link(port: int) -> PeerLink:
    return PeerLink(1, 2, f"127.0.0.1:{port}", max_frame_bytes=1 << 20, queue_messages=100,
                    queue_bytes=1 << 20, backoff_min_s=BACKOFF_S, backoff_max_s=BACKOFF_S,
                    rng=random.Random(1))


async def _until(pred, what: str, within_s: float) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(within_s):
        while not pred():
            await trio.sleep(0.001)


async def _backing_off(nursery: trio.Nursery, peer: Peer) -> PeerLink:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, peer.handler, 0,
                                                      host="127.0.0.1"))
    peer.port = listeners[0].socket.getsockname()[1]
    link = _link(peer.port)
    nursery.start_soon(link.run)
    await _until(lambda: link.backing_off and peer.dials == 1, "a failed dial", 5)
    return link


@mock_clock_test
async def test_hearing_from_the_peer_cuts_the_backoff_short() -> None:
    peer = Peer()
    async with trio.open_nursery() as nursery:
        link = await _backing_off(nursery, peer)
        peer.cut = False  # healed; our link would redial only after BACKOFF_S
        link.heard_from_peer()  # ...but the peer's own link reached us
        await _until(lambda: link.connected, "the link to redial at once", BACKOFF_S / 10)
        assert link.status()["heard_redials"] == 1
        nursery.cancel_scope.cancel()


@mock_clock_test
async def test_a_peer_heard_while_unreachable_is_redialled_at_a_bounded_rate() -> None:
    """The peer reaches us, we cannot reach it: it pings us every few ms, and our link dials
    no more than once per HEARD_REDIAL_INTERVAL_S (plus its first dial)."""
    peer = Peer()
    async with trio.open_nursery() as nursery:
        link = await _backing_off(nursery, peer)
        start = trio.current_time()
        span = 10 * HEARD_REDIAL_INTERVAL_S
        while trio.current_time() - start < span:
            link.heard_from_peer()
            await trio.sleep(HEARD_REDIAL_INTERVAL_S / 5)
        assert not link.connected
        assert 3 <= peer.dials - 1 <= 11, peer.dials
        assert link.status()["heard_redials"] == peer.dials - 1
        nursery.cancel_scope.cancel()


@mock_clock_test
async def test_a_restarted_peer_is_redialled_when_its_handshake_reaches_us() -> None:
    """The node's path: node 2 is down long enough that the others' links to it back off for
    BACKOFF_S; it comes back at the same address. Its own links reach the others at once, and
    their handshakes make the others redial it then, not a backoff later."""
    async with running_cluster(3, reconnect_min_ms=int(BACKOFF_S * 1000),
                               reconnect_max_ms=int(BACKOFF_S * 1000)) as cluster:
        await cluster.wait_leader()
        others = [cluster.node(1), cluster.node(3)]
        old = cluster.node(2)
        address = old.address
        await cluster.stop(2)
        await _until(lambda: all(n.transport.links[2].backing_off
                                 and not n.transport.links[2].connected for n in others),
                     "the others' links to node 2 to back off", 5)
        # Back at the same address (nothing tells the others' links it moved).
        node = Node(dataclasses.replace(old.config, listen=address),
                    log_storage=cluster.logs[2])
        for other in others:
            node.set_peer_address(other.node_id, other.address)
        await cluster.nursery.start(node.run)
        cluster.nodes[cluster.nodes.index(old)] = node
        await _until(lambda: all(n.transport.links[2].connected for n in others),
                     "the others' links to node 2 to connect", BACKOFF_S / 10)
        assert all(n.transport.links[2].status()["heard_redials"] >= 1 for n in others)
