"""consume and subscriptions as a user types them (issue 29, item 5): Ctrl-C ends `consume
--follow` (plain or with a subscription) with 130 as the README promises; flags that cannot
apply are refused instead of ignored (--from on an existing subscription, subscription flags
without --subscription, --max-wait without --follow); --json is accepted after the action."""

from __future__ import annotations

import json
import signal

import pytest

from cli_helpers import Running, cli, local_cluster, raftlog
from raft.cli.localcluster import LocalCluster
from raft.client import BlockingClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("consume-flags"), nodes=1) as c:
        with BlockingClient(c.servers) as client:
            res = client.produce(["one", "two", "three"], producer_id=0)
            c.first = res.base_offset  # type: ignore[attr-defined]
        yield c


@pytest.mark.parametrize("extra", [[], ["--subscription", "ctrl-c"]])
def test_ctrl_c_ends_consume_follow_with_130(cluster: LocalCluster, extra: list[str]) -> None:
    follow = Running("consume", "--servers", cluster.servers, "--follow", *extra)
    try:
        follow.wait_line(r"\tthree$", stream="out")
        follow.signal(signal.SIGINT)
        assert follow.wait() == 130, follow.err
        assert not any("Traceback" in line for line in follow.err), follow.err
    finally:
        follow.stop()
    if extra:  # what was printed was committed before the exit
        res = raftlog("subscriptions", "--servers", cluster.servers, "--json")
        sub = json.loads(res.stdout)["subscriptions"][0]
        assert sub["name"] == "ctrl-c"
        assert sub["position"] > cluster.first + 2  # type: ignore[attr-defined]  # past "three"


def test_from_on_an_existing_subscription_is_refused_with_the_command_that_moves_it(
        cluster: LocalCluster) -> None:
    first = cluster.first  # type: ignore[attr-defined]
    res = raftlog("consume", "--servers", cluster.servers, "--subscription", "moved",
                  "--from", str(first + 1), "--count", "1")
    assert res.returncode == 0, res.stderr  # first use: --from picks where it begins
    assert res.stdout == f"{first + 1}\ttwo\n"
    res = raftlog("consume", "--servers", cluster.servers, "--subscription", "moved",
                  "--from", str(first), "--count", "1")
    assert res.returncode == 2, res
    assert res.stdout == ""
    assert (f"--from {first} sets where a new subscription begins, and subscription moved "
            f"exists (position {first + 2}); to move it run `raftlog subscriptions reset moved "
            f"--to {first}`") in res.stderr
    res = raftlog("consume", "--servers", cluster.servers, "--subscription", "moved",
                  "--from-end", "--json")
    assert res.returncode == 2
    assert json.loads(res.stderr)["error"]["code"] == "CONFIG"
    res = raftlog("consume", "--servers", cluster.servers, "--subscription", "moved",
                  "--count", "1")
    assert res.stdout == f"{first + 2}\tthree\n"  # without the flag it resumes


@pytest.mark.parametrize("args, message", [
    (["--commit-ms", "100"], "--commit-ms only apply with --subscription NAME"),
    (["--from-end"], "--from-end only apply with --subscription NAME"),
    (["--exclusive"], "--exclusive only apply with --subscription NAME"),
    (["--auto-reset", "earliest"], "--auto-reset only apply with --subscription NAME"),
    (["--max-wait", "1"], "--max-wait is the long poll of --follow"),
])
def test_flags_that_cannot_apply_are_refused(args: list[str], message: str) -> None:
    res = cli("consume", "--servers", "127.0.0.1:1", *args)
    assert res.returncode == 2, res
    assert message in res.stderr


def test_json_is_accepted_after_the_subscriptions_action(cluster: LocalCluster) -> None:
    res = raftlog("subscriptions", "reset", "json-after", "--to", "start", "--servers",
                  cluster.servers, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"name": "json-after", "position": 0}
    res = raftlog("subscriptions", "delete", "json-after", "--servers", cluster.servers,
                  "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"deleted": "json-after"}
    res = raftlog("subscriptions", "--json", "delete", "no-such", "--servers", cluster.servers)
    assert res.returncode == 1
    assert json.loads(res.stderr)["error"]["code"] == "UNKNOWN_SUBSCRIPTION"
    res = cli("config", "--json", "show", "--node-id", "1", "--data-dir", "d", "--peers",
              "1=127.0.0.1:7101")
    assert res.returncode == 0, res.stderr
    assert "settings" in json.loads(res.stdout)
