"""Plumbing of `raftlog bench scale` (issue 27): a tiny run (1 and 2 shards, a fraction of a
second per point) on real `raftlog serve --shards K` nodes produces every figure id with a
value. Never asserts on speed: numbers belong to docs/PERFORMANCE.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.results import missing_fields

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(300)
def test_quick_scale_bench_reports_every_figure(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", "scale", "--quick", "--duration", "0.3",
         "--out", str(out), "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    assert missing_fields(results) == []
    ids = {f["id"]: f for f in results["figures"]}
    for acks in ("leader", "quorum"):
        for fid in (f"scale.shards1.{acks}.MBps", f"scale.shards2.{acks}.MBps",
                    f"scale.shards1.{acks}.cpu_s_per_MB", f"scale.shards2.{acks}.cpu_s_per_MB",
                    f"scale.ratio.shards2.{acks}",
                    f"scale.shards1.{acks}.producers_cpu_s_per_MB",
                    f"scale.shards2.{acks}.producers_cpu_s_per_MB",
                    f"scale.shards2.{acks}.MBps_cpu_ceiling"):
            assert ids[fid]["median"] is not None, fid
    rounds = results["details"]["scale"]["shards2.leader"]
    assert all(r["producers_cores"] > 0 and r["node_cores"] > 0 for r in rounds), rounds
