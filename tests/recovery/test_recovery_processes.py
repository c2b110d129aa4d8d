"""Recovery and membership on real processes: a follower that missed 200 MiB is caught up
(deferred flushing, pipelined chunks) and ends with the leader's exact log; a node joins as a
learner, is promoted, and members are removed, the leader included."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raft.client import BlockingClient
from raft.cli.localcluster import LocalCluster, wait_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def raftlog(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "raft.cli", *args], text=True,
                          capture_output=True, timeout=timeout, env=env, cwd=REPO)


def log_digest(cluster: LocalCluster, node_id: int, upto: int) -> tuple[int, str]:
    """(records, sha256) of the committed log of one node up to `upto`, read from that node."""
    h = hashlib.sha256()
    n = 0
    with BlockingClient(cluster.addresses[node_id], timeout=30) as c:
        offset = 0
        while offset <= upto:
            res = c.fetch(offset, max_bytes=8 * MIB, address=cluster.addresses[node_id])
            for r in res.records:
                if r.offset > upto:
                    break
                h.update(r.offset.to_bytes(8, "big"))
                h.update(r.value)
                n += 1
            if res.next_offset <= offset:
                break
            offset = res.next_offset
    return n, h.hexdigest()


def test_follower_missing_200_mib_is_caught_up_exactly(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        leader = cluster.wait_leader()
        lag = next(i for i in cluster.addresses if i != leader)
        assert cluster.terminate(lag) == 0
        value = os.urandom(1024)
        per_batch = 1024  # ~1 MiB requests
        with BlockingClient(cluster.addresses[leader], timeout=60) as c:
            for k in range(200):
                c.produce_idempotent([value[:1000] + k.to_bytes(4, "big") + i.to_bytes(4, "big")
                                      for i in range(per_batch)], acks="leader",
                                     batch_bytes=2 * MIB)
            top = c.status(cluster.addresses[leader])["dirty_offset"]
        cluster.wait_caught_up(next(i for i in cluster.addresses if i not in (leader, lag)),
                               timeout=120)
        t0 = time.monotonic()
        cluster.start(lag)
        saw_recovering = False
        behind_max = 0

        def caught_up() -> bool:
            nonlocal saw_recovering, behind_max
            st = cluster.status_of(leader, timeout=5)
            if st is None:
                return False
            for f in st.get("followers", []):
                if f["node_id"] == lag:
                    saw_recovering |= bool(f["recovering"])
                    behind_max = max(behind_max, f["bytes_behind"])
            mine = cluster.status_of(lag, timeout=5)
            return bool(mine and mine["flushed_offset"] >= top and mine["commit_index"] >= top)

        wait_for(caught_up, "the lagging follower to catch up", timeout=240, interval=0.2)
        took = time.monotonic() - t0
        print(f"caught up {200 * per_batch * 1.0e3 / 1e6:.0f} MB in {took:.1f} s")
        assert saw_recovering and behind_max > 100 * MIB
        digests = {i: log_digest(cluster, i, top) for i in cluster.addresses}
        assert len(set(digests.values())) == 1, digests
        assert digests[leader][0] >= 200 * per_batch


class _Load:
    """A background quorum writer (idempotent) for membership changes under load."""

    def __init__(self, servers: str) -> None:
        import threading

        self.acked = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(servers,), daemon=True)
        self.thread.start()

    def _run(self, servers: str) -> None:
        from raft.client import RaftlogError

        with BlockingClient(servers, timeout=20) as c:
            i = 0
            while not self.stop.is_set():
                try:
                    c.produce_idempotent([f"load-{i}".encode() * 50], acks="quorum")
                    self.acked += 1
                except RaftlogError:
                    pass
                i += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def test_add_learner_promote_then_remove_members(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        leader = cluster.wait_leader()
        with BlockingClient(cluster.servers) as c:
            c.produce_idempotent([f"before-{i}".encode() for i in range(2000)], acks="quorum")
        new = cluster.new_node()
        cluster.start(new)
        load = _Load(cluster.servers)  # the node joins while writes go on
        try:
            res = raftlog("add-node", "--id", str(new), "--address", cluster.addresses[new],
                          "--servers", cluster.servers)
            assert res.returncode == 0, res.stderr

            def promoted() -> bool:
                st = cluster.status_of(cluster.wait_leader(), timeout=5)
                return bool(st and new in st["voters"] and not st["learners"])
            wait_for(promoted, f"node {new} to be promoted to voter", timeout=60)
            before = load.acked
            wait_for(lambda: load.acked > before + 50, "writes to go on after the promotion")

            # Remove a follower: it stops receiving the log while writes go on.
            leader = cluster.wait_leader()
            gone = next(i for i in (1, 2, 3) if i != leader)
            res = raftlog("remove-node", "--id", str(gone), "--servers", cluster.servers)
            assert res.returncode == 0, res.stderr
            before = load.acked
            wait_for(lambda: load.acked > before + 100, "writes after the removal")
            frozen = cluster.status_of(gone)
            leader_st = cluster.status_of(cluster.wait_leader())
            assert frozen is not None and leader_st is not None
            assert frozen["dirty_offset"] < leader_st["dirty_offset"] - 50
            assert gone not in [f["node_id"] for f in leader_st["followers"]]
        finally:
            load.close()
        cluster.wait_caught_up(new, timeout=60)
        res = raftlog("remove-node", "--id", str(leader), "--servers", cluster.servers)
        assert res.returncode == 0, res.stderr
        final = cluster.wait_leader(timeout=30, exclude=leader)
        st = cluster.status_of(final)
        assert st is not None and sorted(st["voters"]) == sorted(
            {1, 2, 3, new} - {gone, leader})
        # The cluster still takes writes with its two voters.
        with BlockingClient(",".join(cluster.addresses[i] for i in st["voters"])) as c:
            assert c.produce_idempotent([b"after"], acks="quorum")


def test_recovery_rate_limit_is_a_validated_setting(tmp_path: Path) -> None:
    res = raftlog("serve", "--node-id", "1", "--data-dir", str(tmp_path), "--peers",
                  "1=127.0.0.1:1", "--recovery-rate", "-5")
    assert res.returncode == 2 and "recovery_rate" in res.stderr
