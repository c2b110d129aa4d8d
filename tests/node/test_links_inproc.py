"""Links on in-process nodes (issue 30): the link requests answered by the sink's controller
leader and every node's metadata (origin, mirror_active), and a real link between two
in-process clusters: pullers on the mirror partitions' leaders copy the source's batches at
the same offsets, the mirror refuses produces until promoted, then takes them at the next
offset."""

from __future__ import annotations

import trio

from inproc_cluster import DEADLINE_S, running_cluster, trio_test
from test_topics_inproc import (admin, all_partitions_led, create, group_of, metadata_everywhere,
                                partition_leader, produce, request)
from storage.records import encode_values


def mirror_fields(name: str, servers: list[str], cid: str = "c0ffee",
                  mirrors: list | None = None) -> dict:
    return {"name": name, "source_servers": servers, "source_cluster_id": cid,
            "mirrors": mirrors or [["orders", "orders", 2]], "replicas": 3}


@trio_test
async def test_link_requests_on_the_sink_controller() -> None:
    async with running_cluster(3) as sink:
        await metadata_everywhere(sink, lambda m: "default" in m.topics)
        # Nothing listens on the source: pullers report it, the control plane works alone.
        created = await admin(sink, "link_create", **mirror_fields("dr", ["127.0.0.1:9"]))
        assert created["ok"], created
        assert created["link"]["topics"] == [{"source_topic": "orders", "topic": "orders"}]
        assert created["link"]["token"] is False
        await metadata_everywhere(sink, lambda m: "orders" in m.topics)
        meta = await request(sink.nodes[1], "metadata", topics=["orders"])
        [topic] = meta["topics"]
        assert topic["origin"] == {"link": "dr", "source_cluster_id": "c0ffee",
                                   "source_topic": "orders"}
        assert topic["mirror_active"] is True and len(topic["partitions"]) == 2
        assert meta["cluster_id"]
        again = await admin(sink, "link_create", **mirror_fields("dr", ["127.0.0.1:9"]))
        assert again["error"]["code"] == "BAD_REQUEST" and "exists" in again["error"]["message"]
        clash = await admin(sink, "link_create", **mirror_fields("dr2", ["127.0.0.1:9"]))
        assert clash["error"]["refusal"] == "topic_exists", clash
        assert "--prefix" in clash["error"]["message"]
        paused = await admin(sink, "link_alter", name="dr", op="pause")
        assert paused["ok"] and paused["link"]["state"] == "paused", paused
        event = await admin(sink, "link_event", link="dr", topic="orders", partition=1,
                            gap_from=0, gap_to=9)
        assert event["ok"], event
        await metadata_everywhere(sink, lambda m: m.links["dr"].gaps)
        listed = await request(sink.nodes[2], "link_list")
        [link] = listed["links"]
        assert link["gaps"][0]["offsets_lost"] == 10 and link["state"] == "paused"
        promoted = await admin(sink, "topic_promote", name="orders")
        assert promoted["ok"] and promoted["topic"]["mirror_active"] is False, promoted
        twice = await admin(sink, "topic_promote", name="orders")
        assert twice["error"]["refusal"] == "not_a_mirror", twice
        deleted = await admin(sink, "link_alter", name="dr", op="delete")
        assert deleted["ok"], deleted
        unknown = await admin(sink, "link_alter", name="dr", op="resume")
        assert unknown["error"]["refusal"] == "unknown_link", unknown


async def batches(node, topic: str, partition: int) -> list[tuple]:
    reply = await request(node, "fetch", offset=0, max_bytes=1 << 20, topic=topic,
                          partition=partition)
    if not reply["ok"] and reply["error"]["code"] == "OFFSET_OUT_OF_RANGE":
        reply = await request(node, "fetch", offset=reply["error"]["start_offset"],
                              max_bytes=1 << 20, topic=topic, partition=partition)
    assert reply["ok"], reply["error"]
    return [(b["base_offset"], b["count"], b["timestamp_ms"], bytes(b["payload"]))
            for b in reply["batches"]]


