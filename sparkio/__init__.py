"""PySpark data source "raftlog": exactly-once bulk loads and offset-range reads.

    import sparkio
    sparkio.register(spark)
    df.write.format("raftlog").option("servers", "127.0.0.1:7101").mode("append").save()
    spark.read.format("raftlog").option("servers", "127.0.0.1:7101").load()

Spark needs the registration explicitly; executors import this package, which installing
raftlog with the `spark` extra provides. See docs/SPARK.md.
"""

from __future__ import annotations


def register(spark) -> None:  # noqa: ANN001 (a SparkSession; pyspark is an optional extra)
    """Register the "raftlog" data source with this SparkSession."""
    from sparkio.source import RaftlogDataSource

    spark.dataSource.register(RaftlogDataSource)


__all__ = ["register"]
