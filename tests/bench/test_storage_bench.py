"""The storage bench runs end to end on a tiny size and reports every figure (no timing
assertions: numbers belong in docs/performance/storage.md)."""

from bench.storage_bench import RECORD_SIZES, run


def test_storage_bench_reports_every_mode(tmp_path) -> None:
    res = run(str(tmp_path), mib=1, repeats=1)
    for mode in ("append_only", "group_commit", "flush_per_batch"):
        for name in RECORD_SIZES:
            s = res["MBps"][f"{mode}.{name}"]
            assert s["min"] <= s["median"] <= s["max"] and s["median"] > 0
    assert res["MBps"]["raw_lmdb"]["median"] > 0
    assert res["machine"]["cpus"] and res["date"]
