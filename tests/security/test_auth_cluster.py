"""Authenticated clients and metrics on a TLS cluster of real `raftlog serve` processes started
with an auth file, `--metrics-listen` and `--log-format json`.

A token with only `consume` gets FORBIDDEN on produce and on remove-node and still reads (on
the same connection); a wrong token gets UNAUTHENTICATED; a rotated token works after SIGHUP,
without a restart, and the old one stops working. /metrics parses with prometheus_client's
parser and its offsets agree with `raftlog status --json`. Logs are JSON lines with node, term
and event, and no secret appears in logs or status.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from raft.cli.localcluster import LocalCluster, free_ports, wait_for
from raft.client import (AuthenticationError, BlockingClient, PermissionDeniedError,
                         RaftlogError)
from secfixtures import Pki, gauge, make_pki, run_cli, scrape

pytestmark = pytest.mark.slow


class AuthCluster:
    def __init__(self, root: Path) -> None:
        self.pki: Pki = make_pki(root / "pki")
        self.metrics = {i: f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3), start=1)}
        ops = self.pki.client("ops")
        self.cluster = LocalCluster(
            root / "data", nodes=3,
            extra_args=["--auth-file", str(self.pki.auth_file), "--log-format", "json",
                        "--log-level", "INFO"],
            node_args=lambda i: [*self.pki.node_flags(i), "--metrics-listen", self.metrics[i]],
            client_options={"tls_ca": str(self.pki.ca), "tls_cert": str(ops.cert),
                            "tls_key": str(ops.key)})

    def client(self, token: str) -> BlockingClient:
        return BlockingClient(self.cluster.servers, tls_ca=str(self.pki.ca), token=token,
                              timeout=20)

    def cli(self, *args: str, token: str | None = None, stdin: str = ""):
        env = {"RAFTLOG_TLS_CA": str(self.pki.ca)}
        if token is not None:
            env["RAFTLOG_TOKEN"] = token
        return run_cli(*args, "--servers", self.cluster.servers, stdin=stdin, env=env)


@pytest.fixture(scope="module")
def auth(tmp_path_factory: pytest.TempPathFactory):
    c = AuthCluster(tmp_path_factory.mktemp("auth-cluster"))
    c.cluster.start()
    try:
        c.cluster.wait_leader(timeout=60)
        yield c
    finally:
        codes = c.cluster.stop()
        assert all(code == 0 for code in codes.values()), codes


def test_a_consume_only_token_reads_but_cannot_write_or_administer(auth: AuthCluster) -> None:
    res = auth.cli("produce", "--json", token=auth.pki.tokens["writer"], stdin="one\ntwo\n")
    assert res.returncode == 0, res.stderr
    first = json.loads(res.stdout.splitlines()[0])["offset"]
    reader = auth.pki.tokens["reader"]

    res = auth.cli("produce", token=reader, stdin="nope\n")
    assert res.returncode == 1 and "FORBIDDEN" in res.stderr, res.stderr
    assert "lacks the produce permission" in res.stderr
    res = auth.cli("remove-node", "--id", "3", token=reader)
    assert res.returncode == 1 and "FORBIDDEN" in res.stderr, res.stderr
    assert "lacks the admin permission" in res.stderr
    res = auth.cli("consume", "--from", str(first), "--json", token=reader)
    assert res.returncode == 0, res.stderr
    assert [json.loads(x)["value"] for x in res.stdout.splitlines()][:2] == ["one", "two"]

    # The refusal does not cost the connection: the same client reads right after.
    with auth.client(reader) as c:
        with pytest.raises(PermissionDeniedError) as e:
            c.produce([b"nope"])
        assert e.value.permission == "produce"
        with pytest.raises(PermissionDeniedError) as e:
            c.remove_node(3)
        assert e.value.permission == "admin"
        conns = dict(c._client._conns)
        assert [r.value for r in c.fetch(first).records][:2] == [b"one", b"two"]
        assert all(not conn.broken for conn in conns.values())
        assert all(c._client._conns[a] is conn for a, conn in conns.items())
    assert sorted(auth.cluster.client.status()["voters"]) == [1, 2, 3]


def test_a_wrong_token_is_unauthenticated_at_once(auth: AuthCluster) -> None:
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as e:
        with auth.client("rl_" + "x" * 43) as c:
            c.status()
    assert "not valid" in e.value.message
    assert time.monotonic() - started < 20  # refused, not retried until the timeout
    res = auth.cli("consume", token="rl_wrong")
    assert res.returncode == 1 and "UNAUTHENTICATED" in res.stderr, res.stderr
    res = auth.cli("consume")  # neither a token nor a certificate
    assert res.returncode == 1 and "requires authentication" in res.stderr, res.stderr


def test_a_rotated_token_works_after_sighup_without_a_restart(auth: AuthCluster) -> None:
    old = auth.pki.tokens["reader"]
    pids = {i: p.pid for i, p in auth.cluster.procs.items()}
    res = run_cli("token", "create", "--auth-file", str(auth.pki.auth_file), "--principal",
                  "reader", "--replace")
    assert res.returncode == 0, res.stderr
    new = res.stdout.strip()
    assert new and new not in auth.pki.auth_file.read_text()
    with pytest.raises(AuthenticationError):  # not before the nodes reload
        with auth.client(new) as c:
            c.status(auth.cluster.addresses[1])
    with auth.client(old) as c:
        held = c.fetch(0)  # a connection opened with the old token, kept across the reload
        for proc in auth.cluster.procs.values():
            proc.send_signal(signal.SIGHUP)

        def new_token_works() -> bool:
            for addr in auth.cluster.addresses.values():
                try:
                    with auth.client(new) as fresh:
                        fresh.fetch(0, address=addr)
                except AuthenticationError:
                    return False
            return True

        wait_for(new_token_works, "every node to accept the rotated token", 30)
        with pytest.raises(RaftlogError) as e:  # the open connection's token is revoked
            c.fetch(held.next_offset - 1 if held.next_offset else 0)
        assert e.value.code == "UNAUTHENTICATED" and "revoked" in e.value.message
    with pytest.raises(AuthenticationError):
        with auth.client(old) as c:
            c.status()
    assert {i: p.pid for i, p in auth.cluster.procs.items()} == pids
    assert all(auth.cluster.alive(i) for i in pids)
    for i in pids:
        assert "auth_reloaded" in auth.cluster.node_log(i)
    auth.pki.tokens["reader"] = new


def test_metrics_parse_and_agree_with_status(auth: AuthCluster) -> None:
    res = auth.cli("produce", "--acks", "quorum", token=auth.pki.tokens["writer"],
                   stdin="".join(f"m{i}\n" for i in range(50)))
    assert res.returncode == 0, res.stderr

    def settled() -> list[dict] | None:
        res = auth.cli("status", "--json", token=auth.pki.tokens["nobody"])
        nodes = json.loads(res.stdout)["nodes"]
        leader = [n for n in nodes if n.get("role") == "leader"]
        if len(leader) != 1 or any(n.get("commit_index") != leader[0]["dirty_offset"]
                                   for n in nodes):
            return None
        return nodes

    nodes = wait_for(settled, "every node to commit everything", 30)
    for n in nodes:
        samples = scrape(auth.metrics[n["node_id"]])
        for key in ("dirty_offset", "flushed_offset", "commit_index", "high_watermark",
                    "start_offset", "term"):
            assert gauge(samples, f"raftlog_{key}") == n[key], (n["node_id"], key)
        assert gauge(samples, "raftlog_role", role=n["role"]) == 1
        assert gauge(samples, "raftlog_open_connections", kind="peer") >= 2
        assert gauge(samples, "raftlog_fsync_latency_seconds_count") > 0
        # Every flush is a store commit; so are metadata saves (the node's fsyncs).
        assert gauge(samples, "raftlog_fsyncs_total") >= gauge(
            samples, "raftlog_fsync_latency_seconds_count")
        if n["role"] == "leader":
            assert gauge(samples, "raftlog_produce_latency_seconds_count", acks="quorum") > 0
            assert gauge(samples, "raftlog_elections_won_total") >= 1
            for f in n["followers"]:
                lag = gauge(samples, "raftlog_follower_lag_offsets", follower=str(f["node_id"]),
                            kind="match")
                assert lag == n["dirty_offset"] - f["match_index"] == 0
                assert gauge(samples, "raftlog_follower_replicated_bytes_total",
                             follower=str(f["node_id"])) > 0
        assert "process_cpu_seconds_total" in samples
    # Errors by code, from the refusals of the other tests.
    all_errors = [s for n in nodes for s in scrape(auth.metrics[n["node_id"]])
                  .get("raftlog_errors_total", [])]
    assert {s.labels["code"] for s in all_errors} >= {"FORBIDDEN", "UNAUTHENTICATED"}


def test_logs_are_json_lines_with_node_term_and_event_and_no_secret(auth: AuthCluster) -> None:
    secrets = list(auth.pki.tokens.values())
    for i in auth.cluster.addresses:
        lines = [json.loads(x) for x in auth.cluster.node_log(i).splitlines()
                 if x.startswith("{")]
        assert lines, auth.cluster.node_log(i)[-2000:]
        assert all({"node", "term", "event", "level", "ts"} <= set(x) for x in lines)
        started = [x for x in lines if x["event"] == "node_started"]
        assert started and started[0]["node"] == i and started[0]["tls"] == "True"
        assert any(x["event"] == "state_changed" and isinstance(x["term"], int) for x in lines)
        text = auth.cluster.node_log(i)
        assert all(s not in text for s in secrets)
    res = auth.cli("status", "--json", token=auth.pki.tokens["nobody"])
    assert res.returncode == 0 and all(s not in res.stdout for s in secrets)


def test_a_tls_and_token_profile_reaches_the_secured_cluster(auth: AuthCluster,
                                                             tmp_path: Path) -> None:
    """Client profiles (issue 29 item 4): the CA, a client certificate and a token file saved
    once; the commands then need no flags and no RAFTLOG_* variables. A flag still wins."""
    env = {"RAFTLOG_CONFIG_DIR": str(tmp_path / "config")}
    writer = tmp_path / "writer.token"
    writer.write_text(auth.pki.tokens["writer"] + "\n")
    res = run_cli("profile", "create", "secure", "--servers", auth.cluster.servers,
                  "--tls-ca", str(auth.pki.ca), "--token-file", str(writer), "--use", env=env)
    assert res.returncode == 0, res.stderr
    assert auth.pki.tokens["writer"] not in (tmp_path / "config" / "profiles.toml").read_text()

    res = run_cli("produce", "--json", stdin="via-profile\n", env=env)
    assert res.returncode == 0, res.stderr
    # A token given now beats the profile's token file.
    res = run_cli("produce", "--token", auth.pki.tokens["reader"], stdin="x\n", env=env)
    assert res.returncode == 1 and "FORBIDDEN" in res.stderr, res.stderr
    # Mutual TLS from a profile: the ops certificate and token read the status.
    ops = auth.pki.client("ops")
    token = tmp_path / "ops.token"
    token.write_text(auth.pki.tokens["ops"])
    res = run_cli("profile", "create", "ops", "--servers", auth.cluster.servers,
                  "--tls-ca", str(auth.pki.ca), "--tls-cert", str(ops.cert),
                  "--tls-key", str(ops.key), "--token-file", str(token), env=env)
    assert res.returncode == 0, res.stderr
    res = run_cli("status", "--json", "--profile", "ops", env=env)
    assert res.returncode == 0, res.stderr
    assert all("role" in n for n in json.loads(res.stdout)["nodes"]), res.stdout
    # Without the profile the same command speaks plaintext to a TLS cluster and fails.
    res = run_cli("status", "--servers", auth.cluster.servers,
                  env={"RAFTLOG_CONFIG_DIR": str(tmp_path / "empty")})
    assert res.returncode == 1, res.stderr
