"""Topics on real `raftlog serve` processes with LMDB data directories (issue 26): a topic of
4 partitions RF 3 is created through the controller's leader; records produced by (topic,
partition) are read back from their partition; after a SIGKILL of a node every partition has a
leader again and producing goes on; the killed node, started again, runs its partitions from its
store; topic delete stops them on every node. Raw frames (raft.protocol.blocking), so the test
pins the wire, not a client library."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from raft.cli.localcluster import LocalCluster, wait_for
from raft.protocol.blocking import FrameSocket, connect
from storage.records import decode_records, encode_values

pytestmark = pytest.mark.slow
_ids = itertools.count(1)


def call(address: str, t: str, **fields: Any) -> dict[str, Any]:
    sock = FrameSocket(connect(address, 20.0), address)
    try:
        sock.send({"v": 1, "t": "hello", "role": "client"})
        sock.receive()
        rid = next(_ids)
        sock.send({"v": 1, "t": t, "id": rid, **fields})
        reply = sock.receive()
        assert reply.get("id") == rid, reply
        return reply
    finally:
        sock.close()


def live_addresses(cluster: LocalCluster, down: set[int]) -> list[str]:
    return [a for n, a in sorted(cluster.addresses.items()) if n not in down]


def admin(cluster: LocalCluster, down: set[int], t: str, **fields: Any) -> dict[str, Any]:
    """Send an admin request to the controller's leader, following NOT_LEADER."""
    deadline = time.monotonic() + 60
    while True:
        for address in live_addresses(cluster, down):
            try:
                reply = call(address, t, **fields)
            except OSError:
                continue
            if reply["ok"] or reply["error"]["code"] not in ("NOT_LEADER", "TIMEOUT"):
                return reply
        assert time.monotonic() < deadline, reply
        time.sleep(0.1)  # a retry's backoff, not synchronisation


def produce(cluster: LocalCluster, down: set[int], topic: str, partition: int,
            value: bytes) -> int:
    """Produce to the partition's leader (as metadata names it, else any replica)."""
    deadline = time.monotonic() + 60
    while True:
        for address in live_addresses(cluster, down):
            try:
                reply = call(address, "produce", acks="quorum", timeout_ms=5000, topic=topic,
                             partition=partition, payload=encode_values([value]), count=1)
            except OSError:
                continue
            if reply["ok"]:
                return reply["base_offset"]
            assert reply["error"]["code"] in ("NOT_LEADER", "LEADERSHIP_LOST", "TIMEOUT"), reply
        assert time.monotonic() < deadline, reply
        time.sleep(0.1)


def values(address: str, topic: str, partition: int) -> list[bytes]:
    reply = call(address, "fetch", offset=0, topic=topic, partition=partition)
    if not reply["ok"]:
        return []
    return [r.value for b in reply["batches"] for r in decode_records(b["payload"])]


def partitions_running(address: str) -> set[tuple[str, int]]:
    try:
        st = call(address, "status")["status"]
    except OSError:  # (re)starting: not listening yet
        return set()
    return {(p["topic"], p["partition"]) for p in st["partitions"]}


def test_a_topic_on_real_processes_survives_a_kill_and_is_deleted(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        cluster.wait_leader()
        down: set[int] = set()
        created = admin(cluster, down, "topic_create", name="orders", partitions=4, replicas=3)
        assert created["ok"], created
        wanted = {("orders", p) for p in range(4)} | {("default", 0)}
        for address in cluster.addresses.values():
            wait_for(lambda a=address: partitions_running(a) == wanted,
                     f"{address} to run every partition", 60)
        acked = {p: [produce(cluster, down, "orders", p, f"p{p}-a".encode())]
                 for p in range(4)}
        victim = max(cluster.addresses)
        cluster.kill(victim)
        down.add(victim)
        for p in range(4):  # every partition elects again and takes writes
            acked[p].append(produce(cluster, down, "orders", p, f"p{p}-b".encode()))
        cluster.start(victim)
        down.discard(victim)
        address = cluster.addresses[victim]
        wait_for(lambda: partitions_running(address) == wanted,
                 "the restarted node to run its partitions from its store", 60)
        for p in range(4):
            wait_for(lambda p=p: values(address, "orders", p) == [f"p{p}-a".encode(),
                                                                    f"p{p}-b".encode()],
                     f"partition {p} to catch up on the restarted node", 60)
        deleted = admin(cluster, down, "topic_delete", name="orders")
        assert deleted["ok"], deleted
        for address in cluster.addresses.values():
            wait_for(lambda a=address: partitions_running(a) == {("default", 0)},
                     f"{address} to stop the deleted topic's partitions", 60)
        gone = call(cluster.addresses[victim], "fetch", offset=0, topic="orders")
        assert gone["error"]["code"] == "UNKNOWN_TOPIC"
