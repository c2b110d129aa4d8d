"""Spark reads a topic of several partitions (issue 26 item 8): at least one Spark partition per
topic partition, every record exactly once with its partition, against the shared 3-node
cluster of real processes."""

from __future__ import annotations

import pytest

from raft.client import BadRequestError, BlockingClient
from raft.protocol.partitioner import partition_for_key
from spark_cluster import Cluster, wait_for
from storage.records import Record

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_reading_a_topic_gives_a_spark_partition_per_topic_partition(spark,
                                                                     cluster: Cluster) -> None:
    with BlockingClient(cluster.servers, timeout=60) as c:
        def create() -> bool:
            # A cluster just started: the controller places replicas once the nodes have
            # registered as live (until then it refuses, naming how many are).
            try:
                c.create_topic("spark-topic", 4, 3)
            except BadRequestError as e:
                if "live active nodes" not in e.message:
                    raise
                return False
            return True

        wait_for(create, "the topic to be created on 3 live nodes")
        sent = c.produce_to_topic([Record(f"v{i}".encode(), f"k{i % 13}".encode())
                                   for i in range(400)], topic="spark-topic")
    for i, (part, _) in enumerate(sent):
        assert part == partition_for_key(f"k{i % 13}".encode(), 4)
    df = (spark.read.format("raftlog").option("servers", cluster.servers)
          .option("topic", "spark-topic").load())
    assert df.rdd.getNumPartitions() >= 4
    rows = df.selectExpr("partition", "offset", "CAST(value AS STRING) AS v").collect()
    assert sorted((r.partition, r.offset) for r in rows) == sorted(sent)
    for part in range(4):
        mine = sorted((r.offset, r.v) for r in rows if r.partition == part)
        want = [f"v{i}" for i, (p, _) in enumerate(sent) if p == part]
        assert [v for _, v in mine] == want  # in offset order = the order produced
    with pytest.raises(Exception, match="no topic 'nope'"):
        (spark.read.format("raftlog").option("servers", cluster.servers)
         .option("topic", "nope").load().collect())


def test_writing_with_a_key_column_partitions_rows_like_the_producer(spark,
                                                                     cluster: Cluster) -> None:
    with BlockingClient(cluster.servers, timeout=60) as c:
        wait_for(lambda: c.create_topic("spark-keyed", 4, 3) and True,
                 "the topic to be created")
    df = spark.range(300, numPartitions=3).selectExpr(
        "concat('k', CAST(id % 17 AS STRING)) AS key", "concat('v', id) AS value")

    def write(load_id: str, **opts: str) -> None:
        w = (df.write.format("raftlog").option("servers", cluster.servers)
             .option("topic", "spark-keyed").option("loadId", load_id).mode("append"))
        for k, v in opts.items():
            w = w.option(k, v)
        w.save()

    write("keyed-1", failOnce="1")  # a task retried: its first attempt's rows never show
    write("keyed-1")  # a re-run of a committed load writes nothing
    got = (spark.read.format("raftlog").option("servers", cluster.servers)
           .option("topic", "spark-keyed").load()
           .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "partition",
                       "offset").collect())
    assert sorted(r.v for r in got) == sorted(f"v{i}" for i in range(300))  # exactly once
    for r in got:
        assert r.partition == partition_for_key(r.k.encode(), 4)