@trio_test
async def test_a_link_between_two_clusters_mirrors_at_the_same_offsets() -> None:
    async with running_cluster(3) as source, running_cluster(3) as sink:
        await create(source, "orders", 2, 3)
        await all_partitions_led(source, "orders")
        for p in range(2):
            for i in range(3):
                await produce(source, "orders", p, f"p{p}-{i}".encode())
        # A consumer's subscription on the source, at the end of partition 0.
        src0 = await partition_leader(source, group_of(source.nodes[0], "orders", 0))
        end = src0.registry.get(group_of(src0, "orders", 0)).core.high_watermark + 1
        opened = await request(src0, "sub_open", name="app", topic="orders", partition=0,
                               timeout_ms=2000, **{"from": end})
        assert opened["ok"], opened
        meta = await request(source.nodes[0], "metadata")
        await metadata_everywhere(sink, lambda m: "default" in m.topics)
        created = await admin(sink, "link_create", **mirror_fields(
            "dr", [n.address for n in source.nodes], meta["cluster_id"]))
        assert created["ok"], created
        await metadata_everywhere(sink, lambda m: "orders" in m.topics)
        for p in range(2):
            await produce(source, "orders", p, f"p{p}-late".encode())

        async def same(p: int) -> bool:
            src = await partition_leader(source, group_of(source.nodes[0], "orders", p))
            dst = await partition_leader(sink, group_of(sink.nodes[0], "orders", p))
            want = await batches(src, "orders", p)
            return bool(want) and await batches(dst, "orders", p) == want

        with trio.fail_after(DEADLINE_S):
            for p in range(2):
                while not await same(p):
                    await trio.sleep(0.05)
        dst = await partition_leader(sink, group_of(sink.nodes[0], "orders", 0))
        refused = await request(dst, "produce", acks="quorum", timeout_ms=2000, topic="orders",
                                partition=0, payload=encode_values([b"x"]), count=1)
        assert refused["error"]["code"] == "MIRROR_READ_ONLY", refused
        status = await request(dst, "link_status")
        rows = [r for r in status["partitions"] if r["partition"] == 0]
        assert rows and rows[0]["lag_records"] == 0 and rows[0]["link"] == "dr", status
        last = (await batches(dst, "orders", 0))[-1]
        name = f"__link.{sink.nodes[0].transport.identity.cluster_id}.dr"

        async def held() -> bool:
            got = await request(src0, "sub_get", name=name, topic="orders", partition=0,
                                timeout_ms=2000)
            return bool(got["ok"])

        with trio.fail_after(DEADLINE_S):
            while not await held():  # the link's position, on the source
                await trio.sleep(0.05)
        mirror0 = dst.registry.get(group_of(dst, "orders", 0))
        with trio.fail_after(DEADLINE_S):  # the subscription came with the topic
            while "app" not in mirror0.subs.table.subs or \
                    mirror0.subs.table.subs["app"].position != end:
                await trio.sleep(0.05)
        assert (await admin(sink, "topic_promote", name="orders"))["ok"]
        with trio.fail_after(DEADLINE_S):
            while await held():  # promoted: the source no longer keeps anything for it
                await trio.sleep(0.05)
        with trio.fail_after(DEADLINE_S):
            while True:
                dst = await partition_leader(sink, group_of(sink.nodes[0], "orders", 0))
                taken = await request(dst, "produce", acks="quorum", timeout_ms=2000,
                                      topic="orders", partition=0,
                                      payload=encode_values([b"x"]), count=1)
                if taken["ok"]:
                    break
                assert taken["error"]["code"] in ("MIRROR_READ_ONLY", "NOT_LEADER"), taken
                await trio.sleep(0.02)
        assert taken["base_offset"] == last[0] + last[1], (taken, last)


@trio_test
async def test_a_source_that_cut_past_the_position_bootstraps_and_reports_the_gap() -> None:
    from test_topic_settings_inproc import KEEP, fill, settle
    async with running_cluster(1) as source, running_cluster(1) as sink:
        created = await admin(source, "topic_create", name="small", partitions=1, replicas=1,
                              retention_bytes=KEEP)
        assert created["ok"], created
        await metadata_everywhere(source, lambda m: "small" in m.topics)
        node = source.live[0]
        gid = group_of(node, "small", 0)
        await partition_leader(source, gid)
        await fill(node, "small", 0, 20)
        await settle(node.registry.get(gid))
        start = node.registry.get(gid).log.start_offset
        assert start > 0
        last = node.registry.get(gid).core.high_watermark
        meta = await request(node, "metadata")
        await metadata_everywhere(sink, lambda m: "default" in m.topics)
        reply = await admin(sink, "link_create", **{
            **mirror_fields("dr", [node.address], meta["cluster_id"], [["small", "small", 1]]),
            "replicas": 1})
        assert reply["ok"], reply
        await metadata_everywhere(sink, lambda m: "small" in m.topics)
        mirror = sink.live[0].registry
        with trio.fail_after(DEADLINE_S):
            while not (sink.live[0].topics.metadata.links["dr"].gaps and
                       mirror.get(group_of(sink.live[0], "small", 0)) is not None and
                       mirror.get(group_of(sink.live[0], "small", 0)).core.visible_end == last):
                await trio.sleep(0.05)
        listed = await request(sink.live[0], "link_list")
        [gap] = listed["links"][0]["gaps"]
        assert gap["bootstraps"] == 1 and gap["latest"] == [[0, start - 1]], gap


