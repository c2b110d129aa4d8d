"""`spark`: bulk-load throughput of the sparkio writer (exactly-once staged loads).

One cached DataFrame of 100-byte rows is written to Spark's `noop` sink (the ceiling: Spark's
own cost of producing and shipping Arrow batches to Python) and then to raftlog with leader and
quorum acks, in the same run, on local[*]. rows/s and MB/s cover the whole job: load_begin,
staging, the driver's load_commit (so a load is only counted once it is visible).

CPU seconds per million rows (utime+stime from /proc, which hold up on a shared machine where
rows/s do not): the three nodes together, and Spark's side (the JVM and its Python workers,
reaped ones included), per mode. A load aborted by an election (leader-acked staged batches
lost: exactly-once refuses to publish it) is counted in `aborted` and gives no rows/s sample.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from bench.disk import DiskNeed
from bench.harness import Cluster
from bench.partitions_probe import cpu_seconds
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
    aborted = {m: 0 for m in MODES}  # loads an election aborted (no rows/s sample)
    cpu_nodes: dict[str, list[float]] = {m: [] for m in MODES}  # CPU s per million rows
    cpu_spark: dict[str, list[float]] = {m: [] for m in MODES}
    jvm = spark.sparkContext._gateway.proc.pid
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
                    pids = [node.proc.pid for node in cluster.nodes.values() if node.proc]
                    n0, s0 = _cpu(pids), _tree_cpu(jvm)
                    t0 = time.perf_counter()
                    try:
                        if mode == "noop":
                            df.write.format("noop").mode("append").save()
                        else:
                            (df.write.format("raftlog").option("servers", servers)
                             .option("acks", mode).option("loadId", f"bench-{uuid.uuid4()}")
                             .mode("append").save())
                    except Exception as e:  # noqa: BLE001 (pyspark wraps the writer's error)
                        if "was not committed" not in str(e):
                            raise
                        aborted[mode] += 1  # an election lost staged batches: not published
                    else:
                        samples[mode].append(n / (time.perf_counter() - t0))
                    cpu_nodes[mode].append((_cpu(pids) - n0) / (n / 1e6))
                    cpu_spark[mode].append((_tree_cpu(jvm) - s0) / (n / 1e6))
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
        figures.append(figure(f"spark.{mode}.cpu_s_per_Mrow.nodes", "spark",
                              f"{title}: the nodes' CPU s per million rows", "s",
                              cpu_nodes[mode], better="lower", params=params))
        figures.append(figure(f"spark.{mode}.cpu_s_per_Mrow.spark", "spark",
                              f"{title}: Spark's CPU s (JVM + Python workers) per million rows",
                              "s", cpu_spark[mode], better="lower", params=params))
    return figures, {"rows": n, "partitions": parts, "rows_per_s": samples,
                     "elections": elections, "aborted": aborted,
                     "cpu_s_per_Mrow": {"nodes": cpu_nodes, "spark": cpu_spark},
                     "load_average": list(os.getloadavg())}


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) or 0.0 for p in pids)


def _tree_cpu(root: int) -> float:
    """CPU seconds of `root` and every process under it (Spark's JVM: its Python daemon and
    workers), reaped children included (cutime+cstime), so a worker that exited still counts."""
    parent: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw[raw.rindex(")") + 2:].split()
        parent[int(entry)] = int(rest[1])
        spent[int(entry)] = sum(int(x) for x in rest[11:15]) / _TICKS
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += spent.get(pid, 0.0)
        todo += [p for p, pp in parent.items() if pp == pid]
    return total


_TICKS = os.sysconf("SC_CLK_TCK")


def _max_term(cluster: Cluster) -> int:
    """The highest term any live node reports (a change means an election happened)."""
    return max((st.get("term", 0) for st in cluster.statuses().values() if st), default=0)
