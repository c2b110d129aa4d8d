"""A link's gap report on a sink cluster that requires tokens (issue 30, docs/REPLICATION.md):
a puller on a node that does not lead the sink's controller records a bootstrap's gap through
its own client, which has no token; it authenticates with the node's certificate (session
method "node", raft.node.auth.NODE_REQUESTS), so the gap is recorded and the mirror moves on.
Without that the report is refused and the mirror waits at the gap forever."""

from __future__ import annotations

import trio

from raft.cli import pki
from raft.client import Client
from raft.client.errors import RaftlogError
from raft.core.types import Role
from raft.node.config import NodeConfig
from raft.node.links.puller import PullSpec
from raft.node.server import Node
from storage.memory import MemoryLog
from test_security_unit import shared_pki

DEADLINE_S = 30.0


def secured_gap_report() -> dict:
    """Three in-process TLS nodes with the auth file; a link created with the ops token; the
    gap report of a node that does not lead the controller. What happened, for the caller
    to assert outside trio (a mutant test needs the plain failure)."""
    p = shared_pki()
    ids = (1, 2, 3)
    seen: dict = {}

    async def main() -> None:
        nodes = [Node(NodeConfig(node_id=i, data_dir="/nonexistent-in-memory",
                                 peers={j: "127.0.0.1:0" for j in ids}, tick_ms=10,
                                 election_ticks=20, reconnect_min_ms=5, reconnect_max_ms=100,
                                 auth_file=str(p.auth_file), **p.node_settings(i)),
                      log_storage=MemoryLog()) for i in ids]
        async with trio.open_nursery() as nursery:
            for node in nodes:
                await nursery.start(node.run)
            for node in nodes:
                for other in nodes:
                    if other is not node:
                        node.set_peer_address(other.node_id, other.address)
            try:
                with trio.fail_after(DEADLINE_S):
                    async with Client([n.address for n in nodes], tls_ca=str(p.ca),
                                      token=p.tokens["ops"], timeout=20,
                                      retry_refused=True) as ops:
                        while True:
                            reply = await ops.call("link_create", name="dr",
                                                   source_servers=["127.0.0.1:9"],
                                                   source_cluster_id="c0ffee",
                                                   mirrors=[["orders", "orders", 1]],
                                                   replicas=3, timeout_ms=5000)
                            if reply.get("link"):
                                break
                    while not all("orders" in n.topics.metadata.topics for n in nodes):
                        await trio.sleep(0.02)
                    while True:
                        leaders = [n for n in nodes if n.controller_group.core is not None
                                   and n.controller_group.core.role == Role.LEADER]
                        if leaders:
                            break
                        await trio.sleep(0.02)
                    other = next(n for n in nodes if n is not leaders[0])
                    gid = other.topics.metadata.topics["orders"].partitions[0].group
                    spec = PullSpec("dr", "sink", "orders", 0, gid, "orders")
                    try:
                        await other.topics.links._report_gap(spec, 0, 9)
                        seen["reported"] = True
                    except Exception as e:  # what the puller would retry forever
                        seen["reported"] = f"{type(e).__name__}: {e}"
                        return
                    while not all(n.topics.metadata.links["dr"].gaps for n in nodes):
                        await trio.sleep(0.02)
                    seen["gaps"] = [{k: g.count for k, g in
                                     n.topics.metadata.links["dr"].gaps.items()} for n in nodes]
                    # A node certificate of the same CA for a node id this cluster does not
                    # have (a retired node, another cluster's): refused, not a gap recorded.
                    stranger = pki.issue_node(p.dir, 9)
                    async with Client([n.address for n in nodes], tls_ca=str(p.ca),
                                      tls_cert=str(stranger.cert), tls_key=str(stranger.key),
                                      timeout=10, retry_refused=True) as other_node:
                        try:
                            await other_node.call("link_event", link="dr", topic="orders",
                                                  partition=0, gap_from=10, gap_to=19,
                                                  timeout_ms=5000)
                            seen["stranger"] = "recorded"
                        except RaftlogError as e:
                            seen["stranger"] = str(e)
            finally:
                for node in nodes:
                    node.request_shutdown()

    trio.run(main)
    return seen


def test_a_gap_report_from_a_node_not_leading_the_controller_is_recorded_on_a_secured_sink(
) -> None:
    seen = secured_gap_report()
    assert seen.get("reported") is True, seen
    assert all(g == {("orders", 0): 1} for g in seen["gaps"]), seen
    assert "not a member of this cluster" in seen["stranger"], seen


def test_a_node_certificate_of_a_node_not_in_this_cluster_is_refused() -> None:
    """The node session is for this cluster's nodes: a certificate of the same CA naming
    another node id (retired, or another cluster's sharing the CA) sends nothing."""
    from raft.core.types import ErrorCode
    from raft.node.auth import Authenticator
    from raft.node.tls import Identity
    auth = Authenticator(shared_pki().auth_file)
    auth.members = lambda: {1, 2, 3}
    member = auth.authenticate(None, Identity("node", "2"))
    assert auth.authorize(member, "link_event") is None
    stranger = auth.authenticate(None, Identity("node", "9"))
    refusal = auth.authorize(stranger, "link_event")
    assert refusal is not None and refusal.code == ErrorCode.FORBIDDEN
    assert "not a member of this cluster" in refusal.message and "certs init" in refusal.message


def test_a_node_certificate_authenticates_node_internal_requests_only() -> None:
    """A cluster node's certificate opens a "node" session: link_event passes, nothing else
    (a node certificate must not stand in for an operator's token)."""
    from raft.core.types import ErrorCode
    from raft.node.auth import NODE_REQUESTS, Authenticator
    from raft.node.tls import Identity
    auth = Authenticator(shared_pki().auth_file)
    session = auth.authenticate(None, Identity("node", "2"))
    assert (session.principal, session.method) == ("node-2", "node")
    for t in sorted(NODE_REQUESTS):
        assert auth.authorize(session, t) is None
        assert auth.authorize_topic(session, t, None) is None
    for t in ("produce", "fetch", "topic_create", "link_create", "remove_node", "status"):
        refusal = auth.authorize(session, t)
        assert refusal is not None and refusal.code == ErrorCode.FORBIDDEN, t
        assert "node-internal" in refusal.message and "token" in refusal.message


def test_the_members_a_node_certificate_may_speak_for() -> None:
    """Registered active nodes, a decommissioned node still holding a replica (draining: it
    may lead a mirror partition), the Raft peers; not a decommissioned node that holds
    nothing any more (retired), nor an id never registered."""
    from types import SimpleNamespace

    from raft.controller.commands import DecommissionNode, RegisterNode
    from raft.node.server import Node
    from tests.controller.controller_helpers import founded, run
    meta = founded(4)  # the default topic on nodes 1..4
    assert all(r.ok for r in run(meta, RegisterNode(5, "127.0.0.1:9005"),
                                  DecommissionNode(5), DecommissionNode(4)))
    node = SimpleNamespace(node_id=1, peer_addresses={2: "a", 7: "b"},
                           topics=SimpleNamespace(metadata=meta))
    assert Node._cluster_members(node) == {1, 2, 3, 4, 7}
