"""Plumbing of `raftlog bench partitions`: a tiny run (2 and 3 partitions, a fraction of a
second per point) on a real cluster produces every figure id with a value, and `--only` runs
only what it names. Never asserts on speed: numbers belong to docs/PERFORMANCE.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.results import missing_fields

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(tmp_path, *args: str) -> dict:  # noqa: ANN001
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", "partitions", "--quick", "--duration",
         "0.3", "--out", str(out), "--data-dir", str(tmp_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads((out / "results.json").read_text())


@pytest.mark.timeout(300)
def test_quick_partitions_bench_reports_every_figure(tmp_path) -> None:  # noqa: ANN001
    results = _bench(tmp_path, "--partitions", "3")
    assert missing_fields(results) == []
    ids = {f["id"]: f for f in results["figures"]}
    expect = ["partitions.p1.quorum.MBps", "partitions.p2.quorum.MBps", "partitions.ratio.p2",
              "partitions.keyed2.quorum.MBps", "partitions.keyed2.quorum.p99_ms",
              "partitions.p1.quorum.cpu_ms_per_MB", "partitions.p2.quorum.cpu_ms_per_MB",
              "partitions.keyed2.quorum.cpu_ms_per_MB",
              "partitions.fsyncs_ps.p1", "partitions.fsyncs_ps.p2",
              "partitions.fsyncs_ratio.p2", "partitions.idle.frames_ps.p1",
              "partitions.idle.frames_ps.p3", "partitions.idle.frames_ratio.p3",
              "partitions.idle3.cpu_pct", "partitions.create3.s", "partitions.failover3.s",
              "partitions.failover3.elections_per_partition"]
    for fid in expect:
        assert ids[fid]["median"] is not None, fid
    # Rebalance needs the leader balancer: reported (maybe without a value), never missing.
    assert "partitions.rebalance3.s" in ids
    details = results["details"]["partitions"]
    assert details["failover"]["led_at_end"] == 3
    assert all(r["lost"] == 0 for r in details["throughput"]["1"])
    # CPU and counters were read from every node.
    assert len(details["idle"]["3"]["cpu_pct"]) == 3
    assert len(details["idle"]["3"]["frames_ps"]) == 3


@pytest.mark.timeout(300)
def test_only_runs_the_named_measures(tmp_path) -> None:  # noqa: ANN001
    results = _bench(tmp_path, "--only", "fsyncs")
    ids = {f["id"] for f in results["figures"]}
    assert ids == {"partitions.fsyncs_ps.p1", "partitions.fsyncs_ps.p2",
                   "partitions.fsyncs_ratio.p2"}
    assert results["config"]["only"] == ["fsyncs"]


def test_an_unknown_measure_is_refused_with_the_choices() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", "partitions", "--only", "idel"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode != 0
    assert "idel" in proc.stderr and "throughput" in proc.stderr
