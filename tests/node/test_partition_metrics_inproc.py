"""Per-partition metrics (issue 26 item 10), in process: a scrape shows, per partition this node
runs, series labelled topic and partition (high watermark, leader; on the leader the commit lag
and each follower's flushed lag), read at scrape time, and caps them at
`partition_series_max` partitions (raftlog_partition_series_left_out counts the rest)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inproc_cluster import running_cluster, trio_test
from test_topic_settings_inproc import create, fill
from test_topics_inproc import group_of, partition_leader


def scrape(node) -> dict[tuple[str, tuple], float]:
    text = generate_latest(node.metrics.registry).decode()  # on the trio thread: reads state
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@trio_test
async def test_a_scrape_shows_capped_series_per_topic_and_partition() -> None:
    async with running_cluster(3) as cluster:
        await create(cluster, "m", 3, replicas=3)
        node = cluster.live[0]
        leaders = {}
        for partition in range(3):
            leader = await partition_leader(cluster, group_of(node, "m", partition))
            await fill(leader, "m", partition, partition + 1)  # hw = partition
            leaders[partition] = leader
        led = leaders[0]
        gid = group_of(led, "m", 0)
        core = led.registry.get(gid).core
        samples = scrape(led)
        key = (("partition", "0"), ("topic", "m"))
        assert samples[("raftlog_partition_high_watermark", key)] == core.high_watermark
        assert samples[("raftlog_partition_leader", key)] == led.node_id
        assert samples[("raftlog_partition_commit_lag_offsets", key)] == (
            led.registry.get(gid).log.dirty_offset - core.commit_index)
        followers = sorted({1, 2, 3} - {led.node_id})
        for f in followers:
            lag = samples[("raftlog_partition_follower_flushed_lag_offsets",
                           (("follower", str(f)), *key))]
            assert lag >= 0
        # Every partition this node runs has its high watermark, the default topic's too.
        for partition in range(3):
            k = (("partition", str(partition)), ("topic", "m"))
            assert ("raftlog_partition_leader", k) in samples
        assert ("raftlog_partition_high_watermark",
                (("partition", "0"), ("topic", "default"))) in samples
        assert samples[("raftlog_partition_series_left_out", ())] == 0

        led.metrics.partition_series_max = 2  # the cap: 4 partitions here (m 0-2, default)
        samples = scrape(led)
        shown = {dict(k)["topic"] + "/" + dict(k)["partition"]
                 for (name, k) in samples if name == "raftlog_partition_high_watermark"}
        assert len(shown) == 2, shown
        led_here = {f"{t}/{i}" for t, i in (("m", 0), ("m", 1), ("m", 2), ("default", 0))
                    if (led.registry.get(group_of(led, t, i)).core.leader_id == led.node_id)}
        assert shown <= led_here or led_here <= shown, (shown, led_here)  # leaders first
        assert samples[("raftlog_partition_series_left_out", ())] == 2
