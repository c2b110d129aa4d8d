"""Subscriptions on real `raftlog serve` processes, driven through the `raftlog` CLI as a user
would: a consumer resumes at the committed position after the leader is SIGKILLed (no gap, at
most the uncommitted tail again), `consume --subscription` round trips, and the
`subscriptions` command lists, resets and deletes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raft.cli.localcluster import LocalCluster
from raft.client import BlockingClient

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TOTAL = 100_000
BATCH = 10_000


def raftlog(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "raft.cli", *args], text=True,
                          capture_output=True, timeout=timeout, env=env, cwd=REPO)


def lines(res: subprocess.CompletedProcess) -> list[dict]:
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in res.stdout.splitlines()]


def subscriptions(servers: str) -> dict[str, dict]:
    res = raftlog("subscriptions", "--servers", servers, "--json")
    assert res.returncode == 0, res.stderr
    return {s["name"]: s for s in json.loads(res.stdout)["subscriptions"]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = LocalCluster(tmp_path_factory.mktemp("subs"), nodes=3)
    c.start()
    try:
        c.wait_leader(timeout=30)
        yield c
    finally:
        c.stop()


def test_consumer_resumes_at_the_committed_position_after_the_leader_is_killed(
        cluster: LocalCluster) -> None:
    with BlockingClient(cluster.servers, timeout=30) as client:
        offsets: dict[str, int] = {}
        for start in range(0, TOTAL, BATCH):  # batched: a few requests, not 100k
            values = [f"r{i}" for i in range(start, start + BATCH)]
            res = client.produce([v.encode() for v in values], acks="quorum")
            offsets.update((v, res.base_offset + k) for k, v in enumerate(values))
    order = [offsets[f"r{i}"] for i in range(TOTAL)]

    # 1. Half of it, committed as printed; the process exits.
    first = lines(raftlog("consume", "--servers", cluster.servers, "--subscription", "s",
                          "--count", str(TOTAL // 2), "--json"))
    assert [r["offset"] for r in first] == order[:TOTAL // 2]
    assert subscriptions(cluster.servers)["s"]["position"] == order[TOTAL // 2 - 1] + 1

    # 2. A second consumer reads on and commits every 50 ms; the leader and that consumer are
    #    killed while it is printing.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "raft.cli", "consume", "--servers",
                             cluster.servers, "--subscription", "s", "--json", "--follow",
                             "--commit-ms", "50"], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    second: list[dict] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        second.append(json.loads(line))
        if len(second) == TOTAL // 5:
            break
    leader = cluster.wait_leader()
    cluster.kill(leader)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    second.extend(json.loads(x) for x in proc.stdout.read().splitlines() if x.endswith("}"))
    proc.stdout.close()
    printed_upto = second[-1]["offset"] + 1

    # 3. A new consumer process, pointed at a surviving node only, resumes at the committed
    #    position: nothing before it is skipped; what it repeats is the uncommitted tail.
    survivor = cluster.addresses[next(i for i in cluster.addresses if i != leader)]
    committed = subscriptions(survivor)["s"]["position"]
    assert order[TOTAL // 2] <= committed <= printed_upto
    third = lines(raftlog("consume", "--servers", survivor, "--subscription", "s", "--json"))
    assert third[0]["offset"] == committed  # exactly at the committed position
    assert [r["offset"] for r in third] == [o for o in order if o >= committed]
    kept = [r for r in second if r["offset"] < committed]
    repeated = [r for r in second if r["offset"] >= committed]  # read after the last commit
    assert [r["offset"] for r in repeated] == [r["offset"] for r in third[:len(repeated)]]
    assert [r["value"] for r in first + kept + third] == \
        [f"r{i}" for i in range(TOTAL)]  # every record, in order, none skipped

    after = subscriptions(survivor)["s"]
    assert after["lag_records"] == 0 and after["lag_bytes"] == 0
    cluster.start(leader)
    cluster.wait_caught_up(leader, timeout=120)


def test_cli_consume_subscription_round_trip_and_subscriptions_commands(
        cluster: LocalCluster) -> None:
    with BlockingClient(cluster.servers) as client:
        res = client.produce([f"cli-{i}".encode() for i in range(30)])
    base = res.base_offset
    run1 = lines(raftlog("consume", "--servers", cluster.servers, "--subscription", "cli",
                         "--from", str(base), "--count", "10", "--json"))
    run2 = lines(raftlog("consume", "--servers", cluster.servers, "--subscription", "cli",
                         "--count", "10", "--json"))
    assert [r["value"] for r in run1] == [f"cli-{i}" for i in range(10)]
    assert [r["value"] for r in run2] == [f"cli-{i}" for i in range(10, 20)]

    listed = subscriptions(cluster.servers)["cli"]
    assert listed["position"] == base + 20 and listed["lag_records"] >= 10
    assert listed["last_commit_age_ms"] is not None and listed["last_committer"]
    table = raftlog("subscriptions", "--servers", cluster.servers)
    assert table.returncode == 0 and "cli" in table.stdout

    reset = raftlog("subscriptions", "--servers", cluster.servers, "reset", "cli", "--to",
                    str(base + 5))
    assert reset.returncode == 0, reset.stderr
    run3 = lines(raftlog("consume", "--servers", cluster.servers, "--subscription", "cli",
                         "--count", "2", "--json"))
    assert [r["value"] for r in run3] == ["cli-5", "cli-6"]
    assert raftlog("subscriptions", "delete", "cli", "--servers", cluster.servers
                   ).returncode == 0
    bad = raftlog("consume", "--servers", cluster.servers, "--subscription", "cli",
                  "--exclusive", "--from-end", "--from", "3")
    assert bad.returncode == 2 and "give one of --from" in bad.stderr
