"""A mirror partition on in-process nodes (issue 30, docs/REPLICATION.md): a translated group fed
MIRRORED batches with gaps through `RaftGroup.append_mirrored` (the link runtime's call), read by
visible offsets over the wire from the start, the middle of a batch and inside a gap; client
writes refused while a link feeds it, then continuing the visible offsets once promoted;
subscriptions committing and lagging in visible offsets; a retention cut that keeps the visible
end. Waiting is on conditions under trio.fail_after deadlines, never on sleeps alone."""

from __future__ import annotations

from typing import Any

import trio

from inproc_cluster import (DEADLINE_S, Cluster, RawClient, fetched_values, running_cluster,
                            trio_test, values_payload)
from raft.core.retention import RetentionPolicy
from raft.core.types import ErrorCode, Role
from raft.node.server import Node
from storage.memory import MemoryLog
from storage.mirrored import MIRROR_SECTION
from storage.records import encode_values

GROUP = 201  # far above what the controller allocates (its reconciler leaves it alone)
VOTERS = [1, 2, 3]
REFUSAL = "topic 't' is a mirror fed by link 'l'; run `raftlog topic promote t` to write to it"
# The source's batches: (visible base, count); gaps at 5..9, 14..19.
SOURCE = [(0, 3), (3, 2), (10, 3), (13, 1), (20, 2)]


def source_batch(base: int, count: int) -> dict[str, Any]:
    values = [f"m{base + k}".encode() for k in range(count)]
    return {"base_offset": base, "count": count, "timestamp_ms": 5000 + base,
            "payload": encode_values(values)}


async def mirror_leader(cluster: Cluster) -> Node:
    with trio.fail_after(DEADLINE_S):
        while True:
            leaders = [n for n in cluster.live
                       if n.registry.get(GROUP).core.role == Role.LEADER]
            if len(leaders) == 1:
                return leaders[0]
            await trio.sleep(0.02)


async def until(cond: Any) -> None:
    with trio.fail_after(DEADLINE_S):
        while not cond():
            await trio.sleep(0.02)


async def fetch(client: RawClient, offset: int, **kw: Any) -> dict[str, Any]:
    return await client.request("fetch", offset=offset, max_bytes=kw.pop("max_bytes", 1 << 20),
                                max_wait_ms=0, group=GROUP, **kw)


