"""Cluster identity (raft/node/identity.py): how founders agree on one id, when it becomes firm,
and that a node refuses a peer of another cluster at the hello, naming both ids."""

from __future__ import annotations

import trio

from inproc_cluster import DEADLINE_S, RawClient, running_cluster, trio_test
from raft.node.identity import FIRM_KEY, ID_KEY, ClusterIdentity, IdState
from raft.protocol.hello import Hello, HelloReply


def _identity(node_id: int, extra: dict, *, fresh: bool = True, founder: int | None = 1,
              saves: list[int] | None = None) -> ClusterIdentity:
    ident = ClusterIdentity(node_id)
    ident.load(extra, fresh=fresh, founder=founder,
               save=lambda: saves.append(1) if saves is not None else None)
    return ident


def test_founders_take_the_lowest_founders_id_and_firm_it_as_members() -> None:
    saves: list[int] = []
    e1, e2 = {}, {}
    one, two = _identity(1, e1, saves=saves), _identity(2, e2)
    assert one.state is IdState.TENTATIVE and e1[ID_KEY] == one.cluster_id and saves
    assert two.state is IdState.UNKNOWN and two.cluster_id is None
    # A tentative id from a node that is not the founder is no one's to take.
    assert two.heard(3, "c" * 32, False) is None and two.cluster_id is None
    assert two.heard(1, *one.hello_fields()) is None
    assert two.cluster_id == one.cluster_id and two.state is IdState.TENTATIVE
    for ident, extra in ((one, e1), (two, e2)):
        ident.became_member()
        assert ident.state is IdState.FIRM and extra[FIRM_KEY] is True
    # Restarted: the saved firm id is loaded as it was.
    again = _identity(2, dict(e2), fresh=False)
    assert again.hello_fields() == (one.cluster_id, True)


def test_a_node_without_a_firm_id_adopts_the_first_firm_one_it_hears() -> None:
    extra: dict = {}
    wiped = _identity(1, extra)  # the founder's directory, lost: it minted a new tentative id
    assert wiped.heard(2, "a" * 32, True) is None
    assert (wiped.cluster_id, wiped.state, extra[FIRM_KEY]) == ("a" * 32, IdState.FIRM, True)
    old = _identity(3, {}, fresh=False)  # a directory of a version before cluster ids
    assert old.state is IdState.UNKNOWN
    assert old.heard(1, None, False) is None  # an older peer: compatible
    assert old.heard(1, "a" * 32, True) is None and old.cluster_id == "a" * 32


def test_firm_ids_that_differ_refuse_each_other_naming_both() -> None:
    mine = _identity(1, {ID_KEY: "a" * 32, FIRM_KEY: True}, fresh=False)
    why = mine.heard(2, "b" * 32, True)
    assert why is not None and "a" * 32 in why and "b" * 32 in why and "wipe" in why
    assert mine.cluster_id == "a" * 32  # never adopts another firm id
    assert mine.heard(2, "b" * 32, False) is None  # a tentative proposal: not a conflict


def test_hello_carries_the_cluster_id_and_older_hellos_parse() -> None:
    hello = Hello.peer(2, "a" * 32, True)
    assert Hello.parse(hello.to_frame()) == hello
    assert Hello.parse({"t": "hello", "role": "peer", "node_id": 2}).cluster_id is None
    reply = HelloReply(1, 1 << 20, None, "b" * 32, False)
    assert HelloReply.parse(reply.to_frame()) == reply
    assert HelloReply.parse({"t": "hello", "node_id": 1}).cluster_id is None


@trio_test
async def test_a_node_refuses_a_peer_hello_of_another_cluster() -> None:
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        node = cluster.node(1)
        identity = node.transport.identity
        with trio.fail_after(DEADLINE_S):
            while identity.state is not IdState.FIRM:
                await trio.sleep(0.01)  # polling the node's state, not synchronising
        assert identity.cluster_id is not None
        assert all(n.transport.identity.cluster_id == identity.cluster_id for n in cluster.live)
        client = await RawClient.connect(node.address, hello=False)
        await client.send(Hello.peer(2, "f" * 32, True).to_frame())
        with trio.fail_after(DEADLINE_S):
            answer = await client.recv()  # the refusal, not a hello reply
        assert answer is not None and answer["t"] == "error", answer
        assert "f" * 32 in answer["message"] and identity.cluster_id in answer["message"]
        assert "f" * 32 in identity.refusals[2].message
        await client.aclose()


def test_refusals_are_bounded_and_not_a_member_is_only_what_a_peer_told_us() -> None:
    ident = _identity(1, {ID_KEY: "a" * 32, FIRM_KEY: True}, fresh=False)
    for claimed in range(1000, 1300):  # any connection may claim any node id
        ident.refused(claimed, f"node {claimed} is not a member", by_us=True, not_member=True)
    assert len(ident.refusals) <= 64 and len(ident._logged) <= 64
    assert "not_member" not in ident.status()  # we refused them: we are a member
    ident.refused(2, "node 1 is not a member of the cluster", by_us=False, not_member=True)
    assert ident.status()["not_member"] == "node 1 is not a member of the cluster"
    ident.connected(2)
    assert "not_member" not in ident.status()
