"""One tiny `raftlog bench WORKLOAD --quick` run in a subprocess, as the plumbing tests of the
workloads do it: fails with the bench's output when it exits non-zero, else returns its
results.json, checked to have every field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.results import missing_fields

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quick_bench(tmp_path: Path, workload: str, *extra: str) -> dict[str, Any]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", workload, "--quick", *extra,
         "--out", str(out), "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    assert missing_fields(results) == []
    return results