@trio_test
async def test_a_mirror_partition_speaks_visible_offsets() -> None:
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        for node in cluster.nodes:
            g = await node.add_group(GROUP, VOTERS, MemoryLog(), translated=True)
            g.write_refusal = REFUSAL
        leader = await mirror_leader(cluster)
        group = leader.registry.get(GROUP)
        assert group.translated

        # The link appends; a retry of what is there is refused with where to resume.
        got = await group.append_mirrored([source_batch(*s) for s in SOURCE], 5.0)
        assert (got.error, got.appended, got.visible_end) == (ErrorCode.OK, 5, 21)
        again = await group.append_mirrored([source_batch(*s) for s in SOURCE[:2]], 5.0)
        assert (again.error, again.appended, again.visible_end) == \
            (ErrorCode.MIRROR_POSITION, 0, 21)
        mixed = await group.append_mirrored([source_batch(22, 1), source_batch(21, 1),
                                             source_batch(23, 1)], 5.0)
        # It stops at the first refused batch: nothing after it is placed (no false gap).
        assert (mixed.error, mixed.appended, mixed.visible_end) == \
            (ErrorCode.MIRROR_POSITION, 1, 22)
        await until(lambda: all(n.registry.get(GROUP).core.visible_end == 22
                                for n in cluster.nodes))
        commit = group.core.commit_index
        await until(lambda: all(n.registry.get(GROUP).core.commit_index >= commit
                                for n in cluster.nodes))

        client = await RawClient.connect(leader.address)
        try:
            # From the start, from the middle of a batch, from inside a gap.
            for offset, first in ((0, 0), (4, 3), (6, 10), (14, 20), (21, 20), (22, 22)):
                r = await fetch(client, offset)
                assert r["ok"], r
                assert r["batches"][0]["base_offset"] == first
                assert r["high_watermark"] == 22 and r["start_offset"] == 0
            r = await fetch(client, 0)
            assert [(b["base_offset"], b["count"]) for b in r["batches"]] == \
                [*SOURCE, (22, 1)]
            assert r["next_offset"] == 23
            assert fetched_values(r)[:4] == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"m3")]
            assert r["batches"][2]["timestamp_ms"] == 5010
            small = await fetch(client, 0, max_bytes=1)
            assert len(small["batches"]) == 1 and small["next_offset"] == 3
            nothing = await fetch(client, 23)
            assert nothing["ok"] and nothing["batches"] == [] and nothing["next_offset"] == 23
            out = await fetch(client, 24)
            assert out["error"]["code"] == "OFFSET_OUT_OF_RANGE"

            # While a link feeds it: no client writes, and the answer says what to run.
            w = await client.request("produce", payload=values_payload([b"x"]), count=1,
                                     group=GROUP)
            assert w["error"]["code"] == "MIRROR_READ_ONLY"
            assert "raftlog topic promote t" in w["error"]["message"]
            # Promoted: a produce continues the visible offsets.
            for node in cluster.nodes:
                node.registry.get(GROUP).write_refusal = None
            w = await client.request("produce", payload=values_payload([b"p0", b"p1"]),
                                     count=2, group=GROUP, acks="quorum")
            assert w["ok"], w
            assert (w["base_offset"], w["last_offset"]) == (23, 24)
            r = await fetch(client, 23)
            assert fetched_values(r) == [(23, b"p0"), (24, b"p1")]
            assert r["high_watermark"] == 24
            # Spark loads are refused on a mirror for now.
            load = await client.request("load_begin", load_id="l1", group=GROUP)
            assert load["error"]["code"] == "BAD_REQUEST" and "mirror" in \
                load["error"]["message"]

            # Subscriptions: positions, bounds and lag in visible offsets.
            opened = await client.request("sub_open", name="s", consumer="c", group=GROUP,
                                          **{"from": "start"})
            assert opened["ok"] and opened["subscription"]["position"] == 0, opened
            ok = await client.request("sub_commit", name="s", consumer="c", position=11,
                                      group=GROUP)
            assert ok["ok"], ok
            past = await client.request("sub_commit", name="s", consumer="c", position=26,
                                        group=GROUP)
            assert past["error"]["code"] == "POSITION_PAST_HIGH_WATERMARK"
            view = await client.request("sub_get", name="s", group=GROUP)
            sub = view["subscription"]
            assert view["high_watermark"] == 24
            assert sub["lag_offsets"] == 25 - 11
            # 11..12, 13, 20..21, 22, 23..24: the records it has not read (gaps hold none).
            assert sub["lag_records"] == 8
            at_end = await client.request("sub_open", name="tail", consumer="c", group=GROUP,
                                          **{"from": "end"})
            assert at_end["ok"], at_end["error"]
            assert at_end["subscription"]["position"] == 25

            # A retention cut: the log start moves, the visible end stays, and reads answer in
            # visible offsets from the visible start.
            log = group.log
            group.retention._policy_of = lambda: RetentionPolicy(max_bytes=1, valve_age_ms=1)
            await group.retention.step()
            assert log.start_offset > 0
            assert group.core.visible_end == 24
            assert log.snapshot["sections"][MIRROR_SECTION] >= 13
            start = log.snapshot["sections"][MIRROR_SECTION] + 1
            r = await fetch(client, 0)
            assert r["error"]["code"] == "OFFSET_OUT_OF_RANGE"
            assert r["error"]["start_offset"] == start
            r = await fetch(client, start)
            assert r["ok"] and r["start_offset"] == start and r["high_watermark"] == 24
            assert [b["base_offset"] for b in r["batches"]] == [b for b in (23,) if b >= start]
            again = await group.append_mirrored([source_batch(24, 1)], 5.0)
            assert (again.error, again.visible_end) == (ErrorCode.MIRROR_POSITION, 24)
        finally:
            await client.aclose()


@trio_test
async def test_a_plain_groups_offsets_are_unchanged_and_it_refuses_mirrored_appends() -> None:
    async with running_cluster(1) as cluster:
        leader = await cluster.wait_leader()
        g = await leader.add_group(GROUP, [1], MemoryLog())
        await mirror_leader(cluster)
        assert not g.translated
        got = await g.append_mirrored([source_batch(0, 1)], 5.0)
        assert got.error == ErrorCode.BAD_REQUEST and got.appended == 0
        client = await RawClient.connect(leader.address)
        try:
            w = await client.request("produce", payload=values_payload([b"a"]), count=1,
                                     group=GROUP, acks="quorum")
            assert w["ok"] and w["base_offset"] == g.core.commit_index
            r = await fetch(client, w["base_offset"])
            assert fetched_values(r) == [(w["base_offset"], b"a")]
        finally:
            await client.aclose()
