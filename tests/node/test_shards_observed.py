"""What an operator sees of a node of 2 shard processes (issue 27, docs/SHARDS.md "Status and
metrics"), on real processes: a scrape of the node's metrics address gives every shard's
series, each with a `shard` label, and the node's totals (`shard="node"`: the sum of the
shards' counters); shard 0's `status` has each shard's figures (partitions, leaderships,
groups, CPU, memory, loop lag) and the node's totals, and `raftlog status` prints them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raft.cli.localcluster import LocalCluster, free_ports, wait_for
from raft.cli.status import partition_summary
from raft.node.shard_metrics import scrape_text
from test_shards_processes import admin_create, partition_addresses, produce, shards_of
from test_topics_processes import call

pytestmark = pytest.mark.slow


def scrape(address: str) -> list:
    return [s for fam in text_string_to_metric_families(scrape_text(address))
            for s in fam.samples]


def total(samples: list, name: str, shard: str) -> float:
    return sum(s.value for s in samples if s.name == name and s.labels.get("shard") == shard)


def test_metrics_and_status_of_a_two_shard_node(tmp_path: Path) -> None:
    mport = free_ports(2, consecutive=True)[0]
    metrics = f"127.0.0.1:{mport}"
    with LocalCluster(tmp_path, nodes=1, shards=2,
                      extra_args=["--metrics-listen", metrics]) as cluster:
        cluster.wait_leader(timeout=120)
        base = cluster.addresses[1]
        assert admin_create(base, "orders", 4, 1)["ok"]
        placed = shards_of(call(base, "metadata"), "orders")
        assert sorted(placed.values()) == [0, 0, 1, 1], placed
        wait_for(lambda: all(p[0] for p in partition_addresses(call(base, "metadata"),
                                                                 "orders").values()),
                 "every partition to have a leader", 60)
        where = partition_addresses(call(base, "metadata"), "orders")
        for p in range(4):  # requests on both shards
            produce(where[p], "orders", p, b"v")

        def both_counted() -> bool:
            got = scrape(metrics)
            return all(total(got, "raftlog_produce_requests_total", str(k)) >= 2
                       for k in (0, 1))

        wait_for(both_counted, "both shards' produce requests in the node's scrape", 60)
        got = scrape(metrics)
        assert all("shard" in s.labels for s in got), [s for s in got if "shard" not in s.labels]
        assert {s.labels["shard"] for s in got} == {"0", "1", "node"}
        for name in ("raftlog_requests_total", "raftlog_produce_requests_total",
                     "process_cpu_seconds_total", "raftlog_groups"):
            assert total(got, name, "node") == pytest.approx(
                total(got, name, "0") + total(got, name, "1")), name
        assert total(got, "raftlog_shard_up", "1") == 1
        info = {s.labels["shard"] for s in got if s.name == "raftlog_shard_info"}
        assert info == {"0", "1"}
        # Shard 1's own address: its series only, labelled shard 1.
        own = scrape(f"127.0.0.1:{mport + 1}")
        assert {s.labels.get("shard") for s in own} == {"1"}

        def reported() -> bool:
            # Shard 1 reports once a second: its first report may predate its partitions'
            # elections (at load, CI saw `leading` 0 there), so wait for one showing them led.
            st = call(base, "status")["status"]
            return all(s["reported"] for s in st["node_shards"]) and \
                [s["leading"] for s in st["node_shards"]] == [3, 2]

        wait_for(reported, "shard 1 to report its figures, its partitions led, to shard 0", 30)
        st = call(base, "status")["status"]
        lines, totals = st["node_shards"], st["node_totals"]
        assert [(s["shard"], s["partitions"], s["leading"]) for s in lines] == \
            [(0, 3, 3), (1, 2, 2)], lines
        assert all(s["cpu_seconds"] > 0 and s["rss_bytes"] > 0 and s["groups"] >= 2
                   for s in lines), lines
        assert totals["shards"] == 2 and totals["partitions"] == 5 and totals["leading"] == 5
        assert totals["groups"] == sum(s["groups"] for s in lines)
        # The node's partition lines count every shard's: shard 1's from its reports.
        assert sorted((p["partition"], p["shard"], p["role"]) for p in st["shard_partitions"]) \
            == sorted((p, 1, "leader") for p, s in placed.items() if s == 1)
        assert partition_summary(st) == {"replicas": 5, "leading": 5, "following": 0,
                                         "without_leader": 0, "topics": ["default", "orders"]}
        assert totals["cpu_seconds"] == pytest.approx(sum(s["cpu_seconds"] for s in lines),
                                                      abs=0.02)
        shown = subprocess.run([sys.executable, "-m", "raft.cli", "status", "--servers", base],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        assert "shards per node" in shown.stdout and "all" in shown.stdout, shown.stdout