@trio_test
async def test_a_paused_link_holds_the_sources_retention_and_resumes_without_a_gap() -> None:
    from test_topic_settings_inproc import KEEP, fill, settle
    async with running_cluster(1) as source, running_cluster(1) as sink:
        created = await admin(source, "topic_create", name="small", partitions=1, replicas=1,
                              retention_bytes=KEEP)
        assert created["ok"], created
        await metadata_everywhere(source, lambda m: "small" in m.topics)
        node = source.live[0]
        src = node.registry.get(group_of(node, "small", 0))
        await partition_leader(source, src.group_id)
        await fill(node, "small", 0, 3)
        meta = await request(node, "metadata")
        await metadata_everywhere(sink, lambda m: "default" in m.topics)
        reply = await admin(sink, "link_create", **{
            **mirror_fields("dr", [node.address], meta["cluster_id"], [["small", "small", 1]]),
            "replicas": 1})
        assert reply["ok"], reply
        sink_node = sink.live[0]
        name = f"__link.{sink_node.transport.identity.cluster_id}.dr"

        async def position() -> int:
            """The position the puller committed on the source (asked of the sink: a sub_get
            on the source writes an entry of its own, and this topic keeps little)."""
            rows = sink_node.topics.links.status()
            return rows[0]["position_reported"] if rows else -1

        last = src.core.high_watermark
        with trio.fail_after(DEADLINE_S):
            while await position() <= last:  # mirrored and committed on the sink
                await trio.sleep(0.05)
        held_at = await position()
        got = await request(node, "sub_get", name=name, topic="small", partition=0,
                            timeout_ms=2000)
        assert got["ok"] and got["subscription"]["position"] == held_at, got
        assert (await admin(sink, "link_alter", name="dr", op="pause"))["ok"]
        with trio.fail_after(DEADLINE_S):
            while sink_node.topics.links.pullers:
                await trio.sleep(0.02)
        await fill(node, "small", 0, 20)
        await settle(src)
        assert 0 < src.log.start_offset <= held_at  # cut up to the link's position, no further
        assert (await admin(sink, "link_alter", name="dr", op="resume"))["ok"]
        last = src.core.high_watermark
        mirror = sink_node.registry.get(group_of(sink_node, "small", 0))
        with trio.fail_after(DEADLINE_S):
            while mirror.core.visible_end < last or await position() <= last:
                await trio.sleep(0.05)
        assert not sink_node.topics.metadata.links["dr"].gaps
        kept = await batches(node, "small", 0)  # the source, from its (held) log start
        assert kept and [b for b in await batches(sink_node, "small", 0)
                         if b[0] >= kept[0][0]] == kept
        await settle(src)
        assert src.log.start_offset > held_at  # released as the link moved on


@trio_test
async def test_a_mirror_grows_when_its_source_topic_grows() -> None:
    """`topic alter orders --partitions 2` on the source: the sink's controller leader sees it
    in the source's metadata, grows the mirror, and the new partition is mirrored too."""
    from raft.node.links import grow
    saved, grow.GROW_CHECK_S = grow.GROW_CHECK_S, 0.05  # the look's period, not a sync
    try:
        async with running_cluster(1) as source, running_cluster(1) as sink:
            await create(source, "orders", 1, 1)
            await all_partitions_led(source, "orders")
            await produce(source, "orders", 0, b"a")
            node = source.live[0]
            meta = await request(node, "metadata")
            await metadata_everywhere(sink, lambda m: "default" in m.topics)
            created = await admin(sink, "link_create", **{
                **mirror_fields("dr", [node.address], meta["cluster_id"],
                                [["orders", "orders", 1]]), "replicas": 1})
            assert created["ok"], created
            await metadata_everywhere(sink, lambda m: "orders" in m.topics)
            grown = await admin(source, "topic_alter", name="orders", partitions=2)
            assert grown["ok"], grown
            await all_partitions_led(source, "orders")
            await produce(source, "orders", 1, b"b")
            want = await batches(node, "orders", 1)
            assert want
            # The grower looks every 0.05 s here and the whole test takes ~0.2 s: 5 s is ample,
            # and is what the mutant that stops the growth costs (DEADLINE_S: 20 s).
            with trio.fail_after(5.0):
                await metadata_everywhere(sink, lambda m: len(m.topics["orders"].partitions) == 2)
                dst = await partition_leader(sink, group_of(sink.live[0], "orders", 1))
                while await batches(dst, "orders", 1) != want:
                    await trio.sleep(0.05)
            [mirror] = (await request(sink.live[0], "metadata", topics=["orders"]))["topics"]
            assert mirror["mirror_active"] and len(mirror["partitions"]) == 2, mirror
    finally:
        grow.GROW_CHECK_S = saved
