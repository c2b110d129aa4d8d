"""Issue 29, item 1, on real `raftlog up --tls` nodes with auth, metrics and a small
--retention-bytes: a subscription whose position retention has passed stops with an error that
names the fix; `--auto-reset earliest` resumes it at the log start and the skipped count is in
`subscriptions --json` (on every node, after the leader is killed too) and in /metrics; a
consume-only token may reset; /metrics carries per-subscription lag series."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import pytest

from cli_helpers import UpCluster, raftlog, wait_for
from raft.cli.localcluster import free_ports

pytestmark = pytest.mark.slow
RECORD = "x" * 4000  # ~4 KB records: four produce batches of 40 KB pass a 64 KiB retention


def _metrics_prefix() -> tuple[str, int]:
    """'HOST:P' such that ports P1..P3 ({id} = 1..3) are free now."""
    base = free_ports(20, consecutive=True)[0]
    tens = -(-base // 10)
    return f"127.0.0.1:{tens}", tens * 10


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return r.read().decode()


def _value(text: str, series: str) -> float | None:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


def test_a_subscription_passed_by_retention_names_the_fix_auto_resets_and_counts_the_skip(
        tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    tokens = {}
    for principal, perms in (("ops", "produce,consume,admin"), ("reader", "consume")):
        res = raftlog("token", "create", "--auth-file", str(auth), "--principal", principal,
                      "--permissions", perms)
        assert res.returncode == 0, res.stderr
        tokens[principal] = res.stdout.strip()
    config = tmp_path / "nodes.toml"
    config.write_text(f'auth_file = "{auth}"\n')
    prefix, metrics0 = _metrics_prefix()
    up = UpCluster(tmp_path / "data", 3, "--tls", "--config", str(config),
                   f"--server-arg=--metrics-listen={prefix}{{id}}",
                   "--server-arg=--retention-bytes=65536")
    try:
        ca = str(tmp_path / "data" / "tls" / "ca.pem")
        ops = {"RAFTLOG_TLS_CA": ca, "RAFTLOG_TOKEN": tokens["ops"]}
        reader = {"RAFTLOG_TLS_CA": ca, "RAFTLOG_TOKEN": tokens["reader"]}

        def cli(env: dict[str, str], *args: str, stdin: str = ""):  # noqa: ANN202
            return raftlog(*args, "--servers", up.servers, stdin=stdin, extra_env=env)

        def subs(env: dict[str, str] = reader, servers: str | None = None) -> dict[str, dict]:
            res = raftlog("subscriptions", "--servers", servers or up.servers, "--json",
                          extra_env=env)
            assert res.returncode == 0, res.stderr
            return {s["name"]: s for s in json.loads(res.stdout)["subscriptions"]}

        # The lagger reads two records and stops; then more is written than retention keeps.
        res = cli(ops, "produce", stdin="".join(f"early-{i}\n" for i in range(5)))
        assert res.returncode == 0, res.stderr
        first = cli(reader, "consume", "--subscription", "lagger", "--count", "2", "--json")
        assert first.returncode == 0, first.stderr
        position = subs()["lagger"]["position"]
        for k in range(4):
            res = cli(ops, "produce",
                      stdin="".join(f"late-{k}-{i}-{RECORD}\n" for i in range(10)))
            assert res.returncode == 0, res.stderr

        def starts() -> list[float]:
            return [_value(_scrape(metrics0 + i), "raftlog_start_offset") or 0 for i in (1, 2, 3)]
        wait_for(lambda: all(s > position for s in starts()),
                 "retention on every node to pass the lagger's position", timeout=60)

        # 1. Policy none (the default): a clear error naming the commands that fix it.
        stuck = cli(reader, "consume", "--subscription", "lagger", "--json")
        assert stuck.returncode == 1, stuck
        assert "OFFSET_OUT_OF_RANGE" in stuck.stderr and "retention removed" in stuck.stderr
        assert "raftlog consume --subscription lagger --auto-reset earliest" in stuck.stderr
        assert "raftlog subscriptions reset lagger --to start" in stuck.stderr
        assert stuck.stdout == ""
        assert subs()["lagger"]["position"] == position  # nothing moved it

        # 2. --auto-reset earliest, with a consume-only token: resumes at the log start, says
        #    on stderr what it skipped, and the table records it.
        resumed = cli(reader, "consume", "--subscription", "lagger", "--auto-reset",
                      "earliest", "--json")
        assert resumed.returncode == 0, resumed.stderr
        m = re.search(r"reset to (\d+) \(--auto-reset earliest\), skipping ([\d,]+) offsets",
                      resumed.stderr)
        assert m is not None, resumed.stderr
        reset_to, skipped = int(m.group(1)), int(m.group(2).replace(",", ""))
        assert reset_to > position and skipped == reset_to - position
        records = [json.loads(x) for x in resumed.stdout.splitlines()]
        assert records and records[0]["offset"] >= reset_to
        assert records[-1]["value"] == f"late-3-9-{RECORD}"  # read on to the end
        assert not any(r["value"].startswith("early-") for r in records)
        after = subs()["lagger"]
        assert after["skipped_offsets"] == skipped and after["resets"] == 1
        assert after["auto_reset"] == "earliest"  # stored: the next run does the same
        assert after["position"] > records[-1]["offset"]  # (past control entries after it)
        table = cli({**reader, "COLUMNS": "200"}, "subscriptions")
        assert table.returncode == 0, table.stderr
        row = next(x for x in table.stdout.splitlines() if "lagger" in x)
        assert "skipped" in table.stdout and f" {skipped:,} " in row and "earliest" in row

        # 3. A consume-only token may reset a subscription (it needed admin before).
        moved = cli(reader, "subscriptions", "reset", "lagger", "--to", "end", "--json")
        assert moved.returncode == 0, moved.stderr

        # 4. /metrics: per-subscription lag and skip series, and the totals.
        res = cli(ops, "produce", stdin="tail-1\ntail-2\n")
        assert res.returncode == 0, res.stderr
        listed = subs()["lagger"]
        assert listed["resets"] == 2  # (the reset to the end skipped a few offsets more)
        skipped = listed["skipped_offsets"]
        leader = int(wait_for(lambda: _leader(cli(ops, "status", "--json")), "a leader"))
        text = _scrape(metrics0 + leader)
        # (a listing is a barrier through the log: its entry adds an offset, not a record)
        lag = _value(text, 'raftlog_subscription_lag_offsets{subscription="lagger"}')
        assert lag is not None and lag >= listed["lag_offsets"] >= 2
        assert _value(text, 'raftlog_subscription_lag_records{subscription="lagger"}') == 2
        assert _value(text, 'raftlog_subscription_skipped_offsets_total{subscription="lagger"}'
                      ) == skipped
        assert _value(text, "raftlog_subscriptions_skipped_offsets_total") == skipped
        assert _value(text, "raftlog_subscription_series_left_out") == 0

        # 5. The skipped count is the replicated table's: after the leader is killed, a
        #    survivor shows it.
        os.kill(up.pid(leader), signal.SIGKILL)
        survivor = up.addresses[next(i for i in (1, 2, 3) if i != leader)]
        again = wait_for(lambda: _subs_or_none(survivor, reader), "a new leader's table")
        assert again["lagger"]["skipped_offsets"] == skipped
    finally:
        up.stop()


def _leader(res) -> int | None:  # noqa: ANN001
    """The node that says it is the leader, from `status --json`."""
    if res.returncode != 0:
        return None
    return next((int(n["node_id"]) for n in json.loads(res.stdout)["nodes"]
                 if n.get("role") == "leader"), None)


def _subs_or_none(servers: str, env: dict[str, str]) -> dict[str, dict] | None:
    res = raftlog("subscriptions", "--servers", servers, "--json", extra_env=env)
    if res.returncode != 0:
        return None
    return {s["name"]: s for s in json.loads(res.stdout)["subscriptions"]}
