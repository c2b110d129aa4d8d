"""The PySpark data source "raftlog" (Python Data Source API, Spark 4.x)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.types import StructType

from sparkio.reader import READ_SCHEMA, RaftlogReader
from sparkio.writer import RaftlogWriter


class RaftlogDataSource(DataSource):
    """`spark.read.format("raftlog")` and `df.write.format("raftlog")`; options in docs/SPARK.md."""

    @classmethod
    def name(cls) -> str:
        return "raftlog"

    def schema(self) -> str:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftlogReader(dict(self.options), "UTC")

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return RaftlogWriter(dict(self.options), schema, overwrite)
