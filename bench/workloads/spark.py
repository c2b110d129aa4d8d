"""`spark`: bulk-load throughput of the sparkio writer (exactly-once staged loads).

One cached DataFrame of 100-byte rows is written to Spark's `noop` sink (the ceiling: Spark's
own cost of producing and shipping Arrow batches to Python) and then to raftlog with leader and
quorum acks, in the same run, on local[*]. rows/s and MB/s cover the whole job: load_begin,
staging, the driver's load_commit (so a load is only counted once it is visible).
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from bench.disk import DiskNeed
from bench.harness import Cluster
from bench.results import figure
from bench.workloads.common import MB, Ctx

ROW_BYTES = 100
TARGET_RPS = 1_000_000.0
MODES = ("noop", "leader", "quorum")


def _rows(quick: bool) -> int:
    return 1_000_000 if quick else 4_000_000


def disk_need(ctx_cfg) -> DiskNeed:  # noqa: ANN001
    # An open load's staged batches are never deleted (docs/RETENTION.md): a node keeps one
    # whole load, with the records' framing (half as much again for 100-byte rows).
    return DiskNeed(keep_bytes=_rows(ctx_cfg.quick) * ROW_BYTES * 3 // 2,
                    why="one whole staged load, which retention never deletes while it is open")


def steps(ctx_cfg) -> int:  # noqa: ANN001
    return len(MODES) * ctx_cfg.repeats


def run(ctx: Ctx) -> tuple[list[dict], dict]:
    from pyspark.sql import SparkSession

    import sparkio

    cfg = ctx.cfg
    n = _rows(cfg.quick)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[*]").appName("raftlog bench spark")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sparkio.register(spark)
    parts = max(2, spark.sparkContext.defaultParallelism)
    df = spark.range(n, numPartitions=parts).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {ROW_BYTES}, 'x') AS BINARY) AS value").cache()
    df.count()  # materialise: every mode writes the same cached rows
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    elections = {m: 0 for m in MODES}  # term changes while each mode ran (should stay 0)
    try:
        with ctx.cluster() as cluster:
            cluster.wait_for_leader()
            servers = ",".join(cluster.addrs)
            # Warm up: start Spark's Python workers and the connections once, unmeasured.
            (spark.range(10_000, numPartitions=parts).selectExpr("CAST(id AS STRING) AS value")
             .write.format("raftlog").option("servers", servers).mode("append").save())
            term = _max_term(cluster)
            for r in range(cfg.repeats):
                for mode in MODES:
                    ctx.describe(f"spark load {mode} {n:,} rows (repeat {r + 1})")
                    cluster.wait_caught_up()
                    t0 = time.perf_counter()
                    if mode == "noop":
                        df.write.format("noop").mode("append").save()
                    else:
                        (df.write.format("raftlog").option("servers", servers)
                         .option("acks", mode).option("loadId", f"bench-{uuid.uuid4()}")
                         .mode("append").save())
                    samples[mode].append(n / (time.perf_counter() - t0))
                    elections[mode] += _max_term(cluster) - term
                    term = _max_term(cluster)
                    ctx.advance("spark")
    finally:
        df.unpersist()
    figures = []
    for mode in MODES:
        params = {"rows": n, "row_bytes": ROW_BYTES, "partitions": parts, "acks": mode}
        title = "Spark noop sink (ceiling)" if mode == "noop" else f"Spark load acks={mode}"
        figures.append(figure(f"spark.{mode}.rps", "spark", f"{title} rows/s", "rec/s",
                              samples[mode], params=params,
                              target=(">=", TARGET_RPS) if mode == "leader" else None))
        figures.append(figure(f"spark.{mode}.MBps", "spark", f"{title} MB/s", "MB/s",
                              [x * ROW_BYTES / MB for x in samples[mode]], params=params))
    return figures, {"rows": n, "partitions": parts, "rows_per_s": samples,
                     "elections": elections}


def _max_term(cluster: Cluster) -> int:
    """The highest term any live node reports (a change means an election happened)."""
    return max((st.get("term", 0) for st in cluster.statuses().values() if st), default=0)
