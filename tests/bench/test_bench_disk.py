"""The bench bounds its disk (issue 28): the sizing rule, the refusal of a workload that would not
fit, the removal of each workload's data, and a non-zero exit when a workload failed.

These run the runner in-process with stand-in workloads and stand-in machine limits (no cluster,
no probes): they check the bench's own decisions. tests/bench/test_bench_small_disk.py runs the
real bench on a small filesystem."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from bench import cli, disk, runner
from bench.catalogue import available_workloads, workload_module
from bench.workloads.common import BenchConfig

MIB = 1 << 20
GIB = 1 << 30

LIMITS = {"fsync_ms": {"p50": 0.1, "p99": 0.2}, "lmdb_commit_ms": {"p50": 0.2, "p99": 0.3},
          "rpc_floor_ms": {"p50": 0.1, "p99": 0.2}, "seq_write_MBps": {"median": 500.0},
          "tcp_loopback_MBps": {"median": 1000.0}, "lmdb_append_MBps": {"median": 300.0}}


# -- the sizing rule ------------------------------------------------------------------------------
@pytest.mark.parametrize("free", [200 * MIB, 352 * MIB, 512 * MIB, 1536 * MIB, 64 * GIB, 2 << 40])
@pytest.mark.parametrize("nodes", [1, 3, 5, 6])
def test_the_sized_retention_leaves_the_margin_free(free: int, nodes: int) -> None:
    """Every node at its most (LMDB's overhead and the slack included) plus the safety margin
    fits in the free space: the nodes cannot fill the filesystem by what they keep."""
    retention = disk.retention_for(free, nodes)
    if retention <= 0:
        return  # nothing fits: the plan refuses (below)
    assert nodes * disk.node_footprint(retention) + disk.margin(free) <= free
    # ...and the margin is at least 10% of the free space, never under 64 MiB.
    assert disk.margin(free) >= max(free // 10, 64 * MIB)


def test_three_nodes_share_the_space_and_lmdb_doubles_it() -> None:
    # 64 GiB free (the disk): 6.4 GiB margin, 19.2 GiB a node, half of it for LMDB.
    assert disk.retention_for(64 * GIB, 3) == (64 * GIB - int(64 * GIB * 0.1)) // 3 // 2 - 32 * MIB
    assert disk.retention_for(64 * GIB, 3) < disk.retention_for(64 * GIB, 1) // 3 + 1
    assert disk.retention_for(200 * MIB, 3) < 0  # 200 MiB: nothing fits beside the margin


@pytest.mark.parametrize("keep", [disk.MIN_KEEP, 128 * MIB, 220 * MIB, 5 * GIB])
@pytest.mark.parametrize("nodes", [1, 3, 6])
def test_free_needed_is_the_least_free_space_that_fits(keep: int, nodes: int) -> None:
    need = disk.free_needed(keep, nodes)
    assert disk.retention_for(need, nodes) >= keep
    assert disk.retention_for(need - 2 * MIB, nodes) < keep


# -- the plan and the refusal ---------------------------------------------------------------------
def test_a_workload_that_fits_gets_the_sized_retention_and_the_low_disk_valve() -> None:
    plan = disk.plan("produce", disk.DiskNeed(), 1536 * MIB, 3, "/data")
    assert plan.retention_bytes == disk.retention_for(1536 * MIB, 3)
    assert plan.server_args == ["--retention-bytes", str(plan.retention_bytes),
                                "--low-disk-mb", str(disk.margin(1536 * MIB) // MIB)]


def test_a_workload_that_does_not_fit_is_refused_naming_the_space_it_needs_and_the_free() -> None:
    need = disk.DiskNeed(keep_bytes=128 * MIB, why="the whole pre-filled log")
    with pytest.raises(disk.DiskTooSmall) as e:
        disk.plan("fetch", need, 900 * MIB, 3, "/small")
    msg = str(e.value)
    assert "workload fetch needs " + disk.fmt_bytes(disk.free_needed(128 * MIB, 3)) in msg
    assert "900 MiB is free" in msg and "/small" in msg
    assert "the whole pre-filled log" in msg and "--data-dir" in msg
    # The same workload fits once the space it names is free.
    disk.plan("fetch", need, disk.free_needed(128 * MIB, 3), 3, "/small")


def test_two_clusters_need_twice_the_nodes() -> None:
    free = disk.free_needed(disk.MIN_KEEP, 3)
    disk.plan("produce", disk.DiskNeed(), free, 3, "/d")
    with pytest.raises(disk.DiskTooSmall, match="its 6 nodes"):
        disk.plan("tls", disk.DiskNeed(clusters=2), free, 3, "/d")


def test_a_users_retention_is_kept_when_it_fits_and_refused_when_it_does_not() -> None:
    free = 1536 * MIB
    plan = disk.plan("produce", disk.DiskNeed(), free, 3, "/d",
                     ["--retention-bytes=20MiB", "--raft", "x=1"])
    assert plan.retention_bytes == 20 * MIB and plan.user_retention_bytes == 20 * MIB
    with pytest.raises(disk.DiskTooSmall, match="does not fit"):
        disk.plan("produce", disk.DiskNeed(), free, 3, "/d", ["--retention-bytes", "10GiB"])
    with pytest.raises(disk.DiskTooSmall, match="below"):
        disk.plan("fetch", disk.DiskNeed(keep_bytes=128 * MIB), free, 3, "/d",
                  ["--retention-bytes 64MiB"])


def test_every_workload_declares_its_disk_and_the_keep_all_ones_their_full_size() -> None:
    cfg = BenchConfig(workloads=[])
    for name in available_workloads():
        need = workload_module(name).disk_need(cfg)
        assert isinstance(need, disk.DiskNeed) and need.keep_bytes >= disk.MIN_KEEP, name
    from bench.workloads import catchup, fetch, recovery, retention, spark

    assert fetch.disk_need(cfg).keep_bytes >= fetch.prefill_bytes(cfg)
    assert recovery.disk_need(cfg).keep_bytes >= recovery._bulk_mb(False) * MIB
    assert catchup.disk_need(cfg).keep_bytes >= catchup._bulk_mib(False) * MIB
    assert retention.disk_need(cfg).keep_bytes >= 2 * retention._retain_mib(False) * MIB
    assert spark.disk_need(cfg).keep_bytes >= spark._rows(False) * spark.ROW_BYTES
    assert workload_module("tls").disk_need(cfg).clusters == 2


# -- the runner: refusal, failure, cleanup, exit status ---------------------------------------
def _workload(run=None, need: disk.DiskNeed | None = None) -> SimpleNamespace:
    return SimpleNamespace(steps=lambda cfg: 1, disk_need=lambda cfg: need or disk.DiskNeed(),
                           run=run or (lambda ctx: ([], {})))


@pytest.fixture
def fake_bench(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """The runner with stand-in limits and the workloads `mods` maps names to."""
    mods: dict[str, SimpleNamespace] = {}
    monkeypatch.setattr(runner.probes, "run_probes", lambda *a, **k: dict(LIMITS))
    monkeypatch.setattr(runner, "workload_module", lambda name: mods[name])
    monkeypatch.setattr(runner.plots, "write_all", lambda results, out: [])
    return mods


def _dirs(path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("raftlog-bench-"))


def test_a_run_with_a_failed_and_a_refused_workload_exits_1_and_says_which_and_why(
        fake_bench, tmp_path, capsys) -> None:
    seen = {}

    def failing(ctx):
        seen["dir"] = ctx.data_dir
        seen["args"] = ctx.cluster().extra_args
        with open(os.path.join(ctx.data_dir, "log.mdb"), "wb") as f:
            f.write(b"x" * 4096)
        raise RuntimeError("the cluster did not catch up within 60s")

    fake_bench["latency"] = _workload(failing)
    fake_bench["produce"] = _workload(need=disk.DiskNeed(keep_bytes=1 << 50, why="everything"))
    fake_bench["fetch"] = _workload()
    rc = cli.main(["latency", "produce", "fetch", "--out", str(tmp_path / "out"),
                   "--data-dir", str(tmp_path)])
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert rc == 1
    assert "failed: latency: RuntimeError: the cluster did not catch up" in out
    assert "produce: refused: workload produce needs" in out and "everything" in out
    assert "2 of 3 workloads failed or were refused (latency, produce)" in out
    # The failed workload ran under the disk bound, and its data was removed.
    assert seen["args"][:2] == ["--retention-bytes", seen["args"][1]]
    assert int(seen["args"][1]) > 0
    assert not os.path.exists(seen["dir"])
    assert _dirs(tmp_path) == []


def test_a_run_whose_workloads_all_complete_exits_0(fake_bench, tmp_path) -> None:
    fake_bench["latency"] = _workload()
    assert cli.main(["latency", "--out", str(tmp_path / "out"),
                     "--data-dir", str(tmp_path)]) == 0


def test_each_workloads_data_is_removed_before_the_next_starts(fake_bench, tmp_path) -> None:
    dirs: list[str] = []

    def writes(ctx):
        assert all(not os.path.exists(d) for d in dirs), "the previous workload's data is left"
        dirs.append(ctx.data_dir)
        with open(os.path.join(ctx.data_dir, "data"), "wb") as f:
            f.write(b"x" * 4096)
        return [], {}

    fake_bench["latency"] = _workload(writes)
    fake_bench["produce"] = _workload(writes)
    cfg = BenchConfig(workloads=["latency", "produce"], base_dir=str(tmp_path))
    results = runner.run(cfg, runner.Console(quiet=True))
    assert len(dirs) == 2 and not any(os.path.exists(d) for d in dirs)
    assert _dirs(tmp_path) == []
    assert results["details"]["produce"]["disk"]["retention_bytes"] > 0


def test_keep_data_keeps_every_workloads_data(fake_bench, tmp_path) -> None:
    dirs: list[str] = []

    def writes(ctx):
        dirs.append(ctx.data_dir)
        return [], {}

    fake_bench["latency"] = _workload(writes)
    cfg = BenchConfig(workloads=["latency"], base_dir=str(tmp_path), keep=True)
    runner.run(cfg, runner.Console(quiet=True))
    assert os.path.isdir(dirs[0]) and len(_dirs(tmp_path)) == 1


def test_a_refused_workload_never_starts(fake_bench, tmp_path) -> None:
    started = []
    fake_bench["fetch"] = _workload(lambda ctx: started.append(1) or ([], {}),
                                    need=disk.DiskNeed(keep_bytes=1 << 50))
    cfg = BenchConfig(workloads=["fetch"], base_dir=str(tmp_path))
    results = runner.run(cfg, runner.Console(quiet=True))
    assert started == []
    assert results["errors"][0]["refused"] and "needs" in results["errors"][0]["error"]
    assert runner.failed_workloads(results) == ["fetch"]


def test_when_not_even_the_probes_fit_the_run_refuses_and_exits_1(
        fake_bench, monkeypatch, tmp_path, capsys) -> None:
    fake_bench["latency"] = _workload()
    monkeypatch.setattr(runner.probes, "disk_need", lambda sizes: 1 << 50)
    rc = cli.main(["latency", "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path)])
    assert rc == 1
    assert "the machine probes need" in " ".join(capsys.readouterr().out.split())
    assert _dirs(tmp_path) == []
