"""PySpark data source "raftlog": exactly-once bulk loads and offset-range reads.

    import sparkio
    sparkio.register(spark)
    df.write.format("raftlog").option("servers", "127.0.0.1:7101").mode("append").save()
    spark.read.format("raftlog").option("servers", "127.0.0.1:7101").load()
    df = sparkio.read_subscription(spark, "127.0.0.1:7101", "etl")   # incremental reads
    ...the job...; sparkio.commit(df)

Spark needs the registration explicitly; executors import this package, which installing
raftlog with the `spark` extra provides. See docs/SPARK.md.
"""

from __future__ import annotations


def register(spark) -> None:  # noqa: ANN001 (a SparkSession; pyspark is an optional extra)
    """Register the "raftlog" data source with this SparkSession."""
    from sparkio.source import RaftlogDataSource

    spark.dataSource.register(RaftlogDataSource)


def read_subscription(spark, servers: str, subscription: str, **options):  # noqa: ANN001, ANN201
    """The next incremental range of `subscription` as a DataFrame (sparkio/incremental.py);
    commit it with `commit(df)` after the job that consumed it succeeded."""
    from sparkio.incremental import read_subscription as read

    return read(spark, servers, subscription, **options)


def commit(df=None, **kwargs) -> int:  # noqa: ANN001
    """Commit a successful incremental read (sparkio/incremental.py)."""
    from sparkio.incremental import commit as do_commit

    return do_commit(df, **kwargs)


__all__ = ["commit", "read_subscription", "register"]
