"""Smoke test of `raftlog bench --quick` against a real local cluster.

Checks that the harness runs end to end and that results.json has every field and the plots
exist. Never asserts on speed: numbers belong to docs/PERFORMANCE.md, not to the test suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from bench.results import FIGURE_FIELDS, missing_fields
from bench.runner import WORKLOADS

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cluster_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("raft.cli", "raft.node"))


@pytest.mark.timeout(300)
@pytest.mark.skipif(not _cluster_available(), reason="raft.cli/raft.node not built yet")
def test_quick_bench_writes_complete_results_and_plots(tmp_path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", "--quick", "--out", str(out),
         "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    assert missing_fields(results) == []
    assert results["config"]["quick"] is True
    assert {f["workload"] for f in results["figures"]} == set(WORKLOADS)
    for fig in results["figures"]:
        assert set(FIGURE_FIELDS) <= set(fig)
    # Every workload measured something (a None median would mean it silently failed), except
    # the graceful transfer, which may be unsupported by the node.
    for fig in results["figures"]:
        if fig["id"] != "failover.transfer.s":
            assert fig["median"] is not None, f"{fig['id']} measured nothing"
    for name in results["plots"]:
        assert (out / name).stat().st_size > 1000
    assert set(results["plots"]) == {"throughput.png", "latency_cdf.png", "failover.png"}
    # The clusters were stopped: no node processes left behind, temp dirs removed.
    assert [p for p in tmp_path.iterdir() if p.name.startswith("raftlog-bench-")] == []
    # --compare against itself: every ratio is 1.
    again = subprocess.run(
        [sys.executable, "-c", "from rich.console import Console; import json, sys;"
         "from bench.results import compare_table; r = json.load(open(sys.argv[1]));"
         "Console(width=150).print(compare_table(r, r))", str(out / "results.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "1.00×" in again.stdout
