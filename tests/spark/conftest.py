"""Fixtures for the Spark tests: ONE session-scoped local SparkSession (local[2,2]: two cores,
a failed task is retried once) and ONE real 3-node cluster of `python -m raft.cli serve`
processes on 127.0.0.1, shared by every test in this directory.

Both are created lazily, so the pure unit tests here (test_loads_unit.py) run without Spark.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from spark_cluster import Cluster, SingleNode, missing_for_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = missing_for_cluster()
    if missing:
        pytest.skip(f"the 3-node cluster needs {', '.join(missing)} (not in this build yet)")
    c = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.start_all()
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="session")
def single_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SingleNode]:
    n = SingleNode(tmp_path_factory.mktemp("spark-single"))
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    import sparkio

    # Executors must import raftlog: run Spark's Python workers with this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2,2]").appName("raftlog-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    sparkio.register(session)
    yield session
    session.stop()
