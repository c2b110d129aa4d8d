"""Plumbing of `raftlog bench link` (issue 30): a tiny run (two 3-node clusters, a link, a
fraction of a second per point, a 2 s pause) produces every figure id with a value. Never
asserts on speed: numbers belong to docs/PERFORMANCE.md."""

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
def test_quick_link_bench_reports_every_figure(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", "link", "--quick", "--duration", "0.3",
         "--out", str(out), "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    assert missing_fields(results) == []
    assert results.get("errors", []) == []
    ids = {f["id"]: f for f in results["figures"]}
    for fid in ("link.MBps", "link.source.MBps", "link.lag_p50_ms", "link.lag_p99_ms",
                "link.catchup_s", "link.promote_s"):
        assert ids[fid]["median"] is not None, fid
