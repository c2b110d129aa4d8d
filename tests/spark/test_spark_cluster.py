"""Spark against a real 3-node cluster: exactly-once loads, failures, re-runs, leader loss.

Every test writes numbered rows ("<tag>-<i>"), reads back from the offset where it started and
checks the multiset: each of the n rows exactly once, nothing else.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest

from spark_cluster import LOAD_TIMEOUT_MS, Cluster, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def rows(spark, tag: str, n: int, parts: int = 4):
    return spark.range(n, numPartitions=parts).selectExpr(f"concat('{tag}-', id) AS value")


def write(df, cluster: Cluster, load_id: str, **opts) -> None:
    w = (df.write.format("raftlog").option("servers", cluster.servers)
         .option("loadId", load_id).mode("append"))
    for k, v in opts.items():
        w = w.option(k, str(v))
    w.save()


def read_back(spark, cluster: Cluster, start: int, tag: str):
    """Visible rows with our tag from `start` on, via the Spark reader."""
    df = (spark.read.format("raftlog").option("servers", cluster.servers)
          .option("startingOffset", str(start)).load())
    return df.selectExpr("CAST(value AS STRING) AS v", "offset").where(f"v LIKE '{tag}-%'")


def assert_exactly_once(spark, cluster: Cluster, start: int, tag: str, n: int) -> None:
    df = read_back(spark, cluster, start, tag)
    agg = df.selectExpr("count(*) AS c", "count(DISTINCT v) AS d", "count(DISTINCT offset) AS o",
                        f"sum(CAST(substring(v, {len(tag) + 2}) AS BIGINT)) AS s",
                        f"min(CAST(substring(v, {len(tag) + 2}) AS BIGINT)) AS lo",
                        f"max(CAST(substring(v, {len(tag) + 2}) AS BIGINT)) AS hi").first()
    assert (agg.c, agg.d, agg.o) == (n, n, n), f"want {n} rows exactly once, got {agg}"
    assert (agg.lo, agg.hi, agg.s) == (0, n - 1, n * (n - 1) // 2)


def load_state(cluster: Cluster, load_id: str) -> dict | None:
    s = cluster.session()
    try:
        return s.load_status(load_id)
    finally:
        s.close()


def test_million_rows_exactly_once_and_identical_on_every_node(spark, cluster):
    n, tag = 1_000_000, f"m{uuid.uuid4().hex[:6]}"
    start = cluster.stable_offset() + 1
    write(rows(spark, tag, n), cluster, f"load-{tag}", acks="leader")
    assert load_state(cluster, f"load-{tag}")["state"] == "committed"
    assert_exactly_once(spark, cluster, start, tag, n)
    end = cluster.wait_converged() + 1
    views = {i: cluster.read_node(i, start, end) for i in cluster.ids}
    first = views[cluster.ids[0]]
    assert len(first) == n
    for i, v in views.items():
        assert v == first, f"node {i} shows a different log than node {cluster.ids[0]}"


def test_task_failing_once_midway_is_retried_without_duplicates(spark, cluster):
    n, tag = 200_000, f"f{uuid.uuid4().hex[:6]}"
    start = cluster.stable_offset() + 1
    # Partition 1's first attempt stages one batch, then dies; local[2,2] retries it once.
    write(rows(spark, tag, n), cluster, f"load-{tag}", failOnce=1, batchBytes=64 << 10)
    assert_exactly_once(spark, cluster, start, tag, n)
    end = cluster.stable_offset()
    assert end - start + 1 > n, "the failed attempt's staged batch should occupy log offsets"


def test_failed_job_is_invisible_and_rerun_succeeds(spark, cluster):
    n, tag = 100_000, f"x{uuid.uuid4().hex[:6]}"
    load_id = f"load-{tag}"
    start = cluster.stable_offset() + 1
    with pytest.raises(Exception, match="test-only failure"):
        write(rows(spark, tag, n), cluster, load_id, failAlways=0, batchBytes=64 << 10)
    assert load_state(cluster, load_id)["state"] == "aborted"
    assert read_back(spark, cluster, start, tag).count() == 0
    # The aborted load does not hold back the stable offset.
    assert cluster.stable_offset() >= start
    write(rows(spark, tag, n), cluster, load_id)
    assert_exactly_once(spark, cluster, start, tag, n)


def test_rerun_of_committed_load_writes_nothing(spark, cluster):
    n, tag = 50_000, f"r{uuid.uuid4().hex[:6]}"
    start = cluster.stable_offset() + 1
    write(rows(spark, tag, n), cluster, f"load-{tag}")
    before = cluster.session().status()["dirty_offset"]
    write(rows(spark, tag, n), cluster, f"load-{tag}")
    after = cluster.session().status()["dirty_offset"]
    assert after == before, "a re-run of a committed load must append nothing"
    assert_exactly_once(spark, cluster, start, tag, n)


def test_leader_killed_during_load(spark, cluster):
    n, tag = 300_000, f"k{uuid.uuid4().hex[:6]}"
    load_id = f"load-{tag}"
    start = cluster.stable_offset() + 1
    df = rows(spark, tag, n)
    outcome: dict[str, object] = {}

    def job() -> None:
        # A Python thread maps to its own JVM thread, which has no active SparkSession: the
        # data source lookup would then miss the registration made on `spark`.
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        try:
            write(df, cluster, load_id, batchBytes=32 << 10, acks="leader")
            outcome["ok"] = True
        except Exception as e:  # noqa: BLE001 (either outcome is allowed; checked below)
            outcome["error"] = e

    t = threading.Thread(target=job)
    t.start()
    try:
        # Kill the leader once staged data is flowing.
        wait_for(lambda: (load_state(cluster, load_id) or {}).get("state") == "open"
                 and cluster.session().status()["dirty_offset"] > start + 5000,
                 "the load to be staging", timeout=120, interval=0.05)
        old = cluster.leader()
        cluster.kill(old)
        cluster.wait_leader()
        cluster.start(old)
    finally:
        t.join(timeout=300)
    assert not t.is_alive(), "the load job hung after the leader was killed"
    if "error" in outcome:
        # A clean failure: nothing visible, and a re-run with the same loadId succeeds.
        assert read_back(spark, cluster, start, tag).count() == 0
        write(df, cluster, load_id)
    assert load_state(cluster, load_id)["state"] == "committed"
    assert_exactly_once(spark, cluster, start, tag, n)
    cluster.wait_converged()


def test_open_load_times_out_and_stops_holding_back_readers(cluster):
    load_id = f"stale-{uuid.uuid4().hex[:6]}"
    s = cluster.session()
    try:
        load = s.load_begin(load_id)
        assert load["state"] == "open"
        assert cluster.stable_offset() < load["gen"], "an open load bounds the stable offset"
        wait_for(lambda: s.load_status(load_id)["state"] == "aborted",
                 "the leader to abort the idle load", timeout=LOAD_TIMEOUT_MS / 1000 + 60)
        assert "no activity" in s.load_status(load_id)["reason"]
        assert cluster.stable_offset() >= load["gen"]
    finally:
        s.close()


def test_wrong_columns_are_named(spark, cluster):
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value", "id AS extra", "1 AS other")
    with pytest.raises(Exception, match="'extra', 'other'"):
        write(df, cluster, f"bad-{uuid.uuid4().hex[:6]}")


def test_keys_headers_and_offsets_round_trip(spark, cluster):
    tag = f"h{uuid.uuid4().hex[:6]}"
    start = cluster.stable_offset() + 1
    df = spark.createDataFrame(
        [(f"{tag}-0", b"k0", [("h", b"1")]), (f"{tag}-1", None, None)],
        "value string, key binary, headers array<struct<key: string, value: binary>>")
    write(df.coalesce(1), cluster, f"load-{tag}")
    got = (spark.read.format("raftlog").option("servers", cluster.servers)
           .option("startingOffset", str(start)).load()
           .selectExpr("CAST(value AS STRING) AS v", "key", "headers", "offset", "timestamp")
           .where(f"v LIKE '{tag}-%'").orderBy("offset").collect())
    assert [r.v for r in got] == [f"{tag}-0", f"{tag}-1"]
    assert got[0].key == bytearray(b"k0") and got[1].key is None
    assert [(h.key, bytes(h.value)) for h in got[0].headers] == [("h", b"1")]
    assert got[1].headers is None
    assert got[1].offset == got[0].offset + 1 and got[0].timestamp is not None
    counts = Counter(r.v for r in got)
    assert set(counts.values()) == {1}
