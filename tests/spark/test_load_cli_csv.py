"""`raftlog load --format csv` keeps column types (issue 29, item 6): numbers and booleans are
JSON numbers and booleans in the loaded values (Spark's inferSchema), or the types --csv-schema
gives; a schema Spark cannot parse is one clear error, exit 2, without Spark's SQLSTATE text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raft.cli.localcluster import LocalCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _raftlog(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAFTLOG_SERVERS"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "raft.cli", *args], capture_output=True,
                          text=True, timeout=600, env=env, cwd=REPO)


def test_csv_loads_keep_column_types_or_take_a_schema(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    rows = tmp_path / "rows.csv"
    rows.write_text("id,name,price,ok\n1,a,2.5,true\n2,b,3.0,false\n")
    with LocalCluster(tmp_path / "data", nodes=1) as cluster:
        cluster.wait_leader(timeout=60)
        res = _raftlog("load", "--servers", cluster.servers, "--input", str(rows), "--format",
                       "csv", "--csv-header", "--master", "local[1]")
        assert res.returncode == 0, res.stderr
        res = _raftlog("load", "--servers", cluster.servers, "--input", str(rows), "--format",
                       "csv", "--csv-header", "--master", "local[1]", "--csv-schema",
                       "id STRING, name STRING, price DOUBLE, ok BOOLEAN")
        assert res.returncode == 0, res.stderr
        res = _raftlog("consume", "--servers", cluster.servers, "--json")
        values = sorted((json.loads(json.loads(line)["value"]) for line in
                         res.stdout.splitlines()), key=lambda v: (type(v["id"]).__name__,
                                                                  str(v["id"])))
        assert values == [
            {"id": 1, "name": "a", "price": 2.5, "ok": True},
            {"id": 2, "name": "b", "price": 3.0, "ok": False},
            {"id": "1", "name": "a", "price": 2.5, "ok": True},
            {"id": "2", "name": "b", "price": 3.0, "ok": False},
        ]
        res = _raftlog("load", "--servers", cluster.servers, "--input", str(rows), "--format",
                       "csv", "--csv-header", "--master", "local[1]", "--csv-schema",
                       "id INTEGR")
        assert res.returncode == 2, res
        assert res.stderr.strip().splitlines()[-1].startswith(
            f"raftlog load: cannot read {rows} as csv: "), res.stderr
        assert "SQLSTATE" not in res.stderr and "check --format (parquet, csv or json) and " \
            "--csv-schema" in res.stderr
