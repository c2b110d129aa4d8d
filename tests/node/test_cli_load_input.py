"""`raftlog load` with an input that is not in the --format given (issue 29, item 5): one clear
line naming the formats, exit 2, before Spark starts (Spark itself answers with a raw SQLSTATE
message, or loads junk: JSON read from CSV becomes `_corrupt_record` rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import raftlog

PARQUET_HEAD = b"PAR1\x15\x04\x15"  # the magic is all the check reads


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    csv = tmp_path / "rows.csv"
    csv.write_text("id,name\n1,a\n")
    js = tmp_path / "rows.json"
    js.write_text(json.dumps({"id": 1}) + "\n")
    pq = tmp_path / "rows.parquet"
    pq.write_bytes(PARQUET_HEAD + b"\0" * 32 + b"PAR1")
    spark_dir = tmp_path / "out"  # what Spark writes: _SUCCESS beside part files
    spark_dir.mkdir()
    (spark_dir / "_SUCCESS").write_text("")
    (spark_dir / "part-00000.csv").write_text("1,a\n")
    return {"csv": csv, "json": js, "parquet": pq, "dir": spark_dir}


@pytest.mark.parametrize("name, fmt, message", [
    ("csv", "parquet", "rows.csv is not a parquet file (it does not begin with PAR1); if it is "
                       "csv, pass --format csv (formats: parquet, csv, json)"),
    ("json", "parquet", "if it is json, pass --format json"),
    ("parquet", "csv", "rows.parquet is a parquet file, not csv; pass --format parquet"),
    ("parquet", "json", "rows.parquet is a parquet file, not json; pass --format parquet"),
    ("csv", "json", "rows.csv is not JSON Lines (one object per line, starting with {); if it "
                    "is csv, pass --format csv"),
    ("dir", "parquet", "part-00000.csv (in "),
])
def test_an_input_in_another_format_is_one_clear_error_before_spark_starts(
        files: dict[str, Path], name: str, fmt: str, message: str) -> None:
    res = raftlog("load", "--servers", "127.0.0.1:1", "--input", str(files[name]), "--format",
                  fmt)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raftlog load: "), res.stderr
    assert message in lines[0]
    assert "SQLSTATE" not in res.stderr


def test_an_unknown_format_names_the_formats(files: dict[str, Path]) -> None:
    res = raftlog("load", "--input", str(files["csv"]), "--format", "xyz")
    assert res.returncode == 2
    assert "invalid choice: 'xyz' (choose from parquet, csv, json)" in res.stderr.replace(
        "'parquet', 'csv', 'json'", "parquet, csv, json")


def test_csv_schema_applies_to_csv_only(files: dict[str, Path]) -> None:
    res = raftlog("load", "--input", str(files["json"]), "--format", "json", "--csv-schema",
                  "id INT")
    assert res.returncode == 2
    assert "--csv-schema applies to --format csv, not json" in res.stderr
