"""Plumbing of `raftlog bench link` (issue 30): a tiny run (two 3-node clusters, a link, a
fraction of a second per point, a 2 s pause) produces every figure id with a value. Never
asserts on speed: numbers belong to docs/PERFORMANCE.md."""

from __future__ import annotations

import pytest

from quick_run import quick_bench

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_quick_link_bench_reports_every_figure(tmp_path) -> None:  # noqa: ANN001
    results = quick_bench(tmp_path, "link", "--duration", "0.3")
    assert results.get("errors", []) == []
    ids = {f["id"]: f for f in results["figures"]}
    for fid in ("link.MBps", "link.source.MBps", "link.lag_p50_ms", "link.lag_p99_ms",
                "link.catchup_s", "link.promote_s"):
        assert ids[fid]["median"] is not None, fid
