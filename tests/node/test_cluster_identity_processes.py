"""Cluster identity with real `raftlog serve` processes (raft/node/identity.py): a node started
on another cluster's data directory is refused at connect by both sides, naming both cluster
ids, keeps running without truncating anything, and the cluster it was pointed at keeps serving
with nothing lost; a node id that is not a member says so, naming `raftlog add-node`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raft.cli.localcluster import LocalCluster, free_ports, wait_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def raftlog(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "raft.cli", *args], input=stdin, text=True,
                          capture_output=True, timeout=timeout, env=env, cwd=REPO)


def node_status(address: str) -> dict:
    res = raftlog("status", "--servers", address, "--json", "--timeout", "5")
    assert res.returncode == 0, res.stderr
    return next(n for n in json.loads(res.stdout)["nodes"] if n["address"] == address)


def log_text(c: LocalCluster, node_id: int) -> str:
    path = c.data_dir / f"node-{node_id}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def produce(servers: str, lines: list[str]) -> list[int]:
    res = raftlog("produce", "--servers", servers, "--json", "--acks", "quorum",
                  stdin="\n".join(lines))
    assert res.returncode == 0, res.stderr
    return [json.loads(x)["offset"] for x in res.stdout.splitlines()]


def consume_all(servers: str) -> list[str]:
    res = raftlog("consume", "--servers", servers, "--from", "0", "--json")
    assert res.returncode == 0, res.stderr
    return [json.loads(x)["value"] for x in res.stdout.splitlines()]


def test_a_node_on_another_clusters_data_is_refused_and_the_cluster_loses_nothing(
        tmp_path: Path) -> None:
    a = LocalCluster(tmp_path / "a", nodes=3)
    b = LocalCluster(tmp_path / "b", nodes=3)
    foreign: LocalCluster | None = None
    try:
        a.start()
        b.start()
        a.wait_leader(timeout=60)
        b.wait_leader(timeout=60)
        a_lines = [f"a-{i}" for i in range(50)]
        produce(a.servers, a_lines)
        produce(b.servers, [f"b-{i}" for i in range(80)])  # b's log is longer: a follower would cut
        id_a = wait_for(lambda: node_status(a.addresses[1]).get("cluster_id"), "a's id")
        id_b = wait_for(lambda: node_status(b.addresses[3]).get("cluster_id"), "b's id")
        assert id_a != id_b and len(id_a) == 32
        assert all(node_status(a.addresses[i])["cluster_id"] == id_a for i in (2, 3))
        b.stop()
        a.terminate(3)
        # Node 3 of cluster a, started on node 3's data directory of cluster b.
        foreign = LocalCluster(b.data_dir, nodes=3)
        foreign.addresses = dict(a.addresses)
        foreign.start(3)

        def refused_both_ways() -> bool:
            mine, theirs = log_text(a, 1), log_text(foreign, 3)
            return all(id_a in t and id_b in t and "peer_refused" in t
                       for t in (mine, theirs))
        wait_for(refused_both_ways, "the refusal logged on both sides", timeout=60)
        for text in (log_text(a, 1), log_text(foreign, 3)):
            assert "wipe" in text and "--data-dir" in text
            assert "InvariantViolation" not in text and "truncat" not in text.lower()
        st = wait_for(lambda: (s := node_status(a.addresses[3])).get("refused_peers") and s,
                      "the foreign node's status")
        assert st["cluster_id"] == id_b
        assert any(id_a in why for why in st["refused_peers"].values())
        text = raftlog("status", "--servers", a.servers, "--timeout", "5").stdout
        assert "refuse each other" in text and id_a in text and id_b in text

        # The original cluster keeps serving, nothing lost; the foreign node never crashed.
        more = [f"a-more-{i}" for i in range(20)]
        # (Through the members: the foreign node still serves cluster b's log to whoever asks
        # it directly.)
        members = f"{a.addresses[1]},{a.addresses[2]}"
        produce(members, more)
        assert consume_all(members) == a_lines + more
        assert foreign.alive(3), log_text(foreign, 3)[-2000:]
        # It kept its own data: cluster b's log, untouched.
        assert node_status(a.addresses[3])["dirty_offset"] >= 79
    finally:
        for c in (foreign, a, b):
            if c is not None:
                c.stop()


def test_a_node_that_is_not_a_member_says_so_naming_add_node(tmp_path: Path) -> None:
    a = LocalCluster(tmp_path / "a", nodes=3)
    try:
        a.start()
        a.wait_leader(timeout=60)
        # Node 4 started as if it were a founder (no --join), but the cluster never added it.
        a.addresses[4] = f"127.0.0.1:{free_ports(1)[0]}"
        a.start(4)
        wait_for(lambda: "raftlog add-node --id 4" in log_text(a, 4),
                 "node 4 logging that it is not a member", timeout=60)
        assert "not a member" in log_text(a, 4)
        assert "raftlog add-node --id 4" in log_text(a, 1)  # the member side says so too
        st = wait_for(lambda: (s := node_status(a.addresses[4])).get("not_member") and s,
                      "node 4's status")
        assert "raftlog add-node --id 4" in st["not_member"]
        text = raftlog("status", "--servers", a.addresses[4], "--timeout", "5").stdout
        assert "not a member" in text and "add-node" in text
        assert a.alive(4)
    finally:
        a.stop()
