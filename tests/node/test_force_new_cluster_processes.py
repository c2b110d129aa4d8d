"""`raftlog recover --force-new-cluster` on real processes (docs/DISK-LOSS.md, "A lost
majority: force a new cluster").

A 3-node cluster loses two nodes' data for good (SIGKILL, data directories deleted): no
majority can form. The survivor is stopped and forced into a new single-voter cluster; started
again it leads alone and serves everything it had; the two others, started on empty
directories, are re-added with `raftlog add-node` and catch up. The command refuses while the
node runs (its data directory is locked) and without --yes (nothing changes then).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_helpers import raftlog
from raft.cli.localcluster import LocalCluster, wait_for
from raft.cli.recover import AUDIT_FILE
from raft.client import BlockingClient
from test_disk_loss_processes import node_dir, status, wait_whole, write

pytestmark = pytest.mark.slow


def read_all(cluster: LocalCluster, node_id: int, upto: int,
             timeout: float = 60.0) -> dict[int, bytes]:
    """Every record of `node_id` up to offset `upto`. A node serves only what it knows is
    committed (its high watermark): a forced leader commits its old log only once an entry of
    its own term commits, and a follower learns the commit index from the leader's next
    message. So first wait, bounded, until its high watermark covers `upto`; an empty fetch
    after that is a real gap, and the caller's comparison reports it."""
    wait_for(lambda: status(cluster, node_id).get("high_watermark", -1) >= upto,
             f"node {node_id}'s high watermark to reach offset {upto}", timeout)
    address = cluster.addresses[node_id]
    out: dict[int, bytes] = {}
    with BlockingClient(address, timeout=20) as c:
        offset = 0
        while offset <= upto:
            res = c.fetch(offset, max_bytes=4 << 20, address=address)
            out.update({r.offset: r.value for r in res.records})
            if res.next_offset <= offset:
                break
            offset = res.next_offset
    return out


def test_a_survivor_forced_into_a_new_cluster_leads_alone_then_the_others_rejoin(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        leader = cluster.wait_leader()
        survivor, *lost = sorted(cluster.addresses)
        acked: dict[int, bytes] = {}
        with BlockingClient(cluster.servers, timeout=20) as c:
            write(c, acked, "before", 100)
        wait_for(lambda: status(cluster, survivor).get("flushed_offset", -1) >= max(acked),
                 "the survivor to hold every acknowledged write")
        for n in lost:
            cluster.kill(n)
            shutil.rmtree(node_dir(cluster, n))
        assert leader is not None
        args = ("recover", "--force-new-cluster", "--data-dir", str(cluster.data_dir),
                "--node-id", str(survivor))

        running = raftlog(*args, "--yes")
        assert running.returncode == 2, running.stderr
        assert "is running" in running.stderr and "stop it first" in running.stderr

        assert cluster.terminate(survivor) == 0
        unconfirmed = raftlog(*args)
        assert unconfirmed.returncode == 2, unconfirmed.stderr
        assert "flushed log up to offset" in unconfirmed.stderr
        assert "LOST" in unconfirmed.stderr and "--yes" in unconfirmed.stderr
        assert not (node_dir(cluster, survivor) / AUDIT_FILE).exists(), "it changed something"

        forced = raftlog(*args, "--yes", "--json")
        assert forced.returncode == 0, forced.stderr
        result = json.loads(forced.stdout)
        assert result["forced"] and result["removed"] == lost
        assert result["kept_upto"] >= max(acked)
        audit = (node_dir(cluster, survivor) / AUDIT_FILE).read_text().splitlines()
        assert json.loads(audit[-1])["action"] == "force-new-cluster"

        cluster.start(survivor)
        wait_for(lambda: status(cluster, survivor).get("role") == "leader",
                 "the forced survivor to lead alone", 60)
        st = status(cluster, survivor)
        assert st["voters"] == [survivor]
        got = read_all(cluster, survivor, max(acked))
        assert all(got.get(off) == v for off, v in acked.items()), "the survivor lost data"
        with BlockingClient(cluster.addresses[survivor], timeout=20) as c:
            write(c, acked, "alone", 20)

        for n in lost:
            cluster.start(n)
            added = raftlog("add-node", "--id", str(n), "--address", cluster.addresses[n],
                            "--servers", cluster.addresses[survivor], "--timeout", "30")
            assert added.returncode == 0, added.stderr
            wait_whole(cluster, n, timeout=90)
        assert sorted(status(cluster, survivor)["voters"]) == sorted(cluster.addresses)
        with BlockingClient(cluster.servers, timeout=20) as c:
            write(c, acked, "three-again", 20)
        upto = max(acked)
        for n in cluster.addresses:
            got = read_all(cluster, n, upto)
            assert all(got.get(off) == v for off, v in acked.items()), f"node {n} lacks data"
