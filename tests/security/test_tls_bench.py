"""Smoke test of `raftlog bench tls --quick`: both clusters (plaintext and TLS) start, every
figure of both modes is measured, and the clusters are gone afterwards. Never asserts on speed:
the numbers belong to docs/PERFORMANCE.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from secfixtures import REPO

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_quick_tls_bench_measures_both_modes(tmp_path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "raft.cli", "bench", "tls", "--quick", "--out", str(out),
         "--data-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads((out / "results.json").read_text())
    figures = {f["id"]: f for f in results["figures"]}
    for mode in ("plaintext", "tls"):
        for acks in ("quorum", "leader"):
            for suffix in ("1KiB.MBps", "loaded_p99", "r200.p50", "r200.p99"):
                fid = f"tls.{mode}.{acks}.{suffix}"
                assert figures[fid]["median"] is not None, f"{fid} measured nothing"
    assert [p for p in tmp_path.iterdir() if p.name.startswith("raftlog-bench-")] == []
