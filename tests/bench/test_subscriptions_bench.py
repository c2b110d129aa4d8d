"""Smoke test of `raftlog bench subscriptions --quick`: it runs end to end on a real cluster and
reports every figure (numbers belong to docs/SUBSCRIPTIONS.md, never to a test)."""

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
def test_quick_subscriptions_bench_reports_every_figure(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", "subscriptions", "--quick", "--out",
         str(out), "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    assert missing_fields(results) == []
    ids = {f["id"]: f for f in results["figures"]}
    for name in ("commits_per_s", "commit_p99_ms", "ops_per_entry", "produce_alone.MBps",
                 "produce_with_commits.MBps", "produce_cost_pct"):
        assert ids[f"subscriptions.{name}"]["median"] is not None, name
    details = results["details"]["subscriptions"]
    assert details["consumers"] == 100 and details["rounds"][0]["commits_lost"] == 0
    assert details["rounds"][0]["entries"] > 0
