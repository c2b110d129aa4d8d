"""`raftlog up` with node settings (issue 29, items 3 and 5): --server-arg (with {id}) and
--config reach every node, checked before anything starts; a node restarted by hand with the
command `up` prints is watched, and Ctrl-C stops every process `up` started or adopted (exit
130); `status` with a wrong token reports UNAUTHENTICATED with a token hint, not UNAVAILABLE's
"start a cluster"."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from cli_helpers import REPO, UpCluster, env, raftlog, wait_for
from raft.cli.localcluster import free_ports

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    """The process has ended (a zombie no reaper collected counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _metrics_prefix() -> tuple[str, int]:
    """'HOST:P' such that ports P1, P2, P3 ({id} = 1..3) are free now: a text prefix for
    --server-arg=--metrics-listen=HOST:P{id}."""
    base = free_ports(20, consecutive=True)[0]
    tens = -(-base // 10)  # the first multiple of 10 at or after base, over 10
    return f"127.0.0.1:{tens}", tens * 10


def test_up_passes_settings_to_every_node_watches_a_hand_restarted_node_and_ctrl_c_stops_all(
        tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    res = raftlog("token", "create", "--auth-file", str(auth), "--principal", "ops",
                  "--permissions", "produce,consume,admin")
    assert res.returncode == 0, res.stderr
    token = res.stdout.strip()
    config = tmp_path / "nodes.toml"
    config.write_text(f'auth_file = "{auth}"\nretention_ms = "7d"\n')
    prefix, metrics0 = _metrics_prefix()
    up = UpCluster(tmp_path / "data", 3, "--tls", "--config", str(config),
                   f"--server-arg=--metrics-listen={prefix}{{id}}",
                   "--server-arg=--retention-bytes=64MiB")
    adopted_pid = None
    try:
        ca = str(tmp_path / "data" / "tls" / "ca.pem")
        assert up.wait_line(r"^auth on \(")
        # Every node runs with the file's and the arguments' settings (its start line says so)
        # and serves its own metrics port.
        for i in (1, 2, 3):
            log = up.data_dir / f"node-{i}.log"
            line = wait_for(lambda: re.search(r"^raftlog serve: TLS on.*$", log.read_text(),
                                              re.M), f"node {i}'s start line")
            assert f"auth on ({auth})" in line.group(0)
            assert f"metrics on at http://127.0.0.1:{metrics0 + i}/metrics" in line.group(0)
            assert "retention on (keeps at most 67,108,864 bytes and batches younger than " \
                   "7 d)" in line.group(0)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics0 + i}/metrics",
                                        timeout=30) as r:
                assert r.status == 200
        # A wrong token: every node says UNAUTHENTICATED, and so does status, with the advice
        # that fits (a token), not "start a cluster with raftlog up".
        tls = {"RAFTLOG_TLS_CA": ca}
        res = raftlog("status", "--servers", up.servers,
                      extra_env={**tls, "RAFTLOG_TOKEN": "not-a-token"})
        assert res.returncode == 1, res
        assert res.stderr.startswith("raftlog status: UNAUTHENTICATED: "), res.stderr
        assert "raftlog up" not in res.stderr and "RAFTLOG_TOKEN" in res.stderr
        res = raftlog("status", "--servers", up.servers, "--json",
                      extra_env={**tls, "RAFTLOG_TOKEN": "not-a-token"})
        assert json.loads(res.stderr)["error"]["code"] == "UNAUTHENTICATED"
        res = raftlog("status", "--servers", up.servers, "--json",
                      extra_env={**tls, "RAFTLOG_TOKEN": token})
        assert res.returncode == 0, res.stderr

        # Node 2 dies; the command `up` prints brings it back, in a shell of its own (as a user
        # would: a background job, not `up`'s child), and `up` adopts it.
        pids = {i: up.pid(i) for i in (1, 2, 3)}
        os.kill(pids[2], signal.SIGKILL)
        hint = up.wait_line(r"^restart it with: raftlog (serve .*&)$").group(1)
        # With a node down, the others' refusal still decides the code and the advice.
        res = raftlog("status", "--servers", up.servers,
                      extra_env={**tls, "RAFTLOG_TOKEN": "not-a-token"})
        assert res.stderr.startswith("raftlog status: UNAUTHENTICATED: "), res.stderr
        subprocess.run(["bash", "-c", f"{sys.executable} -m raft.cli {hint}"], cwd=REPO,
                       env=env(), check=True, timeout=60)
        adopted_pid = int(up.wait_line(r"^node 2 runs again \(pid (\d+), started outside "
                                       r"`up`\)").group(1))
        assert not _gone(adopted_pid)
        # Ctrl-C: exit 130, and every node `up` started or adopted has ended.
        up.signal(signal.SIGINT)
        assert up.wait() == 130, up.err[-10:]
        stopped = up.wait_line(r"^stopped: exit codes").string
        assert f"node 2 (pid {adopted_pid}) stopped" in stopped
        for pid in (pids[1], pids[3], adopted_pid):
            assert _gone(pid), f"pid {pid} still runs after Ctrl-C on `up`"
    finally:
        up.stop()
        if adopted_pid is not None and not _gone(adopted_pid):
            os.kill(adopted_pid, signal.SIGKILL)


@pytest.mark.parametrize("args, message", [
    (["--server-arg=--tick-msx=5"], "node 1's settings (--server-arg/--config): "
                                    "unrecognized arguments: --tick-msx=5"),
    (["--server-arg=--node-id=3"], "`up` sets --node-id for each node itself"),
    (["--server-arg=--metrics-listen=127.0.0.1:9100"],
     "every node would serve metrics at 127.0.0.1:9100; give each its own port with {id}"),
    (["--server-arg=--auth-file=x.toml"], "auth_file needs TLS"),
])
def test_up_refuses_node_settings_that_cannot_work_before_starting_anything(
        tmp_path: Path, args: list[str], message: str) -> None:
    res = raftlog("up", "--data-dir", str(tmp_path / "data"), "--base-port", "0", *args)
    assert res.returncode == 2, res
    assert message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "data").glob("node-*"))


def test_up_refuses_a_config_file_that_sets_what_up_sets_and_a_data_dir_that_is_a_file(
        tmp_path: Path) -> None:
    config = tmp_path / "nodes.toml"
    config.write_text('node_id = 1\npeers = "1=127.0.0.1:7101"\n')
    res = raftlog("up", "--data-dir", str(tmp_path / "data"), "--config", str(config))
    assert res.returncode == 2, res
    assert f"--config {config} sets node_id, peers, which `up` sets for each node" in res.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    res = raftlog("up", "--data-dir", str(a_file))
    assert res.returncode == 2, res
    assert res.stderr.strip() == (f"raftlog up: --data-dir {a_file} is a file, not a "
                                  f"directory; pass a directory (it is created if missing), "
                                  f"e.g. --data-dir ./data")
