"""A full disk is not a crash: real nodes whose data directories are small tmpfs mounts.

Once the filesystems are full, quorum writes get a clear DISK_FULL error (or time out: their
outcome is unknown, never a false failure), reads keep working, no node stops or corrupts its
log, and after space is given back writes resume and every acknowledged record reads back
identically from every node.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from raft.cli.demo import verify
from raft.cli.localcluster import LocalCluster, wait_for
from raft.client import BlockingClient, RaftlogError

pytestmark = pytest.mark.slow

MOUNT_MB = 24


def _mount_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={MOUNT_MB}m", "tmpfs",
                          str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode}); "
                    f"this test needs root (CI runs as root)")


def _fill(path: Path) -> Path:
    """Write a filler file until the filesystem is full."""
    filler = path / "filler"
    chunk = b"\0" * (256 << 10)
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return filler


@pytest.fixture()
def tmpfs_cluster(tmp_path: Path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    data = tmp_path / "data"
    mounts = [data / f"node-{i}" for i in (1, 2, 3)]
    for m in mounts:
        _mount_tmpfs(m)
    cluster = LocalCluster(data, nodes=3)
    try:
        cluster.start()
        cluster.wait_leader(timeout=30)
        yield cluster, mounts
    finally:
        cluster.stop()
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)


def test_full_disk_refuses_writes_keeps_reads_and_recovers(tmpfs_cluster) -> None:
    cluster, mounts = tmpfs_cluster
    acked: dict[int, bytes] = {}
    with BlockingClient(cluster.servers, timeout=10.0) as c:
        before = [f"before-{i}".encode() for i in range(200)]
        res = c.produce(before, acks="quorum")
        acked.update({res.base_offset + i: v for i, v in enumerate(before)})

        fillers = [_fill(m) for m in mounts]
        errors: list[str] = []

        def disk_full_seen() -> bool:
            values = [f"full-{time.monotonic_ns()}-{i}".encode() for i in range(50)]
            try:
                r = c.produce(values, acks="quorum", timeout=2.0)
            except RaftlogError as e:
                errors.append(f"{e.code}: {e}"[:200])
                return e.code == "DISK_FULL"
            acked.update({r.base_offset + i: v for i, v in enumerate(values)})
            return False

        wait_for(disk_full_seen, "a DISK_FULL answer to quorum writes", timeout=60)
        # Only clear answers: DISK_FULL, or TIMEOUT/BACKPRESSURE while the leader found out.
        assert {e.split(":")[0] for e in errors} <= {
            "DISK_FULL", "TIMEOUT", "BACKPRESSURE", "LEADERSHIP_LOST", "NOT_LEADER"}, errors

        # Reads keep working, on every node (a fetch may stop early: follow next_offset).
        for addr in cluster.addresses.values():
            got: list[bytes] = []
            offset = 0
            while len(got) < len(before):
                res = c.fetch(offset, max_bytes=1 << 20, address=addr)
                got += [r.value for r in res.records]
                assert res.next_offset > offset or res.records, f"{addr} stopped at {offset}"
                offset = res.next_offset
            assert got[:len(before)] == before
        assert all(cluster.alive(i) for i in cluster.addresses), "a node stopped on a full disk"

        for f in fillers:
            f.unlink()

        after = [f"after-{i}".encode() for i in range(200)]

        def writes_resume() -> bool:
            try:
                r = c.produce(after, acks="quorum", timeout=3.0)
            except RaftlogError:
                return False
            acked.update({r.base_offset + i: v for i, v in enumerate(after)})
            return True

        wait_for(writes_resume, "quorum writes after space came back", timeout=60)
    problems = verify(cluster, acked)
    assert not problems, problems[:5]
    assert all(cluster.alive(i) for i in cluster.addresses)
    # No log was damaged: every node stops cleanly and reopens (the open checks that batches
    # are contiguous and agree with the metadata) with every acknowledged record.
    assert set(cluster.stop().values()) == {0}
    cluster.start()
    cluster.wait_leader(timeout=30)
    problems = verify(cluster, acked)
    assert not problems, problems[:5]
