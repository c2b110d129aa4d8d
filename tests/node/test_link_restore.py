"""`link create --restore` (raft/cli/link_restore.py) between two in-process clusters, and the
replicated subscriptions' prompt round once a capped mirror moves (raft/node/links/
subscriptions.py).

- A topic that still holds records on the cluster to restore is refused, with what to do;
  so is --prefix (the topic keeps its name).
- An empty leftover (the topic recreated empty, here with another partition count) is
  deleted and the topic recreated from the other cluster's copy: same offsets and bytes,
  promoted, the restore link deleted.
- The survivor's link was not paused: its puller never copies while the restoring cluster's
  topic is gone or short, and follows the restored topic's new writes afterwards.
- A source recreated and written past the mirror's end leaves the mirror `diverged` and
  untouched (on main it copied the new history after the old one).
"""

from __future__ import annotations

import argparse
import contextlib
import io

import trio

from inproc_cluster import DEADLINE_S, running_cluster, trio_test
from raft.cli.link_cmd import describe_link
from raft.cli.link_restore import restore
from raft.client import Client
from raft.node.links.subscriptions import capped
from storage.records import encode_values
from test_links_inproc import batches, mirror_fields
from test_topics_inproc import (admin, all_partitions_led, create, group_of, metadata_everywhere,
                                partition_leader, produce, request)


def test_a_round_is_capped_only_by_a_position_past_the_mirror() -> None:
    rows = [{"name": "app", "position": 9}, {"name": "__link.x.dr", "position": 50}]
    assert capped(rows, 8) and not capped(rows, 9) and not capped([], 0)


def restore_args(source: str, sink: str, **kw: object) -> argparse.Namespace:
    fields = dict(name="back", source=[source], topic=["orders"], prefix="", replicas=1,
                  source_token=None, timeout=DEADLINE_S, no_wait=False,
                  restore_timeout=DEADLINE_S, json=False, servers=sink)
    fields.update(kw)
    return argparse.Namespace(**fields)


async def run_restore(args: argparse.Namespace) -> tuple[int, str]:
    out = io.StringIO()
    async with Client([args.servers], timeout=DEADLINE_S) as sink, \
            Client(args.source, timeout=DEADLINE_S) as source:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = await restore(args, source, sink, await source.cluster_metadata(),
                                 await sink.cluster_metadata(), "", describe_link)
    return code, out.getvalue()


async def same(src_cluster, dst_cluster, topic: str = "orders") -> bool:
    src = await partition_leader(src_cluster, group_of(src_cluster.live[0], topic, 0))
    dst = await partition_leader(dst_cluster, group_of(dst_cluster.live[0], topic, 0))
    want = await batches(src, topic, 0)
    return bool(want) and await batches(dst, topic, 0) == want


async def mirrored_from(a, b) -> None:  # noqa: ANN001
    """A's topic `orders` (1 partition, records a, b, c) mirrored on B by link `dr`, in step."""
    await create(a, "orders", 1, 1)
    await all_partitions_led(a, "orders")
    for value in (b"a", b"b", b"c"):
        await produce(a, "orders", 0, value)
    meta = await request(a.live[0], "metadata")
    await metadata_everywhere(b, lambda m: "default" in m.topics)
    made = await admin(b, "link_create", **{**mirror_fields(
        "dr", [a.live[0].address], meta["cluster_id"], [["orders", "orders", 1]]),
        "replicas": 1})
    assert made["ok"], made
    await metadata_everywhere(b, lambda m: "orders" in m.topics)
    with trio.fail_after(DEADLINE_S):
        while not await same(a, b):
            await trio.sleep(0.05)


@trio_test
async def test_restore_refuses_records_replaces_an_empty_leftover_and_the_survivor_follows() \
        -> None:
    async with running_cluster(1) as a, running_cluster(1) as b:
        await mirrored_from(a, b)
        held = await batches(await partition_leader(b, group_of(b.live[0], "orders", 0)),
                             "orders", 0)
        args = restore_args(b.live[0].address, a.live[0].address)

        code, text = await run_restore(args)  # A still holds its records
        assert code == 1 and "holds records (partition 0 offset" in text, text
        assert "raftlog topic delete orders" in text
        code, text = await run_restore(restore_args(b.live[0].address, a.live[0].address,
                                                    prefix="x."))
        assert code == 1 and "drop --prefix" in text, text

        # A loses the topic; it is recreated empty (another partition count) by someone.
        assert (await admin(a, "topic_delete", name="orders"))["ok"]
        await metadata_everywhere(a, lambda m: "orders" not in m.topics)
        await create(a, "orders", 3, 1)
        await all_partitions_led(a, "orders")
        survivor = b.live[0].topics.links
        code, text = await run_restore(args)
        assert code == 0, text
        assert "deleted the empty topic 'orders'" in text and "restored orders" in text, text
        [topic] = (await request(a.live[0], "metadata", topics=["orders"]))["topics"]
        assert len(topic["partitions"]) == 1 and topic["mirror_active"] is False, topic
        assert not a.live[0].topics.metadata.links  # the restore link is gone
        a0 = await partition_leader(a, group_of(a.live[0], "orders", 0))
        assert await batches(a0, "orders", 0) == held
        # B's link was left active: it never diverged, and follows A's next write.
        assert all(p.state.value != "diverged" for p, _ in survivor.pullers.values())
        with trio.fail_after(DEADLINE_S):
            while True:  # the promote reaching the partition's leader
                leader = await partition_leader(a, group_of(a.live[0], "orders", 0))
                reply = await request(leader, "produce", acks="quorum", timeout_ms=2000,
                                      topic="orders", partition=0,
                                      payload=encode_values([b"d"]), count=1)
                if reply["ok"]:
                    break
                assert reply["error"]["code"] in ("MIRROR_READ_ONLY", "NOT_LEADER"), reply
                await trio.sleep(0.02)
        assert reply["base_offset"] == held[-1][0] + held[-1][1], reply
        with trio.fail_after(DEADLINE_S):
            while not await same(a, b):
                await trio.sleep(0.05)


@trio_test
async def test_a_source_recreated_and_written_again_leaves_the_mirror_diverged_untouched() \
        -> None:
    """A's topic is deleted and recreated, then written past B's mirror's end: B's puller
    copies nothing (the anchor differs), and `link_status` says `diverged` and where to look."""
    async with running_cluster(1) as a, running_cluster(1) as b:
        await mirrored_from(a, b)
        b0 = await partition_leader(b, group_of(b.live[0], "orders", 0))
        held = await batches(b0, "orders", 0)
        assert (await admin(a, "topic_delete", name="orders"))["ok"]
        await metadata_everywhere(a, lambda m: "orders" not in m.topics)
        await create(a, "orders", 1, 1)
        await all_partitions_led(a, "orders")
        for i in range(8):  # another history, past the mirror's end
            await produce(a, "orders", 0, f"new-{i}".encode())

        async def state() -> dict:
            rows = (await request(b0, "link_status"))["partitions"]
            return rows[0] if rows else {}

        with trio.fail_after(DEADLINE_S):
            while (await state()).get("state") != "diverged":
                await trio.sleep(0.05)
        row = await state()
        assert "DR runbook in docs/REPLICATION.md" in row["message"], row
        assert await batches(b0, "orders", 0) == held
