"""The /metrics of a node of K > 1 shards (raft/node/shard_metrics.py, docs/SHARDS.md): every
series carries a `shard` label, the node's address (shard 0) serves every shard's series and
the node's totals (`shard="node"`): counters and histogram buckets summed, counting gauges
summed, flag gauges maxed, other gauges without a total; a shard that does not answer is
`raftlog_shard_up 0` and out of the totals. In one process, over real HTTP."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from raft.node.shard_metrics import shard_registry


def shard(requests: int, groups: int, term: int, lag: float, flushes: list[float]
          ) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    Counter("raftlog_requests", "r", ["type"], registry=reg).labels("produce").inc(requests)
    Gauge("raftlog_groups", "g", registry=reg).set(groups)
    Gauge("raftlog_term", "t", registry=reg).set(term)
    Gauge("raftlog_event_loop_lag_window_max_seconds", "l", registry=reg).set(lag)
    h = Histogram("raftlog_fsync_latency_seconds", "f", buckets=(0.001, 0.01), registry=reg)
    for x in flushes:
        h.observe(x)
    return reg


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(got: dict, name: str, **labels: Any) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


def test_the_node_address_serves_every_shard_labelled_and_the_totals() -> None:
    one = shard(5, 3, 7, 0.002, [0.0005, 0.005])
    server, _ = start_http_server(0, addr="127.0.0.1", registry=shard_registry(one, 1))
    try:
        other = f"127.0.0.1:{server.server_port}"
        zero = shard(10, 2, 4, 0.010, [0.0005])
        got = samples(generate_latest(shard_registry(zero, 0, {1: other})).decode())
        assert all("shard" in labels for (_, pairs) in got for labels in [dict(pairs)]), got
        assert value(got, "raftlog_requests_total", type="produce", shard="0") == 10
        assert value(got, "raftlog_requests_total", type="produce", shard="1") == 5
        assert value(got, "raftlog_requests_total", type="produce", shard="node") == 15
        assert value(got, "raftlog_groups", shard="node") == 5
        assert value(got, "raftlog_event_loop_lag_window_max_seconds", shard="node") == 0.010
        assert value(got, "raftlog_fsync_latency_seconds_bucket", le="0.001", shard="node") == 2
        assert value(got, "raftlog_fsync_latency_seconds_count", shard="node") == 3
        assert value(got, "raftlog_term", shard="1") == 7
        assert value(got, "raftlog_term", shard="node") is None  # no total for a term
        assert value(got, "raftlog_shard_up", shard="1") == 1

        # Shard 1's own address: its series only, labelled.
        own = samples(generate_latest(shard_registry(one, 1)).decode())
        assert value(own, "raftlog_requests_total", type="produce", shard="1") == 5
        assert not any(dict(pairs).get("shard") == "node" for _, pairs in own)
    finally:
        server.shutdown()
        server.server_close()
    # Shard 1 down: shard_up 0, the totals are shard 0's alone.
    got = samples(generate_latest(shard_registry(zero, 0, {1: other})).decode())
    assert value(got, "raftlog_shard_up", shard="1") == 0
    assert value(got, "raftlog_requests_total", type="produce", shard="node") == 10
    assert value(got, "raftlog_requests_total", type="produce", shard="1") is None
