"""`raftlog topic ...`, `produce --topic`, `consume --topic` and the partitions in `status`, run
in this process against the fake nodes of fake_topics.py (served from a thread): parsing, the
text and --json output, exit codes, and errors that name what exists. The same commands
against real `raftlog serve` processes are in test_topics_processes.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import trio

from cli_helpers import cli
from fake_topics import FakeCluster, start
from raft.cli.status import partition_rows, partition_summary
from raft.protocol.partitioner import partition_for_key
from storage.records import decode_records


@pytest.fixture
def fake() -> Iterator[tuple[FakeCluster, str]]:
    cluster = FakeCluster()
    ready, stop = threading.Event(), threading.Event()
    servers: list[str] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            servers.extend(await start(nursery, cluster))
            cluster.add_topic("default", 1)
            cluster.add_topic("orders", 4)
            ready.set()
            await trio.to_thread.run_sync(stop.wait)
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(20)
    try:
        yield cluster, ",".join(servers)
    finally:
        stop.set()
        thread.join(20)


def test_topic_help_names_every_action_and_completion_knows_them() -> None:
    res = cli("topic", "--help")
    assert res.returncode == 0
    for action in ("create", "list", "describe", "alter", "delete", "move"):
        assert action in res.stdout
    script = cli("completion", "bash").stdout
    assert "'topic create'" in script and "'topic describe'" in script
    assert "'topic move'" in script and "--no-wait" in script
    assert "--partitions" in script and "--retention-ms" in script
    assert "--topic" in script and "--partition" in script


@pytest.mark.parametrize("args, message", [
    (("topic", "create", "t", "--replicas", "3"), "--partitions"),
    (("topic", "create", "t", "--partitions", "0", "--replicas", "3"), "must be at least 1"),
    (("topic", "create", "t", "--partitions", "2", "--replicas", "1",
      "--retention-ms", "soon"), "must be a whole number"),
    (("topic",), "ACTION"),
    (("produce", "--partition", "-1"), "must be 0 or more"),
])
def test_bad_topic_flags_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    res = cli(*args)
    assert res.returncode == 2, res
    assert message in res.stderr


def test_alter_without_a_change_says_what_to_give() -> None:
    res = cli("topic", "alter", "orders", "--servers", "127.0.0.1:1")
    assert res.returncode == 2
    assert "give --partitions N (grow only)" in res.stderr


def test_create_list_and_describe(fake: tuple[FakeCluster, str]) -> None:
    cluster, servers = fake
    res = cli("topic", "create", "events", "--partitions", "3", "--replicas", "3",
              "--servers", servers, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"name": "events", "partitions": 3, "replicas": 3,
                                      "settings": {}}
    res = cli("topic", "create", "events", "--partitions", "3", "--replicas", "3",
              "--servers", servers)
    assert res.returncode == 1 and "TOPIC_EXISTS" in res.stderr
    assert "raftlog topic describe" in res.stderr  # what to do next

    listed = json.loads(cli("topic", "list", "--servers", servers, "--json").stdout)
    assert [(t["name"], t["partitions"]) for t in listed["topics"]] == [
        ("default", 1), ("events", 3), ("orders", 4)]
    text = cli("topic", "list", "--servers", servers).stdout
    assert "orders" in text and "events" in text

    desc = json.loads(cli("topic", "describe", "orders", "--servers", servers,
                          "--json").stdout)
    assert [p["partition"] for p in desc["partitions"]] == [0, 1, 2, 3]
    for p in desc["partitions"]:
        assert p["leader"] == cluster.leaders["orders"][p["partition"]]
        assert p["replicas"][0] == p["leader"] and len(p["replicas"]) == 3
        assert (p["high_watermark"], p["log_start"]) == (-1, 0)
    text = cli("topic", "describe", "orders", "--servers", servers).stdout
    assert "high watermark" in text and "log start" in text


def test_unknown_topic_is_a_usage_error_naming_the_topics(fake: tuple[FakeCluster, str]
                                                         ) -> None:
    _, servers = fake
    for args in (("topic", "describe", "ordres"), ("consume", "--topic", "ordres"),
                 ("produce", "--topic", "ordres")):
        res = cli(*args, "--servers", servers)
        assert res.returncode == 2, (args, res)
        assert "no topic 'ordres'" in res.stderr and "default, orders" in res.stderr
    res = cli("produce", "--topic", "orders", "--partition", "9", "--servers", servers,
              "--json")
    assert res.returncode == 2
    err = json.loads(res.stderr)["error"]
    assert err["code"] == "UNKNOWN_TOPIC" and "has 4 (0..3)" in err["message"]


def test_keyed_produce_and_consume_of_every_partition(fake: tuple[FakeCluster, str],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    cluster, servers = fake
    lines = "".join(f"user-{i % 5}:event-{i}\n" for i in range(30))
    import io
    import os
    r, w = os.pipe()
    os.write(w, lines.encode())
    os.close(w)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(os.fdopen(r, "rb")))
    res = cli("produce", "--topic", "orders", "--key-separator", ":", "--servers", servers,
              "--json")
    assert res.returncode == 0, res.stderr
    out = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(out) == 30
    for i, o in enumerate(out):
        assert o["partition"] == partition_for_key(f"user-{i % 5}".encode(), 4)
        assert o["value"] == f"event-{i}" and isinstance(o["offset"], int)
    for p in range(4):  # each key's records in its partition, in the order produced
        keys = [rec.key for payload, count, _ in cluster.produced("orders", p)
                for rec in decode_records(payload, count)]
        assert all(partition_for_key(k, 4) == p for k in keys)

    res = cli("consume", "--topic", "orders", "--servers", servers, "--json")
    assert res.returncode == 0, res.stderr
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert sorted((g["partition"], g["offset"]) for g in got) == \
        sorted((o["partition"], o["offset"]) for o in out)  # every record exactly once
    for p in range(4):
        mine = [g["value"] for g in got if g["partition"] == p]
        assert mine == [o["value"] for o in out if o["partition"] == p]
    one = cli("consume", "--topic", "orders", "--partition", "1", "--servers", servers)
    assert one.returncode == 0
    assert one.stdout.splitlines() == [f"1\t{o['offset']}\t{o['value']}" for o in out
                                       if o["partition"] == 1]
    res = cli("consume", "--topic", "orders", "--to", "3", "--servers", servers)
    assert res.returncode == 2 and "add --partition P" in res.stderr
    # A subscription over the whole topic: its members always lease, first use starts each
    # partition at its log start.
    res = cli("consume", "--topic", "orders", "--subscription", "s", "--exclusive",
              "--servers", servers)
    assert res.returncode == 2 and "drop --exclusive" in res.stderr
    res = cli("consume", "--topic", "orders", "--subscription", "s", "--from-end",
              "--servers", servers)
    assert res.returncode == 2 and "subscriptions reset NAME --topic T" in res.stderr
    res = cli("consume", "--subscription", "s", "--member", "m1", "--servers", servers)
    assert res.returncode == 2 and "add --topic T" in res.stderr


def test_status_summarises_partitions_per_node() -> None:
    st = {"node_id": 2, "role": "follower", "controller": {"role": "follower"},
          "partitions": [
              {"topic": "orders", "partition": 0, "role": "leader", "leader": 2},
              {"topic": "orders", "partition": 1, "role": "follower", "leader": 1},
              {"topic": "default", "partition": 0, "role": "follower", "leader": None}]}
    assert partition_summary(st) == {"replicas": 3, "leading": 1, "following": 2,
                                     "without_leader": 1, "topics": ["default", "orders"]}
    assert partition_rows({"a": st, "b": {"error": "x"}, "c": {"node_id": 3}}) == [
        ["2", "3", "1", "2", "1", "default, orders", "follower"]]


def test_json_input_keys_pick_partitions_and_from_minus_n_is_per_partition(
        fake: tuple[FakeCluster, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, servers = fake
    import io
    import os
    lines = "".join(json.dumps({"key": f"id-{i % 6}", "value": f"j{i}"}) + "\n"
                    for i in range(24))
    r, w = os.pipe()
    os.write(w, lines.encode())
    os.close(w)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(os.fdopen(r, "rb")))
    res = cli("produce", "--topic", "orders", "--input", "json", "--servers", servers)
    assert res.returncode == 0, res.stderr
    placed = [tuple(map(int, x.split("\t"))) for x in res.stdout.splitlines()]  # P<TAB>O
    assert [p for p, _ in placed] == [partition_for_key(f"id-{i % 6}".encode(), 4)
                                      for i in range(24)]
    res = cli("consume", "--topic", "orders", "--from", "-2", "--servers", servers, "--json")
    assert res.returncode == 0, res.stderr
    got = [json.loads(x) for x in res.stdout.splitlines()]
    for p in {p for p, _ in placed}:
        last_two = sorted(o for q, o in placed if q == p)[-2:]
        assert sorted(g["offset"] for g in got if g["partition"] == p) == last_two
