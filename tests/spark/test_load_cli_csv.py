"""`raftlog load --format csv` keeps column types (issue 29, item 6): numbers and booleans are
JSON numbers and booleans in the loaded values (Spark's inferSchema), or the types --csv-schema
gives; a schema Spark cannot parse is one clear error, exit 2, without Spark's SQLSTATE text.

The first load runs `raftlog load` as users do (its own process and JVM, which it starts and
stops); the others call the same command in this process on the suite's Spark session (the
command keeps a session it did not start), which saves a JVM start each (~15 s of CI)."""

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


def _load_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from sparkio import cli

    capsys.readouterr()
    code = cli.main(["load", *args])
    return code, capsys.readouterr().err


def test_csv_loads_keep_column_types_or_take_a_schema(
        tmp_path: Path, spark: object, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text("id,name,price,ok\n1,a,2.5,true\n2,b,3.0,false\n")
    with LocalCluster(tmp_path / "data", nodes=1) as cluster:
        cluster.wait_leader(timeout=60)
        res = _raftlog("load", "--servers", cluster.servers, "--input", str(rows), "--format",
                       "csv", "--csv-header", "--master", "local[1]")
        assert res.returncode == 0, res.stderr
        code, err = _load_here(capsys, "--servers", cluster.servers, "--input", str(rows),
                               "--format", "csv", "--csv-header", "--csv-schema",
                               "id STRING, name STRING, price DOUBLE, ok BOOLEAN")
        assert code == 0, err
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
        code, err = _load_here(capsys, "--servers", cluster.servers, "--input", str(rows),
                               "--format", "csv", "--csv-header", "--csv-schema", "id INTEGR")
        assert code == 2, err
        assert err.strip().splitlines()[-1].startswith(
            f"raftlog load: cannot read {rows} as csv: "), err
        assert "SQLSTATE" not in err and "check --format (parquet, csv or json) and " \
            "--csv-schema" in err
