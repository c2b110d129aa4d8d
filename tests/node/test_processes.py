"""Real `raftlog serve` processes on 127.0.0.1: what a user runs. SIGKILL of the leader under
quorum writes loses nothing acknowledged; SIGTERM exits cleanly; the CLI's produce/consume/status
round-trip; bad input exits non-zero with a message."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from raft.client import BlockingClient, NotLeaderError, RaftlogError
from raft.cli.demo import verify
from raft.cli.localcluster import LocalCluster, wait_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def raftlog(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "raft.cli", *args], input=stdin, text=True,
                          capture_output=True, timeout=timeout, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = LocalCluster(tmp_path_factory.mktemp("procs"), nodes=3)
    c.start()
    try:
        c.wait_leader(timeout=30)
        yield c
    finally:
        codes = c.stop()
        # SIGTERM is a clean stop: every node that was still running exits 0.
        assert all(code in (0, -9) for code in codes.values()), codes


def test_cli_produce_json_consume_and_status_round_trip(cluster: LocalCluster) -> None:
    lines = [f"line-{i}" for i in range(500)]
    res = raftlog("produce", "--servers", cluster.servers, "--json", stdin="\n".join(lines))
    assert res.returncode == 0, res.stderr
    out = [json.loads(x) for x in res.stdout.splitlines()]
    assert [o["value"] for o in out] == lines  # input order
    offsets = [o["offset"] for o in out]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    res = raftlog("consume", "--servers", cluster.servers, "--from", str(offsets[0]),
                  "--to", str(offsets[-1] + 1), "--json")
    assert res.returncode == 0, res.stderr
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert [(g["offset"], g["value"]) for g in got] == list(zip(offsets, lines))
    # --to is exclusive; without --follow reading stops at the high watermark.
    res = raftlog("consume", "--servers", cluster.servers, "--from", str(offsets[0]),
                  "--to", str(offsets[10]), "--json")
    assert [json.loads(x)["offset"] for x in res.stdout.splitlines()] == offsets[:10]

    # Values that are not UTF-8 come out base64-encoded as value_b64.
    with BlockingClient(cluster.servers) as c:
        (raw_at,) = c.produce_idempotent([b"\xff\xfe raw"], acks="quorum")
    res = raftlog("consume", "--servers", cluster.servers, "--from", str(raw_at), "--json")
    (rec,) = [json.loads(x) for x in res.stdout.splitlines()]
    assert "value" not in rec and base64.b64decode(rec["value_b64"]) == b"\xff\xfe raw"

    res = raftlog("status", "--servers", cluster.servers, "--json")
    assert res.returncode == 0, res.stderr
    st = json.loads(res.stdout)["nodes"]
    roles = sorted(s["role"] for s in st)
    assert roles == ["follower", "follower", "leader"]
    leader = next(s for s in st if s["role"] == "leader")
    assert len(leader["followers"]) == 2
    assert leader["commit_index"] >= offsets[-1]


def test_every_ack_level_reads_back_identically_from_every_node(cluster: LocalCluster) -> None:
    """Records written with quorum, leader and none acks all end up committed, and every node
    serves the same committed records at the same offsets."""
    written: dict[int, bytes] = {}
    for acks in ("quorum", "leader", "none"):
        lines = [f"{acks}-{i}" for i in range(200)]
        res = raftlog("produce", "--servers", cluster.servers, "--acks", acks, "--json",
                      stdin="\n".join(lines))
        assert res.returncode == 0, res.stderr
        for out in map(json.loads, res.stdout.splitlines()):
            written[out["offset"]] = out["value"].encode()
    # leader/none-acked data reaches followers through replication/recovery; wait for it.
    for node_id in cluster.addresses:
        cluster.wait_caught_up(node_id)
    assert verify(cluster, written) == []


def test_leader_sigkill_under_quorum_load_loses_nothing_acknowledged(
        cluster: LocalCluster) -> None:
    leader = cluster.wait_leader()
    acked: dict[int, bytes] = {}
    stop = threading.Event()
    errors: list[str] = []

    def writer(tag: int) -> None:
        with BlockingClient(cluster.servers, timeout=20) as client:
            i = 0
            while not stop.is_set():
                value = f"w{tag}-{i}".encode()
                try:
                    (off,) = client.produce_idempotent([value], acks="quorum")
                    acked[off] = value
                except RaftlogError as e:  # not acknowledged: allowed to be lost
                    errors.append(e.code)
                i += 1

    threads = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: len(acked) >= 200, "200 acknowledged writes")
    cluster.kill(leader)
    size_at_kill = len(acked)
    wait_for(lambda: len(acked) >= size_at_kill + 200, "writes to resume after the kill",
             timeout=60)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    cluster.start(leader)
    cluster.wait_caught_up(leader, timeout=60)
    assert verify(cluster, acked) == []


def test_sigterm_on_the_leader_hands_over_and_exits_zero(cluster: LocalCluster) -> None:
    leader = cluster.wait_leader()
    assert cluster.terminate(leader) == 0
    new = cluster.wait_leader(timeout=30, exclude=leader)
    assert new != leader
    cluster.start(leader)
    cluster.wait_caught_up(leader, timeout=60)


def test_not_leader_redirect_and_typed_errors(cluster: LocalCluster) -> None:
    leader = cluster.wait_leader()
    follower = next(i for i in cluster.addresses if i != leader)
    # A follower learns who leads from the leader's first append, which a loaded machine can
    # deliver after `wait_leader` returned; until then its NOT_LEADER names nobody.
    wait_for(lambda: (cluster.status_of(follower) or {}).get("leader_id") == leader,
             f"node {follower} to know its leader {leader}", 30)
    with BlockingClient(cluster.addresses[follower]) as client:
        # The client follows the redirect to the leader by itself.
        res = client.produce([b"redirected"], acks="leader")
        assert res.base_offset >= 0
        # Asking a follower directly for a write gives the typed error with the leader.
        with pytest.raises(NotLeaderError) as err:
            client._call(client._client.call, "produce", server=cluster.addresses[follower],
                         payload=b"\x91\x93\xc0\xc4\x01x\xc0", count=1, acks="leader", timeout=1)
        assert err.value.leader_id == leader
        assert err.value.leader_addr == cluster.addresses[leader]


@pytest.mark.parametrize("args, message", [
    (["produce", "--servers", "nonsense"], "HOST:PORT"),
    (["produce", "--acks", "most"], "invalid choice"),
    (["consume", "--count", "0"], "must be at least 1"),
    (["serve", "--node-id", "4", "--data-dir", "/tmp/x", "--peers", "1=127.0.0.1:1"],
     "not in peers"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_cli_input_exits_nonzero_with_a_clear_message(args: list[str], message: str) -> None:
    res = raftlog(*args)
    assert res.returncode == 2
    assert message in res.stderr


def test_produce_to_a_dead_cluster_reports_the_lines_once_and_fails() -> None:
    res = raftlog("produce", "--servers", "127.0.0.1:1", "--timeout", "1", stdin="a\nb\n")
    assert res.returncode == 1
    # One summary for the run of lines that failed alike, not one line per input line.
    assert res.stderr.count("not acknowledged") == 1
    assert "UNAVAILABLE: line" in res.stderr and "127.0.0.1:1" in res.stderr
