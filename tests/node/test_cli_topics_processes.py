"""The topic commands as a user runs them against real `raftlog serve` processes (issue 26
acceptance): `topic create` of 8 partitions with 3 replicas, keyed `produce --topic` whose
--json lines carry partition and offset, `consume --topic` reading every record exactly once
with its partition, `topic describe`/`list`, `status` with partitions per node, an unknown topic
as a usage error naming what exists, `topic delete`, and `up --partitions`."""

from __future__ import annotations

import json

import pytest

from cli_helpers import UpCluster, local_cluster, raftlog
from raft.cli.localcluster import LocalCluster
from raft.protocol.partitioner import partition_for_key

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("topics"), nodes=3) as c:
        yield c


def test_topic_commands_round_trip_keyed_records(cluster: LocalCluster) -> None:
    s = cluster.servers
    res = raftlog("topic", "create", "orders", "--partitions", "8", "--replicas", "3",
                  "--servers", s, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["partitions"] == 8

    lines = "".join(f"user-{i % 9}:e{i}\n" for i in range(90))
    res = raftlog("produce", "--topic", "orders", "--key-separator", ":", "--servers", s,
                  "--json", stdin=lines)
    assert res.returncode == 0, res.stderr
    out = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(out) == 90
    for i, o in enumerate(out):
        assert o["partition"] == partition_for_key(f"user-{i % 9}".encode(), 8)

    res = raftlog("consume", "--topic", "orders", "--servers", s, "--json")
    assert res.returncode == 0, res.stderr
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert sorted((g["partition"], g["offset"]) for g in got) == \
        sorted((o["partition"], o["offset"]) for o in out)  # every record, exactly once
    for k in range(9):  # a key's records: one partition, in the order produced
        mine = [g for g in got if g.get("key") == f"user-{k}"]
        assert len({g["partition"] for g in mine}) == 1
        assert [g["value"] for g in mine] == [f"e{i}" for i in range(k, 90, 9)]

    desc = json.loads(raftlog("topic", "describe", "orders", "--servers", s, "--json").stdout)
    assert len(desc["partitions"]) == 8
    for row in desc["partitions"]:
        count = sum(1 for o in out if o["partition"] == row["partition"])
        assert row["leader"] in row["replicas"] and len(row["replicas"]) == 3
        assert row["high_watermark"] >= count - 1 and row["log_start"] >= 0
    listed = json.loads(raftlog("topic", "list", "--servers", s, "--json").stdout)["topics"]
    assert {t["name"]: t["partitions"] for t in listed} == {"default": 1, "orders": 8}

    status = json.loads(raftlog("status", "--servers", s, "--json").stdout)
    held = [n["partition_summary"]["replicas"] for n in status["nodes"]]
    assert sum(held) == 8 * 3 + 3  # orders' replicas and the default topic's
    assert "partitions per node" in raftlog("status", "--servers", s).stdout

    res = raftlog("consume", "--topic", "ordres", "--servers", s)
    assert res.returncode == 2
    assert "no topic 'ordres'" in res.stderr and "default, orders" in res.stderr

    res = raftlog("topic", "delete", "orders", "--servers", s)
    assert res.returncode == 0, res.stderr
    listed = json.loads(raftlog("topic", "list", "--servers", s, "--json").stdout)["topics"]
    assert [t["name"] for t in listed] == ["default"]
    # Today's commands still use the default topic.
    res = raftlog("produce", "--servers", s, stdin="plain\n")
    assert res.returncode == 0 and res.stdout.strip().isdigit(), res.stderr


def test_up_partitions_grows_the_default_topic(tmp_path) -> None:
    up = UpCluster(tmp_path / "up", 3, "--partitions", "4")
    try:
        up.wait_line(r"^topic default: 4 partitions")
        listed = json.loads(raftlog("topic", "list", "--servers", up.servers,
                                    "--json").stdout)["topics"]
        assert listed == [{"name": "default", "partitions": 4, "replicas": 3,
                           "settings": {}}]
    finally:
        up.stop()


def test_a_keyed_producer_rides_through_the_sigkill_of_a_node(tmp_path) -> None:
    """Every partition gets a leader again after a node is SIGKILLed; the client finds the new
    leaders (metadata refresh, NOT_LEADER hints), producing goes on, and every acknowledged
    record is read back exactly once, a key's records in order."""
    import time

    from raft.client import BadRequestError, BlockingClient
    from storage.records import Record

    with local_cluster(tmp_path / "kill", nodes=3) as c, \
            BlockingClient(c.servers, timeout=60) as client:
        deadline = time.monotonic() + 60
        while True:  # the controller places replicas once the nodes registered as live
            try:
                client.create_topic("events", 8, 3)
                break
            except BadRequestError as e:
                assert "live active nodes" in e.message and time.monotonic() < deadline
                time.sleep(0.1)  # polling a condition under a deadline
        sent = client.produce_to_topic([Record(f"a{i}".encode(), f"k{i % 11}".encode())
                                        for i in range(200)], topic="events")
        before = client.describe_topic("events")["partitions"]
        victim = max({1, 2, 3}, key=lambda n: sum(p["leader"] == n for p in before))
        assert any(p["leader"] == victim for p in before)  # it leads partitions to take over
        c.kill(victim)
        sent += client.produce_to_topic([Record(f"b{i}".encode(), f"k{i % 11}".encode())
                                         for i in range(200)], topic="events")
        # Every partition gets a leader again, the ones no key reached too (a quiet group
        # elects once the detector reports the victim down): waited for under a deadline.
        deadline = time.monotonic() + 60
        while not all(p["leader"] not in (None, victim)
                      for p in client.describe_topic("events")["partitions"]):
            assert time.monotonic() < deadline, client.describe_topic("events")
            time.sleep(0.1)  # polling a condition under a deadline
        got: dict[int, list] = {}
        for p in range(8):
            res = client.fetch(0, topic="events", partition=p, max_bytes=1 << 20)
            records = list(res.records)
            while records and res.next_offset <= res.high_watermark:
                res = client.fetch(res.next_offset, topic="events", partition=p)
                records += res.records
            got[p] = records
    assert sorted((p, r.offset) for p, rs in got.items() for r in rs) == sorted(sent)
    for k in range(11):
        key = f"k{k}".encode()
        mine = [r.value for rs in got.values() for r in rs if r.key == key]
        want = [f"a{i}".encode() for i in range(k, 200, 11)] + \
            [f"b{i}".encode() for i in range(k, 200, 11)]
        assert mine == want


def test_a_subscription_of_a_topic_partition_from_the_cli(cluster: LocalCluster) -> None:
    s = cluster.servers
    assert raftlog("topic", "create", "subs-cli", "--partitions", "2", "--replicas", "3",
                   "--servers", s).returncode == 0
    res = raftlog("produce", "--topic", "subs-cli", "--partition", "1", "--servers", s,
                  stdin="x\ny\nz\n")
    assert res.returncode == 0, res.stderr
    where = ("--topic", "subs-cli", "--partition", "1")
    res = raftlog("consume", "--subscription", "etl", *where, "--count", "2", "--servers", s)
    assert [line.split("\t")[2] for line in res.stdout.splitlines()] == ["x", "y"], res.stderr
    res = raftlog("consume", "--subscription", "etl", *where, "--servers", s)
    assert [line.split("\t")[2] for line in res.stdout.splitlines()] == ["z"]  # resumed
    listed = json.loads(raftlog("subscriptions", *where, "--servers", s, "--json").stdout)
    assert [x["name"] for x in listed["subscriptions"]] == ["etl"]
    other = json.loads(raftlog("subscriptions", "--topic", "subs-cli", "--partition", "0",
                               "--servers", s, "--json").stdout)
    assert other["subscriptions"] == []  # partition 0 keeps its own table
    res = raftlog("subscriptions", "delete", "etl", *where, "--servers", s)
    assert res.returncode == 0, res.stderr
    # A subscription over the whole topic: one member reads both partitions, commits, leaves.
    res = raftlog("consume", "--subscription", "all", "--topic", "subs-cli", "--member", "m1",
                  "--servers", s)
    assert res.returncode == 0, res.stderr
    assert sorted(line.split("\t")[2] for line in res.stdout.splitlines()) == ["x", "y", "z"]
    listed = json.loads(raftlog("subscriptions", "list", "--topic", "subs-cli", "--servers", s,
                                "--json").stdout)["subscriptions"]
    assert [(x["name"], x["partition"], x["lag_records"], x["lease_holder"])
            for x in listed] == [("all", 0, 0, None), ("all", 1, 0, None)]
    res = raftlog("consume", "--subscription", "all", "--topic", "subs-cli", "--servers", s)
    assert res.returncode == 0 and res.stdout == ""  # resumed: nothing new
