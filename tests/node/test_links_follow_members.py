"""A node keeps peer links to what its groups' configurations name (Node._sync_links): a member
added at run time gets a link on every node, at the address its configuration carries, and a
removed one loses it. The group only says that its configuration changed; the node decides."""

from __future__ import annotations

import trio

from inproc_cluster import DEADLINE_S, RawClient, running_cluster, trio_test

NEW_ID = 4
NEW_ADDRESS = "127.0.0.1:1"  # nothing listens there: the links just keep redialling


@trio_test
async def test_links_open_to_an_added_member_and_close_when_it_is_removed() -> None:
    async with running_cluster(3) as cluster:
        leader = await cluster.wait_leader()
        assert all(NEW_ID not in n.links for n in cluster.nodes)
        client = await RawClient.connect(leader.address)
        added = await client.request("add_node", node_id=NEW_ID, address=NEW_ADDRESS)
        assert added["ok"] and NEW_ID in added["learners"], added
        with trio.fail_after(DEADLINE_S):  # followers see the configuration once replicated
            while not all(NEW_ID in n.links and n.links[NEW_ID].address == NEW_ADDRESS
                          for n in cluster.nodes):
                await trio.sleep(0.02)
        assert all(n.peer_address(NEW_ID) == NEW_ADDRESS for n in cluster.nodes)
        removed = await client.request("remove_node", node_id=NEW_ID)
        assert removed["ok"] and NEW_ID not in removed["learners"], removed
        with trio.fail_after(DEADLINE_S):
            while any(NEW_ID in n.links for n in cluster.nodes):
                await trio.sleep(0.02)
        # The --peers members keep theirs.
        assert all(sorted(n.links) == sorted({1, 2, 3} - {n.node_id}) for n in cluster.nodes)
