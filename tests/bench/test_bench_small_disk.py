"""The real `raftlog bench` on a small filesystem (issue 28): it completes within the disk or
refuses clearly, never fills it, leaves nothing behind, and exits non-zero when a workload failed.

The small filesystems are tmpfs mounts in a temporary directory: that needs root (CI runs as
root); elsewhere those tests skip and say why. Nothing here asserts a speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import disk

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20


def _bench(*args: str, timeout: float = 280) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raft.cli", "bench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _flat(text: str) -> str:
    return " ".join(text.split())  # the console wraps long lines


def _mount_tmpfs(path: Path, mib: int) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (not permitted in this container?): "
                    f"{proc.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def fs_200m(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "fs", 200)


@pytest.fixture
def fs_512m(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "fs", 512)


@pytest.mark.timeout(300)
def test_on_200_mib_produce_is_refused_with_the_space_it_needs_and_the_space_free(
        fs_200m: Path, tmp_path: Path) -> None:
    proc = _bench("produce", "--quick", "--data-dir", str(fs_200m), "--out", str(tmp_path / "o"))
    out = _flat(proc.stdout)
    assert proc.returncode == 1, out[-3000:]
    need = disk.fmt_bytes(disk.free_needed(disk.MIN_KEEP, 3))
    assert f"produce: refused: workload produce needs {need} free on {fs_200m}" in out, out
    assert "MiB is free" in out
    assert "1 of 1 workloads failed or were refused (produce)" in out
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["figures"] == [] and results["errors"][0]["refused"] is True
    assert list(fs_200m.iterdir()) == []  # nothing left behind


@pytest.mark.timeout(300)
def test_on_512_mib_produce_completes_within_the_disk_and_leaves_nothing(
        fs_512m: Path, tmp_path: Path) -> None:
    """Unbounded, this workload filled the filesystem and failed (issue 28). Bounded, it runs
    every point with retention deleting, and the safety margin stays free."""
    proc = _bench("produce", "--quick", "--data-dir", str(fs_512m), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, _flat(proc.stdout)[-3000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["errors"] == []
    assert all(f["median"] is not None for f in results["figures"]), results["figures"]
    bound = results["details"]["produce"]["disk"]
    assert bound["retention_bytes"] == disk.retention_for(bound["free_bytes"], 3)
    assert bound["min_free_bytes"] >= bound["margin_bytes"] // 2, bound
    assert list(fs_512m.iterdir()) == []


@pytest.mark.timeout(300)
def test_a_run_whose_workload_fails_exits_non_zero_and_says_why(tmp_path: Path) -> None:
    # A flag no node knows: every node exits at start, the workload fails.
    proc = _bench("latency", "--quick", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"),
                  "--server-arg=--no-such-flag")
    out = _flat(proc.stdout)
    assert proc.returncode == 1, out[-3000:]
    assert "bench: workload latency failed: ClusterError: node" in out, out[-3000:]
    assert "failed: latency: raftlog: error: unrecognized arguments: --no-such-flag" in out
    assert "1 of 1 workloads failed or were refused (latency)" in out
    assert [p for p in tmp_path.iterdir() if p.name.startswith("raftlog-bench-")] == []
