"""Shards on real processes (issue 27, docs/SHARDS.md): `raftlog serve --shards 2` serves a topic
whose partitions are spread over both shard processes, each produced to and read back at the
address the metadata gives its shard; SIGKILL of one shard process stops the whole node
(fail-stop, exit 3, a message naming the shard) and a restart recovers every partition with
every quorum-acked record; a start with another shard count is refused, saying what to do; a
3-node cluster of 2 shards per node survives SIGKILL of a whole node. Raw frames
(raft.protocol.blocking), so the test pins the wire."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from raft.cli.localcluster import LocalCluster, wait_for
from storage.records import Record, encode_values
from test_topics_processes import call
from test_topics_processes import values as _values

pytestmark = pytest.mark.slow


def values(address: str, topic: str, partition: int) -> list[bytes]:
    try:
        return _values(address, topic, partition)
    except OSError:  # (re)starting: not listening yet
        return []


def metadata(address: str) -> dict[str, Any]:
    reply = call(address, "metadata")
    assert reply["ok"], reply
    return reply


def partition_addresses(meta: dict[str, Any], topic: str) -> dict[int, list[str]]:
    """Where each partition of `topic` is served, as a client reads it from the metadata."""
    nodes = {n["node_id"]: n["address"] for n in meta["nodes"]}
    out = {}
    for t in meta["topics"]:
        if t["name"] == topic:
            for p in t["partitions"]:
                where = [p["leader_address"]] if p["leader_address"] else []
                out[p["partition"]] = where + (p.get("replica_addresses")
                                               or [nodes[r] for r in p["replicas"]])
    return out


def shards_of(meta: dict[str, Any], topic: str) -> dict[int, int]:
    return {p["partition"]: p.get("shard", 0) for t in meta["topics"] if t["name"] == topic
            for p in t["partitions"]}


PRODUCER_ID = 27  # the tests' writes are idempotent: a retry after a TIMEOUT is no duplicate


def produce(addresses: list[str], topic: str, partition: int, value: bytes,
            sequence: int = -1) -> int:
    """A quorum write, retried until taken. With `sequence` (the value's index among this
    partition's writes) it is idempotent: a write that timed out may have been appended all
    the same, and its retry to another leader would otherwise add it twice."""
    deadline = time.monotonic() + 60
    ids = {"producer_id": PRODUCER_ID, "sequence": sequence} if sequence >= 0 else {}
    while True:
        for address in addresses:
            try:
                reply = call(address, "produce", acks="quorum", timeout_ms=5000, topic=topic,
                             partition=partition, payload=encode_values([value]), count=1,
                             **ids)
            except OSError:
                continue
            if reply["ok"]:
                return reply["base_offset"]
            assert reply["error"]["code"] in ("NOT_LEADER", "LEADERSHIP_LOST", "TIMEOUT"), reply
            hint = reply["error"].get("leader_address")
            if hint and hint not in addresses:
                addresses = [hint, *addresses]
        if time.monotonic() >= deadline:
            seen = seen_by(addresses, topic, partition)
            print(json.dumps(seen, indent=1, default=str))  # whole, in the captured output
            raise AssertionError(f"partition {partition} took no write for 60 s: {reply}")
        time.sleep(0.1)  # a retry's backoff, not synchronisation


def seen_by(addresses: list[str], topic: str, partition: int) -> dict[str, Any]:
    """What each address says of the partition and of its peers, for a failure's message."""
    out: dict[str, Any] = {}
    for address in addresses:
        try:
            st = call(address, "status")["status"]
        except (OSError, KeyError) as e:
            out[address] = repr(e)
            continue
        out[address] = {"partition": [p for p in st.get("partitions", [])
                                      if p.get("topic") == topic
                                      and p.get("partition") == partition],
                        "peers": st.get("links") or st.get("peers")}
    return out


def running(address: str) -> set[tuple[str, int]]:
    try:
        st = call(address, "status")["status"]
    except (OSError, KeyError):
        return set()
    return {(p["topic"], p["partition"]) for p in st["partitions"]}


def shard_pid(supervisor: int, shard: int) -> int:
    """The pid of shard `shard` of the node whose supervisor is `supervisor`."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    for pid in map(int, children):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        for item in env:
            if item.startswith(b"RAFTLOG_SHARD_SETTINGS="):
                if json.loads(item.split(b"=", 1)[1])["shard"] == shard:
                    return pid
    raise AssertionError(f"no shard {shard} among {children}")


def shard_address(address: str, shard: int) -> str:
    host, port = address.rsplit(":", 1)
    return f"{host}:{int(port) + shard}"


def admin_create(address: str, name: str, partitions: int, replicas: int,
                 others: list[str] = ()) -> dict[str, Any]:
    """topic_create, retried until the controller's leader answers. An attempt that timed out
    or lost its leader may have been applied all the same (on a loaded machine the create
    commits after its timeout): TOPIC_EXISTS after such an attempt is the create done."""
    deadline = time.monotonic() + 60
    unsure = False
    while True:
        for a in [address, *others]:
            try:
                reply = call(a, "topic_create", name=name, partitions=partitions,
                             replicas=replicas)
            except OSError:
                continue
            code = None if reply["ok"] else reply["error"]["code"]
            if code == "TOPIC_EXISTS" and unsure:
                return {**reply, "ok": True, "topic": reply["error"].get("topic")}
            unsure = unsure or code in ("TIMEOUT", "LEADERSHIP_LOST")
            if code not in ("NOT_LEADER", "TIMEOUT", "LEADERSHIP_LOST"):
                return reply
        assert time.monotonic() < deadline, reply
        time.sleep(0.1)


def test_two_shards_serve_a_topic_fail_stop_together_and_recover(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=1, shards=2) as cluster:
        cluster.wait_leader(timeout=120)
        base = cluster.addresses[1]
        created = admin_create(base, "orders", 4, 1)
        assert created["ok"], created
        wanted = {0: {("default", 0)}, 1: set()}
        meta = metadata(base)
        placed = shards_of(meta, "orders")
        assert sorted(placed.values()) == [0, 0, 1, 1], placed  # spread over both shards
        for p, shard in placed.items():
            wanted[shard].add(("orders", p))
        for shard in (0, 1):
            wait_for(lambda s=shard: running(shard_address(base, s)) == wanted[s],
                     f"shard {shard} to run its partitions", 60)
        def leaders_named() -> bool:  # shard 0 names shard 1's leaders too (its reports)
            parts = [p for t in metadata(base)["topics"] if t["name"] == "orders"
                     for p in t["partitions"]]
            return all(p["leader_address"] == shard_address(base, placed[p["partition"]])
                       for p in parts)

        wait_for(leaders_named, "the metadata to name each partition's leader at its shard")
        # Shard 0's status has the node's view of each shard: 3 partitions on shard 0 (the
        # default topic's and 2 of orders), 2 on shard 1, each led there (RF 1).
        per_shard = call(base, "status")["status"]["node_shards"]
        assert [(s["shard"], s["address"], s["partitions"], s["leading"]) for s in per_shard] \
            == [(0, base, 3, 3), (1, shard_address(base, 1), 2, 2)], per_shard
        where = partition_addresses(metadata(base), "orders")
        for p, shard in placed.items():  # the metadata sends each partition to its shard
            assert where[p][0] == shard_address(base, shard), (p, where[p])
        acked = {p: [f"p{p}-{i}".encode() for i in range(3)] for p in range(4)}
        for p, vals in acked.items():
            for i, v in enumerate(vals):
                produce(where[p], "orders", p, v, sequence=i)
        for p in range(4):
            assert values(shard_address(base, placed[p]), "orders", p) == acked[p]

        victim = shard_pid(cluster.pid(1), 1)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not cluster.alive(1), "the node to stop when a shard dies", 60)
        assert cluster.returncode(1) == 3
        log = cluster.node_log(1)
        assert "shard 1 was killed by SIGKILL" in log and "fail-stop" in log, log[-2000:]

        cluster.start(1)
        for shard in (0, 1):
            wait_for(lambda s=shard: running(shard_address(base, s)) == wanted[s],
                     f"shard {shard} to run its partitions again", 60)
        for p in range(4):  # nothing quorum-acked is lost, and writes go on
            wait_for(lambda p=p: values(shard_address(base, placed[p]), "orders", p)
                     == acked[p], f"partition {p} to hold what was acked", 60)
            produce(partition_addresses(metadata(base), "orders")[p], "orders", p, b"after",
                    sequence=3)

        # The client library routes by the metadata alone (the node's shard 0 address is all
        # it is given): keyed records land in their partitions on both shards and read back.
        from raft.client import BlockingClient

        with BlockingClient([base], timeout=30) as c:
            sent = c.produce_to_topic([Record(b"v", f"key{i}".encode()) for i in range(32)],
                                      topic="orders")
            assert {p for p, _ in sent} == {0, 1, 2, 3}, sent
            for p, offset in sent:
                got = c.fetch(offset, topic="orders", partition=p).records
                assert got, (p, offset)

        # Another shard count on the same data is refused, saying what to do.
        seen = len(cluster.node_log(1))
        assert cluster.terminate(1, timeout=60) == 0  # SIGTERM: every shard stops cleanly
        assert "fail-stop" not in cluster.node_log(1)[seen:]
        refused = subprocess.run(
            [sys.executable, "-m", "raft.cli", "serve", "--node-id", "1", "--data-dir",
             str(tmp_path), "--peers", f"1={base}", "--shards", "3"],
            capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2
        assert "written with --shards 2" in refused.stderr, refused.stderr
        assert "start it with --shards 2" in refused.stderr
        # Left out, --shards is the recorded count (not the cores): with shard 1's port taken
        # the start is refused before any shard runs, naming the port and the flag.
        import socket

        with socket.socket() as taken:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (TIME_WAIT left)
            taken.bind(("127.0.0.1", int(shard_address(base, 1).rsplit(":", 1)[1])))
            taken.listen()
            default = subprocess.run(
                [sys.executable, "-m", "raft.cli", "serve", "--node-id", "1", "--data-dir",
                 str(tmp_path), "--peers", f"1={base}"],
                capture_output=True, text=True, timeout=60)
        assert default.returncode == 2, default.stderr
        assert "shard 1 of 2 needs port" in default.stderr and "--listen" in default.stderr


def test_three_nodes_of_two_shards_survive_the_kill_of_a_node(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3, shards=2) as cluster:
        cluster.wait_leader(timeout=120)  # six processes starting on a loaded machine
        addresses = list(cluster.addresses.values())
        created = admin_create(addresses[0], "orders", 4, 3, addresses[1:])
        assert created["ok"], created
        wait_for(lambda: shards_of(metadata(addresses[0]), "orders"),
                 "node 1 to apply the topic", 60)
        placed = shards_of(metadata(addresses[0]), "orders")
        assert set(placed.values()) == {0, 1}, placed
        for address in addresses:
            for shard in (0, 1):
                wait_for(lambda a=shard_address(address, shard), s=shard: {
                    p for (t, p) in running(a) if t == "orders"}
                    == {p for p, sh in placed.items() if sh == s},
                    f"{address} shard {shard} to run its partitions", 60)
        acked = {p: [f"p{p}-a".encode()] for p in range(4)}
        for p in range(4):
            produce([shard_address(a, placed[p]) for a in addresses], "orders", p,
                    acked[p][0], sequence=0)
        victim = 3
        cluster.kill(victim)  # the supervisor: its shards die with it
        survivors = [a for n, a in cluster.addresses.items() if n != victim]
        for p in range(4):
            acked[p].append(f"p{p}-b".encode())
            produce([shard_address(a, placed[p]) for a in survivors], "orders", p,
                    acked[p][1], sequence=1)
        cluster.start(victim)
        restarted = cluster.addresses[victim]
        for p in range(4):
            try:
                wait_for(lambda p=p: values(shard_address(restarted, placed[p]), "orders", p)
                         == acked[p], f"partition {p} to catch up on the restarted node", 90)
            except TimeoutError:
                every = [shard_address(a, placed[p]) for a in cluster.addresses.values()]
                print(json.dumps(seen_by(every, "orders", p), indent=1, default=str))
                raise
