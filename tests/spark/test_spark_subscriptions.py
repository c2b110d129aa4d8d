"""Incremental Spark reads through a subscription (sparkio/incremental.py), against one real
node: two successful reads in a row see every record exactly once; a failed job's range is read
again, whole, by the next read; the plain reader option commits the same way."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

import sparkio
from sparkio.staging import RaftlogError

pytestmark = pytest.mark.spark


def _produce(single_node, values: list[str]) -> None:
    from storage.records import encode_values

    s = single_node.session()
    try:
        s.call({"t": "produce", "payload": encode_values([v.encode() for v in values]),
                "count": len(values), "acks": "quorum"})
    finally:
        s.close()


def _values(df) -> list[str]:
    return [r.v for r in df.selectExpr("CAST(value AS STRING) AS v").collect()]


def _mine(values: list[str], tag: str) -> list[str]:
    return [v for v in values if v.startswith(tag + "-")]


def test_incremental_reads_exactly_once_and_failed_job_rereads(spark, single_node) -> None:
    tag = f"i{uuid.uuid4().hex[:6]}"
    name = f"etl-{tag}"
    _produce(single_node, [f"{tag}-{i}" for i in range(500)])
    # First use places the subscription at the end: only what comes after is read.
    first = sparkio.read_subscription(spark, single_node.servers, name, starting_offset="latest")
    assert _values(first) == []
    sparkio.commit(first)

    _produce(single_node, [f"{tag}-{i}" for i in range(500, 1500)])
    df1 = sparkio.read_subscription(spark, single_node.servers, name, numPartitions=3)
    got1 = _mine(_values(df1), tag)
    _produce(single_node, [f"{tag}-{i}" for i in range(1500, 1600)])  # after planning
    assert sorted(_mine(_values(df1), tag)) == sorted(got1)  # a re-plan reads the same range
    assert sparkio.commit(df1) > 0

    _produce(single_node, [f"{tag}-{i}" for i in range(1600, 2000)])
    df2 = sparkio.read_subscription(spark, single_node.servers, name)
    got2 = _mine(_values(df2), tag)
    sparkio.commit(df2)
    both = Counter(got1 + got2)
    assert both == Counter(f"{tag}-{i}" for i in range(500, 2000))  # each exactly once

    # A job that fails: nothing is committed, and the next read covers the same range.
    _produce(single_node, [f"{tag}-{i}" for i in range(2000, 2300)])
    df3 = sparkio.read_subscription(spark, single_node.servers, name)

    def explode(rows) -> None:  # noqa: ANN001
        for _ in rows:
            raise RuntimeError("test-only job failure")

    with pytest.raises(Exception, match="test-only job failure"):
        df3.foreachPartition(explode)
    _produce(single_node, [f"{tag}-{i}" for i in range(2300, 2400)])  # joins the next range
    df4 = sparkio.read_subscription(spark, single_node.servers, name)
    got4 = _mine(_values(df4), tag)
    assert sorted(got4) == sorted(f"{tag}-{i}" for i in range(2000, 2300))
    sparkio.commit(df4)
    sparkio.commit(df4)  # twice: harmless
    df5 = sparkio.read_subscription(spark, single_node.servers, name)
    assert sorted(_mine(_values(df5), tag)) == sorted(f"{tag}-{i}" for i in range(2300, 2400))
    sparkio.commit(df5)


def test_reader_option_and_commit_by_name(spark, single_node) -> None:
    tag = f"o{uuid.uuid4().hex[:6]}"
    name = f"opt-{tag}"
    start = single_node.stable_offset() + 1
    _produce(single_node, [f"{tag}-{i}" for i in range(100)])

    def read():  # noqa: ANN202
        return (spark.read.format("raftlog").option("servers", single_node.servers)
                .option("subscription", name).option("startingOffset", str(start)).load())

    assert sorted(_mine(_values(read()), tag)) == sorted(f"{tag}-{i}" for i in range(100))
    # Not committed yet: the same range again, even with new records in the log.
    _produce(single_node, [f"{tag}-{i}" for i in range(100, 150)])
    assert len(_mine(_values(read()), tag)) == 100
    sparkio.commit(servers=single_node.servers, subscription=name)
    assert sorted(_mine(_values(read()), tag)) == sorted(f"{tag}-{i}" for i in range(100, 150))
    sparkio.commit(servers=single_node.servers, subscription=name)
    with pytest.raises(Exception, match="endingOffset does not combine"):
        (spark.read.format("raftlog").option("servers", single_node.servers)
         .option("subscription", name).option("endingOffset", "5").load().collect())
    with pytest.raises(ValueError, match="not made by sparkio.read_subscription"):
        sparkio.commit(read())
    with pytest.raises(RaftlogError, match="INVALID_SUBSCRIPTION_NAME"):
        sparkio.commit(servers=single_node.servers, subscription="bad name")
