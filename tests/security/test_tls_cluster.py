"""A TLS cluster of real processes, started as a user starts one: `raftlog up --tls`.

It serves produce, consume and status to a client that has the CA; a plaintext client and a
client trusting another CA are refused with errors that say what to do; and a fourth node whose
certificate is not a member's cannot vote (nor disturb the members' term) and cannot be joined:
added as a learner, it never receives a byte of the log.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raft.cli import pki
from raft.cli.localcluster import free_ports, wait_for
from raft.client import BlockingClient, RaftlogError
from secfixtures import REPO, run_cli

pytestmark = pytest.mark.slow


class UpCluster:
    """`raftlog up --tls --base-port 0` in its own process, read from what it prints."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.out = data_dir / "up.out"
        data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "raft.cli", "up", "--tls", "--data-dir", str(data_dir),
                 "--base-port", "0"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        text = wait_for(lambda: self._printed("Ctrl-C stops"), "`raftlog up --tls` to report "
                        "a leader", timeout=60)
        self.addresses = {int(i): a for i, a in re.findall(r"node (\d+): (\S+)", text)}
        assert len(self.addresses) == 3, text
        self.ca = data_dir.resolve() / "tls" / "ca.pem"
        assert f"--tls-ca {self.ca}" in text.replace("\n", ""), text

    def _printed(self, marker: str) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"`raftlog up --tls` exited {self.proc.returncode}:\n"
                                 f"{self.out.read_text()}")
        text = self.out.read_text(errors="replace")
        return text if marker in text else None

    @property
    def servers(self) -> str:
        return ",".join(self.addresses.values())

    def client(self) -> BlockingClient:
        return BlockingClient(self.servers, tls_ca=str(self.ca), timeout=20)

    def node_log(self, node_id: int) -> str:
        return (self.data_dir / f"node-{node_id}.log").read_text(errors="replace")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory):
    cluster = UpCluster(tmp_path_factory.mktemp("up-tls"))
    try:
        yield cluster
    finally:
        code = cluster.stop()
        out = cluster.out.read_text()
        # Ctrl-C (SIGINT) stops every node cleanly; `up` itself exits 130, as every command
        # does after Ctrl-C (issue 29).
        assert code == 130 and "exit codes {1: 0, 2: 0, 3: 0}" in out, out


def test_up_tls_serves_produce_consume_and_status(up: UpCluster) -> None:
    tls = ["--servers", up.servers, "--tls-ca", str(up.ca)]
    res = run_cli("produce", *tls, "--json", stdin="alpha\nbeta\ngamma\n")
    assert res.returncode == 0, res.stderr
    offsets = [json.loads(line)["offset"] for line in res.stdout.splitlines()]
    assert len(offsets) == 3
    res = run_cli("consume", *tls, "--from", str(offsets[0]), "--json")
    assert res.returncode == 0, res.stderr
    got = [(r["offset"], r["value"]) for r in map(json.loads, res.stdout.splitlines())]
    assert got == list(zip(offsets, ["alpha", "beta", "gamma"]))
    # The CA from the environment, as `up --tls` suggests.
    res = run_cli("status", "--servers", up.servers, "--json",
                  env={"RAFTLOG_TLS_CA": str(up.ca)})
    assert res.returncode == 0, res.stderr
    nodes = json.loads(res.stdout)["nodes"]
    assert sorted(n["node_id"] for n in nodes) == [1, 2, 3]
    assert sum(n["role"] == "leader" for n in nodes) == 1
    assert all(n["high_watermark"] >= offsets[-1] or n["role"] != "leader" for n in nodes)


def test_a_plaintext_client_is_refused_with_a_clear_error(up: UpCluster) -> None:
    started = time.monotonic()
    res = run_cli("produce", "--servers", up.servers, stdin="x\n")
    assert res.returncode == 1
    assert "UNAUTHENTICATED" in res.stderr and "requires TLS" in res.stderr, res.stderr
    assert "--tls-ca" in res.stderr
    with pytest.raises(RaftlogError) as e:
        with BlockingClient(up.servers, timeout=20) as c:
            c.status()
    assert e.value.code == "UNAUTHENTICATED" and "requires TLS" in e.value.message
    # Refused at once, not retried until the timeout (every node would say the same).
    assert time.monotonic() - started < 20
    wait_for(lambda: any("plaintext_refused" in up.node_log(i) for i in up.addresses),
             "a node to log the refused plaintext client", timeout=10)


def test_a_client_trusting_another_ca_refuses_the_cluster(up: UpCluster,
                                                          tmp_path: Path) -> None:
    other = pki.init_ca(tmp_path / "other")
    res = run_cli("consume", "--servers", up.servers, "--tls-ca", str(other.cert))
    assert res.returncode == 1
    assert "TLS_ERROR" in res.stderr and "not trusted" in res.stderr, res.stderr
    assert "--tls-ca is the cluster's CA" in res.stderr
    with pytest.raises(RaftlogError) as e:
        with BlockingClient(up.servers, tls_ca=str(other.cert), timeout=20) as c:
            c.produce([b"never"])
    assert e.value.code == "TLS_ERROR"


