"""Plumbing of `raftlog bench scale` (issue 27): a tiny run (1 and 2 shards, a fraction of a
second per point) on real `raftlog serve --shards K` nodes produces every figure id with a
value. Never asserts on speed: numbers belong to docs/PERFORMANCE.md."""

from __future__ import annotations

import pytest

from quick_run import quick_bench

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_quick_scale_bench_reports_every_figure(tmp_path) -> None:  # noqa: ANN001
    results = quick_bench(tmp_path, "scale", "--duration", "0.3")
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
