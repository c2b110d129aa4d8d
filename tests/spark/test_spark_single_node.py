"""The Spark writer and reader against one real Node (the real core, one voter)
(tests/spark/solo_node.py): the Spark-side contract (schema, task retries, re-runs, the CLI) and
the node's load hooks, checked quickly. Replication and leader loss are test_spark_cluster.py's
job."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.spark


def _write(df, servers: str, load_id: str, **opts) -> None:
    w = df.write.format("raftlog").option("servers", servers).option("loadId", load_id)
    for k, v in opts.items():
        w = w.option(k, str(v))
    w.mode("append").save()


def _values(spark, servers: str, start: int, tag: str) -> list[str]:
    df = (spark.read.format("raftlog").option("servers", servers)
          .option("startingOffset", str(start)).load())
    return [r.v for r in df.selectExpr("CAST(value AS STRING) AS v").collect()
            if r.v.startswith(tag + "-")]


def test_fail_once_rerun_and_schema_errors(spark, single_node):
    tag = f"s{uuid.uuid4().hex[:6]}"
    n = 20_000
    df = spark.range(n, numPartitions=3).selectExpr(f"concat('{tag}-', id) AS value")
    start = single_node.stable_offset() + 1
    _write(df, single_node.servers, f"load-{tag}", failOnce=2, batchBytes=16 << 10)
    got = _values(spark, single_node.servers, start, tag)
    assert sorted(got) == sorted(f"{tag}-{i}" for i in range(n))
    before = single_node.stable_offset()
    _write(df, single_node.servers, f"load-{tag}")  # same loadId: a no-op
    assert single_node.stable_offset() == before
    bad = spark.range(2).selectExpr("CAST(id AS STRING) AS value", "id AS extra")
    with pytest.raises(Exception, match="'extra'"):
        _write(bad, single_node.servers, f"bad-{tag}")


def test_failed_job_invisible_then_rerun(spark, single_node):
    tag = f"a{uuid.uuid4().hex[:6]}"
    n = 10_000
    df = spark.range(n, numPartitions=2).selectExpr(f"concat('{tag}-', id) AS value")
    start = single_node.stable_offset() + 1
    with pytest.raises(Exception, match="test-only failure"):
        _write(df, single_node.servers, f"load-{tag}", failAlways=1, batchBytes=16 << 10)
    assert _values(spark, single_node.servers, start, tag) == []
    _write(df, single_node.servers, f"load-{tag}")
    assert sorted(_values(spark, single_node.servers, start, tag)) == \
        sorted(f"{tag}-{i}" for i in range(n))


def test_cli_load_parquet_and_csv(spark, single_node, tmp_path, capsys):
    import argparse

    from sparkio import cli

    tag = f"c{uuid.uuid4().hex[:6]}"
    pq = str(tmp_path / "in.parquet")
    spark.range(1000, numPartitions=2).selectExpr(f"concat('{tag}-', id) AS value") \
        .write.parquet(pq)
    csv = tmp_path / "in.csv"
    csv.write_text("name,n\n" + "".join(f"{tag}x,{i}\n" for i in range(10)))
    parser = argparse.ArgumentParser(prog="raftlog")
    cli.register(parser.add_subparsers())
    start = single_node.stable_offset() + 1
    args = parser.parse_args(["load", "--servers", single_node.servers, "--input", pq,
                              "--format", "parquet", "--load-id", f"cli-{tag}"])
    assert args.func(args) == 0
    assert "committed rows=1000" in capsys.readouterr().err
    assert sorted(_values(spark, single_node.servers, start, tag)) == \
        sorted(f"{tag}-{i}" for i in range(1000))
    # Same load id again: nothing new.
    before = single_node.stable_offset()
    assert args.func(args) == 0
    assert single_node.stable_offset() == before
    # CSV with other columns: one JSON value per row, the columns' types kept (n is a number).
    args = parser.parse_args(["load", "--servers", single_node.servers, "--input", str(csv),
                              "--format", "csv", "--csv-header"])
    assert args.func(args) == 0
    df = (spark.read.format("raftlog").option("servers", single_node.servers)
          .option("startingOffset", str(before + 1)).load())
    vals = [r.v for r in df.selectExpr("CAST(value AS STRING) AS v").collect()]
    assert sorted(vals) == sorted(f'{{"name":"{tag}x","n":{i}}}' for i in range(10))
    assert args.func(parser.parse_args(["load", "--servers", single_node.servers, "--input",
                                        str(tmp_path / "missing"), "--format", "csv"])) == 2


def test_idle_load_is_aborted_by_the_leader_tick(tmp_path):
    from spark_cluster import SingleNode, wait_for

    node = SingleNode(tmp_path, load_timeout_ms=500)
    s = node.session()
    try:
        load = s.load_begin("idle")
        assert load["state"] == "open" and node.stable_offset() == load["gen"] - 1
        wait_for(lambda: s.load_status("idle")["state"] == "aborted",
                 "the node to abort the idle load", timeout=30)
        assert "no activity" in s.load_status("idle")["reason"]
        assert node.stable_offset() >= load["gen"]
    finally:
        s.close()
        node.stop()
