"""`raftlog up` and the operator commands, as a user runs them: one owner per data dir (a second
`serve` or `up` is refused and the running cluster is untouched), the export line, a SIGKILLed
node reported while the others keep serving (and restarted, with --restart), status with a node
down, transfer-leader and add-node output, and the demo's failover figure.

One `up` cluster is shared by the module; the test that kills a node runs last."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import REPO, UpCluster, cli, env, free_base_port, raftlog, wait_for
from raft.client import BlockingClient, RaftlogError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    cluster = UpCluster(tmp_path_factory.mktemp("up") / "data")
    try:
        yield cluster
    finally:
        assert cluster.stop() == 0, cluster.err[-20:]
    assert cluster.wait_line(r"^stopped: exit codes")


def statuses(servers: str) -> dict[int, dict]:
    """node id -> status, of the nodes that answer (what `status --json` prints)."""
    res = cli("status", "--servers", servers, "--json")
    assert res.returncode == 0, res.stderr
    return {n["node_id"]: n for n in json.loads(res.stdout)["nodes"] if "error" not in n}


def leader_of(servers: str) -> int:
    def find() -> int | None:
        leaders = [i for i, st in statuses(servers).items() if st["role"] == "leader"]
        return leaders[0] if len(leaders) == 1 else None
    return wait_for(find, "one leader")


def test_up_prints_whole_hint_lines_and_the_export_line_serves_later_commands(
        up: UpCluster) -> None:
    # Off a terminal each hint is one whole line (the try line names every server).
    assert up.servers in up.wait_line(r"^try: ").string
    assert up.wait_line(r"^Ctrl-C stops every node cleanly\.$")
    via_env = {"RAFTLOG_SERVERS": up.servers}
    res = raftlog("produce", stdin="via-env\n", extra_env=via_env)  # no --servers
    assert res.returncode == 0, res.stderr
    offset = int(res.stdout)
    res = raftlog("consume", "--from", str(offset), extra_env=via_env)
    assert res.stdout == f"{offset}\tvia-env\n"
    res = raftlog("config", "show", "--json", extra_env=via_env)
    rows = {r["setting"]: r for r in json.loads(res.stdout)["settings"]}
    assert rows["servers (client)"]["value"] == up.servers
    assert rows["servers (client)"]["source"] == "env RAFTLOG_SERVERS"


def test_a_second_serve_on_a_live_nodes_data_dir_exits_2_and_the_first_keeps_serving(
        up: UpCluster) -> None:
    pid1 = up.pid(1)
    peers = ",".join(f"{i}={a}" for i, a in up.addresses.items())
    spare = f"127.0.0.1:{free_base_port(1)}"  # its own port: only the data dir is shared
    res = raftlog("serve", "--shards=1", "--node-id", "1", "--data-dir", str(up.data_dir),
                  "--peers", peers, "--listen", spare)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # one clear line, no traceback
    assert f"pid {pid1}" in lines[0] and "stop it first" in lines[0]
    assert str(up.data_dir / "node-1") in lines[0]
    # Node 1 is the same process and still serves: a quorum write reads back from it.
    os.kill(pid1, 0)
    with BlockingClient(up.servers, timeout=30) as c:
        (off,) = c.produce_idempotent([b"after-second-serve"], acks="quorum")
        wait_for(lambda: c.status(up.addresses[1])["high_watermark"] >= off,
                 "node 1 to commit the write")
        got = c.fetch(off, address=up.addresses[1]).records
        assert got[0].value == b"after-second-serve"
        assert c.status(up.addresses[1])["node_id"] == 1


def test_a_second_up_on_the_same_dir_or_ports_refuses_and_touches_nothing(
        up: UpCluster, tmp_path: Path) -> None:
    logs_before = {p.name: p.read_bytes() for p in up.data_dir.glob("node-*.log")}
    before = statuses(up.servers)
    res = raftlog("up", "--data-dir", str(up.data_dir), "--base-port", str(up.base_port))
    assert res.returncode == 2, res
    assert "another `raftlog up`" in res.stderr and f"pid {up.proc.pid}" in res.stderr
    # Another data dir on the same ports: refused before anything starts there either.
    other = tmp_path / "other"
    res = raftlog("up", "--data-dir", str(other), "--base-port", str(up.base_port))
    assert res.returncode == 2, res
    assert f"port {up.base_port} (node 1) is in use" in res.stderr
    assert not list(other.glob("node-*"))
    # The running cluster: same node log files, same terms and offsets, every node up.
    assert {p.name: p.read_bytes() for p in up.data_dir.glob("node-*.log")} == logs_before
    after = statuses(up.servers)
    assert sorted(after) == sorted(before) == [1, 2, 3]
    for i in after:
        assert after[i]["term"] == before[i]["term"]
        assert after[i]["dirty_offset"] >= before[i]["dirty_offset"]


def test_transfer_leader_prints_the_new_leader(up: UpCluster) -> None:
    leader = leader_of(up.servers)
    target = next(i for i in up.addresses if i != leader)
    res = raftlog("transfer-leader", "--to", str(target), "--servers", up.servers)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"node {target} ({up.addresses[target]}) leads now"
    res = raftlog("transfer-leader", "--to", str(leader), "--servers", up.servers, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"leader_id": leader, "leader_addr": up.addresses[leader]}


def test_add_node_warns_when_the_node_is_not_running_and_says_how_it_catches_up(
        up: UpCluster) -> None:
    address = f"127.0.0.1:{free_base_port(1)}"
    res = raftlog("add-node", "--id", "4", "--address", address, "--servers", up.servers)
    assert res.returncode == 0, res.stderr
    assert f"warning: node 4 does not answer at {address}" in res.stderr
    assert "--join" in res.stderr and "recovery catches it up" in res.stderr
    assert res.stdout.startswith(f"added node 4 ({address}) as a learner; voters [1, 2, 3], "
                                 f"learners [4]")
    res = raftlog("remove-node", "--id", "4", "--servers", up.servers, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["removed"] == 4 and out["voters"] == [1, 2, 3] and out["learners"] == []


def test_up_survives_a_sigkilled_node_and_status_lists_it_at_once(up: UpCluster) -> None:
    victim = next(i for i in up.addresses if i != leader_of(up.servers))
    os.kill(up.pid(victim), signal.SIGKILL)
    up.wait_line(rf"^node {victim} was killed by SIGKILL after \d+ s; the others keep running")
    restart = up.wait_line(r"^restart it with: raftlog (serve .*) >> (\S+) 2>&1 &$")
    assert up.proc.poll() is None  # `up` goes on
    res = raftlog("produce", "--servers", up.servers, stdin="with-one-down\n")
    assert res.returncode == 0, res.stderr
    # A refused node costs no waiting: a huge --timeout still returns (within the test's
    # subprocess deadline), with the dead node listed apart and the others complete.
    res = raftlog("status", "--servers", up.servers, "--timeout", "3600",
                  extra_env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert f"node {victim} at {up.addresses[victim]} did not answer" in res.stdout
    for i, addr in up.addresses.items():
        if i != victim:
            assert addr in res.stdout
    assert "…" not in res.stdout  # nothing cut off at 80 columns
    # The printed command brings it back (run here by the test, not by `up`).
    args = restart.group(1).split()
    with open(restart.group(2), "ab") as log:
        node = subprocess.Popen([sys.executable, "-m", "raft.cli", *args], cwd=REPO, env=env(),
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        with BlockingClient(up.servers, timeout=30) as c:
            (off,) = c.produce_idempotent([b"after-restart"], acks="quorum")

            def caught_up() -> bool:
                try:
                    return c.status(up.addresses[victim])["high_watermark"] >= off
                except RaftlogError:
                    return False
            wait_for(caught_up, f"node {victim} to restart and catch up")
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0


def test_up_restart_brings_a_killed_node_back(tmp_path: Path) -> None:
    """One node is enough to see --restart work (and keeps the test cheap): even with every
    node down, `up --restart` goes on and brings it back with its log."""
    cluster = UpCluster(tmp_path / "data", 1, "--restart")
    try:
        res = raftlog("produce", "--servers", cluster.servers, stdin="before-kill\n")
        assert res.returncode == 0, res.stderr
        old = cluster.pid(1)
        os.kill(old, signal.SIGKILL)
        cluster.wait_line(r"^node 1 was killed by SIGKILL")
        cluster.wait_line(r"^restarting node 1 in \d+ s$")
        new = int(cluster.wait_line(r"^node 1 restarted: pid (\d+)$").group(1))
        assert new != old
        with BlockingClient(cluster.servers, timeout=30) as c:
            wait_for(lambda: _readable(c, int(res.stdout)), "node 1 to serve its log again")
        assert cluster.proc.poll() is None
    finally:
        assert cluster.stop() == 0


def _readable(c: BlockingClient, offset: int) -> bool:
    try:
        return [r.value for r in c.fetch(offset).records[:1]] == [b"before-kill"]
    except RaftlogError:
        return False


def test_demo_measures_failover_from_the_kill() -> None:
    """The figure counts from the killed process's end to the first acknowledgement of a
    write sent after it. That cannot be under 50 ms: the followers learn of the death when
    their links' next dial is refused, after a reconnect backoff of at least 50 ms, and then
    campaign (raft/core/quiesce.py `_campaign_soon`) and elect. The old figure (0.00 s)
    counted a write the dying leader had acknowledged."""
    res = raftlog("demo", "--records", "100", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    m = re.search(r"writes succeeded again (\d+\.\d+) s after the kill", res.stdout)
    assert m, res.stdout
    assert float(m.group(1)) >= 0.05, m.group(0)
    # The topic step: keyed records over 4 partitions, each key in its partition, read back.
    assert "each key in its partition, in order, read" in res.stdout, res.stdout[-3000:]
