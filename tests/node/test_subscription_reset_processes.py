"""Issue 29, item 1, on real `raftlog up --tls` nodes with auth, metrics and a small
--retention-bytes, where retention has passed the positions of lagging subscriptions: `consume
--subscription` stops with an error that names the fix; `--auto-reset earliest` resumes at the
log start and the skipped count is in `subscriptions` (--json and the table) and /metrics, and
on a survivor after the leader is killed; a consume-only token may reset; /metrics carries
per-subscription lag series. Each test uses its own subscription of one shared cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_helpers import UpCluster, raftlog, wait_for
from raft.cli.localcluster import free_ports

pytestmark = pytest.mark.slow
RECORD = "x" * 4000  # ~4 KB records: four produce batches of 40 KB pass a 64 KiB retention
LAGGERS = ("lagger", "lagger-resume", "lagger-ops")


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


@dataclass
class Lagging:
    up: UpCluster
    ops: dict[str, str]  # env: TLS CA and an admin/produce/consume token
    reader: dict[str, str]  # env: TLS CA and a consume-only token
    metrics0: int  # node i serves /metrics on metrics0 + i
    positions: dict[str, int]  # each lagger's position before retention passed it

    def cli(self, env: dict[str, str], *args: str, stdin: str = "",
            servers: str | None = None) -> subprocess.CompletedProcess[str]:
        return raftlog(*args, "--servers", servers or self.up.servers, stdin=stdin,
                       extra_env=env)

    def subs(self, servers: str | None = None) -> dict[str, dict]:
        res = self.cli(self.reader, "subscriptions", "--json", servers=servers)
        assert res.returncode == 0, res.stderr
        return {s["name"]: s for s in json.loads(res.stdout)["subscriptions"]}

    def leader(self) -> int:
        def find() -> int | None:
            res = self.cli(self.ops, "status", "--json")
            if res.returncode != 0:
                return None
            return next((int(n["node_id"]) for n in json.loads(res.stdout)["nodes"]
                         if n.get("role") == "leader"), None)
        return int(wait_for(find, "a leader"))


@pytest.fixture(scope="module")
def lagging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lagging]:
    tmp = tmp_path_factory.mktemp("autoreset")
    auth = tmp / "auth.toml"
    tokens = {}
    for principal, perms in (("ops", "produce,consume,admin"), ("reader", "consume")):
        res = raftlog("token", "create", "--auth-file", str(auth), "--principal", principal,
                      "--permissions", perms)
        assert res.returncode == 0, res.stderr
        tokens[principal] = res.stdout.strip()
    config = tmp / "nodes.toml"
    config.write_text(f'auth_file = "{auth}"\n')
    prefix, metrics0 = _metrics_prefix()
    up = UpCluster(tmp / "data", 3, "--tls", "--config", str(config),
                   f"--server-arg=--metrics-listen={prefix}{{id}}",
                   "--server-arg=--retention-bytes=65536")
    try:
        ca = str(tmp / "data" / "tls" / "ca.pem")
        c = Lagging(up, {"RAFTLOG_TLS_CA": ca, "RAFTLOG_TOKEN": tokens["ops"]},
                    {"RAFTLOG_TLS_CA": ca, "RAFTLOG_TOKEN": tokens["reader"]}, metrics0, {})
        # The laggers read two records each and stop; then more is written than retention
        # keeps, so it deletes what they had not read.
        res = c.cli(c.ops, "produce", stdin="".join(f"early-{i}\n" for i in range(5)))
        assert res.returncode == 0, res.stderr
        for name in LAGGERS:
            first = c.cli(c.reader, "consume", "--subscription", name, "--count", "2",
                          "--json")
            assert first.returncode == 0, first.stderr
        c.positions = {n: s["position"] for n, s in c.subs().items()}
        for k in range(4):
            res = c.cli(c.ops, "produce",
                        stdin="".join(f"late-{k}-{i}-{RECORD}\n" for i in range(10)))
            assert res.returncode == 0, res.stderr
        top = max(c.positions.values())
        wait_for(lambda: all((_value(_scrape(metrics0 + i), "raftlog_start_offset") or 0) > top
                             for i in (1, 2, 3)),
                 "retention on every node to pass the laggers' positions", timeout=60)
        yield c
    finally:
        up.stop()


def test_a_subscription_passed_by_retention_stops_with_an_error_naming_the_fix(
        lagging: Lagging) -> None:
    stuck = lagging.cli(lagging.reader, "consume", "--subscription", "lagger", "--json")
    assert stuck.returncode == 1, stuck
    assert stuck.stdout == ""
    error = json.loads(stuck.stderr)["error"]
    assert error["code"] == "OFFSET_OUT_OF_RANGE"
    assert f"subscription lagger is at position {lagging.positions['lagger']}, but retention " \
           f"removed the log below offset" in error["message"]
    assert "raftlog consume --subscription lagger --auto-reset earliest" in error["message"]
    assert "raftlog subscriptions reset lagger --to start" in error["message"]
    assert lagging.subs()["lagger"]["position"] == lagging.positions["lagger"]  # not moved
    plain = lagging.cli(lagging.reader, "consume", "--subscription", "lagger")
    assert plain.returncode == 1 and "--auto-reset earliest" in plain.stderr, plain


def test_auto_reset_earliest_resumes_at_the_log_start_and_records_what_it_skipped(
        lagging: Lagging) -> None:
    name, position = "lagger-resume", lagging.positions["lagger-resume"]
    resumed = lagging.cli(lagging.reader, "consume", "--subscription", name, "--auto-reset",
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

    after = lagging.subs()[name]
    assert (after["skipped_offsets"], after["resets"]) == (skipped, 1)
    assert after["auto_reset"] == "earliest"  # stored: the next run does the same
    assert after["position"] > records[-1]["offset"]  # (past control entries after it)
    table = lagging.cli({**lagging.reader, "COLUMNS": "200"}, "subscriptions")
    assert table.returncode == 0, table.stderr
    row = next(x for x in table.stdout.splitlines() if f" {name} " in x)
    assert "skipped" in table.stdout and f" {skipped:,} " in row and "earliest" in row


def test_a_consume_only_token_may_reset_a_subscription(lagging: Lagging) -> None:
    name, position = "lagger-ops", lagging.positions["lagger-ops"]
    moved = lagging.cli(lagging.reader, "subscriptions", "reset", name, "--to", "start",
                        "--json")
    assert moved.returncode == 0, moved.stderr
    to = json.loads(moved.stdout)["position"]
    assert to > position
    assert lagging.subs()[name]["skipped_offsets"] == to - position
    # Forgetting one is still an operator's act.
    refused = lagging.cli(lagging.reader, "subscriptions", "delete", name)
    assert refused.returncode == 1 and "FORBIDDEN" in refused.stderr, refused


def test_metrics_carry_per_subscription_lag_and_skip_series(lagging: Lagging) -> None:
    listed = lagging.subs()
    text = _scrape(lagging.metrics0 + lagging.leader())
    for name, sub in listed.items():
        lag = _value(text, f'raftlog_subscription_lag_offsets{{subscription="{name}"}}')
        # (a listing is a barrier through the log: its entry adds an offset, not a record)
        assert lag is not None and lag >= sub["lag_offsets"], (name, lag)
        assert _value(text, f'raftlog_subscription_lag_records{{subscription="{name}"}}'
                      ) == sub["lag_records"]
        assert _value(text, f'raftlog_subscription_skipped_offsets_total{{subscription='
                            f'"{name}"}}') == sub["skipped_offsets"]
    assert listed["lagger"]["lag_records"] > 0
    assert _value(text, "raftlog_subscriptions_skipped_offsets_total") == sum(
        s["skipped_offsets"] for s in listed.values())
    assert _value(text, "raftlog_subscription_series_left_out") == 0


def test_the_skipped_count_survives_the_leader_being_killed(lagging: Lagging) -> None:
    before = {n: s["skipped_offsets"] for n, s in lagging.subs().items()}
    assert before["lagger-resume"] > 0
    leader = lagging.leader()
    os.kill(lagging.up.pid(leader), signal.SIGKILL)
    survivor = lagging.up.addresses[next(i for i in (1, 2, 3) if i != leader)]

    def table() -> dict[str, dict] | None:
        res = lagging.cli(lagging.reader, "subscriptions", "--json", servers=survivor)
        if res.returncode != 0:
            return None  # no leader yet
        return {s["name"]: s for s in json.loads(res.stdout)["subscriptions"]}
    after = wait_for(table, "a new leader's subscription table")
    assert {n: s["skipped_offsets"] for n, s in after.items()} == before
