"""Unit tests of the bench's statistics and results schema (no cluster, milliseconds)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from bench.results import compare_table, figure, missing_fields, summary_table
from bench.stats import Histogram, Summary, bucket_bounds, bucket_index, percentiles


@given(st.integers(min_value=0, max_value=1 << 40))
@settings(max_examples=300)
def test_every_value_falls_inside_its_bucket_with_bounded_error(v: int) -> None:
    lo, hi = bucket_bounds(bucket_index(v))
    assert lo <= v <= hi
    assert hi - lo <= max(1, v) / 32  # about 3% worst-case relative width


def test_histogram_percentiles_match_exact_ones_within_bucket_precision() -> None:
    rng = random.Random(7)
    xs = [rng.lognormvariate(7, 1) for _ in range(20_000)]
    h = Histogram()
    for x in xs:
        h.record(x)
    for q in (0.5, 0.9, 0.99, 0.999):
        (exact,) = percentiles(xs, [q])
        assert abs(h.percentile(q) - exact) <= 0.04 * exact + 1
    assert h.percentile(1.0) == int(max(xs))
    assert h.count == len(xs)


def test_histograms_merge_like_one_and_survive_json() -> None:
    a, b, both = Histogram(), Histogram(), Histogram()
    for i in range(1000):
        (a if i % 2 else b).record(i * 3)
        both.record(i * 3)
    a.merge(Histogram.from_json(b.to_json()))
    assert a.counts == both.counts and a.min == both.min and a.max == both.max
    assert a.cdf()[-1][1] == 1.0


def test_summary_ignores_missing_samples() -> None:
    s = Summary.of([3.0, None, 1.0, 2.0])
    assert (s.median, s.min, s.max) == (2.0, 1.0, 3.0)
    assert Summary.of([None]).median is None


def test_figure_fraction_target_and_direction() -> None:
    thr = figure("p", "produce", "p", "MB/s", [50, 100, 150], limit="tcp_loopback_MBps",
                 limit_value=400.0, target=(">=", 150.0))
    assert thr["median"] == 100 and thr["fraction_of_limit"] == 0.25 and thr["met"] is False
    lat = figure("l", "latency", "l", "ms", [2.0, 4.0, 3.0], better="lower",
                 limit="quorum_floor_ms", limit_value=0.3, target=("<=", 5.0))
    assert lat["met"] is True and abs(lat["fraction_of_limit"] - 0.1) < 1e-9
    empty = figure("e", "fetch", "e", "MB/s", [], limit_value=1.0)
    assert empty["median"] is None and empty["fraction_of_limit"] is None


def test_missing_fields_names_what_is_absent_and_tables_render() -> None:
    fig = figure("p", "produce", "produce", "MB/s", [1.0, 2.0])
    res = {"schema": 1, "tool": "t", "date": "d", "command": "c", "machine": {}, "config": {},
           "limits": {"fsync_ms": {}, "lmdb_commit_ms": {}, "rpc_floor_ms": {}, "seq_write_MBps": {},
                      "tcp_loopback_MBps": {},
                      "lmdb_append_MBps": {}},
           "figures": [fig], "details": {}, "errors": [], "plots": [], "elapsed_s": 1.0}
    assert missing_fields(res) == []
    del res["limits"]["fsync_ms"]
    del res["figures"][0]["median"]
    assert missing_fields(res) == ["limits.fsync_ms", "figures[p].median"]
    res["figures"][0]["median"] = 2.0
    console = Console(width=120, record=True)
    old = {"date": "x", "figures": [{**fig, "median": 1.0}]}
    console.print(summary_table(res))
    console.print(compare_table(res, old))
    assert "2.00×" in console.export_text()
