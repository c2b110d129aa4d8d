"""A link's hold on the source ends with the link (issue 30, docs/REPLICATION.md): its
position subscription `__link.<sink>.<link>` on each source partition is deleted when the
link is deleted, also while it was paused (no puller runs then to delete it), so the source's
retention is not held for a link that no longer exists."""

from __future__ import annotations

import trio

from inproc_cluster import DEADLINE_S, running_cluster, trio_test
from test_links_inproc import mirror_fields
from test_topics_inproc import admin, group_of, metadata_everywhere, partition_leader, request


async def link_subscriptions(node, partitions: int) -> list[str]:
    found: list[str] = []
    for p in range(partitions):
        reply = await request(node, "sub_list", topic="orders", partition=p, timeout_ms=2000)
        assert reply["ok"], reply
        found += [s["name"] for s in reply["subscriptions"] if s["name"].startswith("__link.")]
    return found


@trio_test
async def test_deleting_a_paused_link_deletes_its_position_on_the_source() -> None:
    async with running_cluster(1) as source, running_cluster(1) as sink:
        created = await admin(source, "topic_create", name="orders", partitions=2, replicas=1)
        assert created["ok"], created
        await metadata_everywhere(source, lambda m: "orders" in m.topics)
        node = source.live[0]
        for p in range(2):
            await partition_leader(source, group_of(node, "orders", p))
        meta = await request(node, "metadata")
        await metadata_everywhere(sink, lambda m: "default" in m.topics)
        reply = await admin(sink, "link_create", **{
            **mirror_fields("dr", [node.address], meta["cluster_id"]), "replicas": 1})
        assert reply["ok"], reply
        with trio.fail_after(DEADLINE_S):  # each puller opened its position on the source
            while len(await link_subscriptions(node, 2)) < 2:
                await trio.sleep(0.05)
        assert (await admin(sink, "link_alter", name="dr", op="pause"))["ok"]
        links = sink.live[0].topics.links
        with trio.fail_after(DEADLINE_S):
            while links.pullers:
                await trio.sleep(0.02)
        assert len(await link_subscriptions(node, 2)) == 2  # paused: the hold stays
        assert (await admin(sink, "link_alter", name="dr", op="delete"))["ok"]
        with trio.fail_after(DEADLINE_S):
            while await link_subscriptions(node, 2):
                await trio.sleep(0.05)