def rogue(tmp: Path, cert: pki.Issued, ca: Path, addresses: dict[int, str]) -> tuple:
    """Node 4, believing itself a voter of {1, 2, 3, 4}, campaigning without pre-vote (so a
    member that listened would be pushed to a higher term). Its data directory already holds
    a term: on an empty one it would wait to be re-added and never campaign at all
    (docs/DISK-LOSS.md), which would leave the members' refusal untested."""
    from storage import open_log
    from storage.api import Meta

    seeded = open_log(tmp / "data" / "node-4")
    seeded.save_meta(Meta(term=1))
    seeded.close()
    address = f"127.0.0.1:{free_ports(1)[0]}"
    peers = ",".join(f"{i}={a}" for i, a in {**addresses, 4: address}.items())
    log_path = tmp / "rogue.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raft.cli", "serve", "--shards", "1", "--node-id", "4",
             "--data-dir",
             str(tmp / "data"), "--peers", peers, "--pre-vote", "false", "--tick-ms", "20",
             "--tls-cert", str(cert.cert), "--tls-key", str(cert.key), "--tls-ca", str(ca)],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={"PYTHONPATH": str(REPO)})
    return proc, address, log_path


def term_of(client: BlockingClient, address: str) -> int:
    """The node's term, or -1 while it does not answer yet (a refused connection is reported
    at once, not retried)."""
    try:
        return client.status(address)["term"]
    except RaftlogError:
        return -1


def member_view(up: UpCluster) -> dict[int, tuple[int, int | None, list[int]]]:
    with up.client() as c:
        out = {}
        for i, addr in up.addresses.items():
            st = c.status(addr)
            out[i] = (st["term"], st["leader_id"], sorted(st["voters"]))
        return out


def test_a_fourth_node_whose_certificate_is_not_a_members_cannot_vote_or_join(
        up: UpCluster, tmp_path: Path) -> None:
    before = member_view(up)
    # Rogue A: a certificate for node 4 from another CA. Rogue B: a genuine certificate from
    # the cluster CA, for node 4, which is not a member.
    other = tmp_path / "other"
    pki.init_ca(other)
    a_cert = pki.issue_node(other, 4)
    b_cert = pki.issue_node(up.ca.parent, 4, out=pki.Issued(tmp_path / "b.pem",
                                                            tmp_path / "b-key.pem"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a_proc, a_addr, a_log = rogue(tmp_path / "a", a_cert, other / "ca.pem", up.addresses)
    b_proc, _b_addr, _b_log = rogue(tmp_path / "b", b_cert, up.ca, up.addresses)
    top = max(v[0] for v in before.values())
    try:
        # Both campaign, their own terms climbing, and are refused: A's handshakes fail, B is
        # told it is not a member. Had one vote request got through, a member would have
        # jumped to the rogue's term.
        for addr, ca in ((a_addr, other / "ca.pem"), (_b_addr, up.ca)):
            with BlockingClient(addr, tls_ca=str(ca), timeout=20) as c:
                def campaigned() -> bool:
                    try:
                        return c.status(addr)["term"] >= top + 6
                    except RaftlogError:  # not listening yet
                        return False

                wait_for(campaigned, "a rogue to campaign", 90)
                assert c.status(addr)["role"] != "leader"
        assert "peer_tls_failed node=4" in a_log.read_text()
        wait_for(lambda: sum("claimed=4: not a member" in up.node_log(i)
                             for i in up.addresses) >= 2, "the members to refuse rogue B", 30)
        after = member_view(up)
        # Unmoved (a spontaneous election on a loaded machine may add a term or two, never
        # the rogues' six).
        assert all(after[i][0] <= top + 2 for i in after), (before, after)
        assert all(after[i][2] == [1, 2, 3] for i in after)

        # An operator adds rogue A: the change commits (a learner counts for nothing), but the
        # leader's link refuses A's certificate, so A never receives the log or a vote.
        res = run_cli("add-node", "--id", "4", "--address", a_addr, "--servers", up.servers,
                      "--tls-ca", str(up.ca))
        assert res.returncode == 0, res.stderr
        leader = json.loads(run_cli("status", "--servers", up.servers, "--tls-ca", str(up.ca),
                                    "--json").stdout)["nodes"]
        leader = next(n["node_id"] for n in leader if n["role"] == "leader")
        wait_for(lambda: "peer_tls_failed node=%d peer=4" % leader in up.node_log(leader),
                 "the leader to refuse rogue A's certificate", 30)
        with up.client() as c:
            st = c.status(up.addresses[leader])
            follower = next(f for f in st["followers"] if f["node_id"] == 4)
            assert follower["learner"] and follower["match_index"] < st["commit_index"]
            assert st["links"]["4"]["connects"] == 0
            assert sorted(st["voters"]) == [1, 2, 3] and 4 in st["learners"]
        with BlockingClient(a_addr, tls_ca=str(other / "ca.pem"), timeout=20) as c:
            assert c.status(a_addr)["dirty_offset"] <= 0  # not one record reached it
        res = run_cli("remove-node", "--id", "4", "--servers", up.servers,
                      "--tls-ca", str(up.ca))
        assert res.returncode == 0, res.stderr
    finally:
        for proc in (a_proc, b_proc):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert {i: v[2] for i, v in member_view(up).items()} == {i: [1, 2, 3] for i in (1, 2, 3)}
