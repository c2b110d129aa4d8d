"""Leadership does not move while a follower catches up a large backlog under live writes.

What used to go wrong (issue 14): a leader read and encoded a whole recovery window of small
batches in one step of its event loop (and the follower decoded and appended it in one), long
enough for heartbeats to go unanswered; a healthy leader was deposed and leader-acked writes
were lost. This test checks the behaviour, not the timing: a follower misses 200 MiB (a quarter
of it in small batches, many per recovery chunk), restarts while a quorum producer keeps
writing, catches up, and nobody has been elected meanwhile: same term everywhere, the same
leader, and the producer never saw leadership lost.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio

from raft.cli.localcluster import LocalCluster, wait_for
from raft.client import BlockingClient, Client, RaftlogError

pytestmark = pytest.mark.slow
MIB = 1 << 20
RECORD = 1000
BIG_BATCH = 1024  # records per request: ~1 MiB batches
SMALL_BATCH = 4  # ~4 KiB batches: 128 of them per 512 KiB recovery chunk


async def _write(addr: str, mib: int, per_request: int, tasks: int) -> None:
    """`mib` MiB of RECORD-byte records in requests of `per_request` records, leader acks,
    `tasks` requests in flight."""
    value = os.urandom(RECORD)
    requests = mib * MIB // (RECORD * per_request)
    todo = iter(range(requests))

    async with Client(addr, timeout=60) as client:
        async def worker() -> None:
            for _ in todo:
                await client.produce([value] * per_request, acks="leader")

        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(worker)


class _QuorumProducer:
    """Writes quorum batches one after another until stopped; remembers every error code."""

    def __init__(self, servers: str) -> None:
        self.acked = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(servers,), daemon=True)
        self._thread.start()

    def _run(self, servers: str) -> None:
        with BlockingClient(servers, timeout=30) as c:
            i = 0
            while not self._stop.is_set():
                try:
                    c.produce([f"live-{i}".encode() * 20] * 16, acks="quorum")
                    self.acked += 1
                except RaftlogError as e:
                    self.errors.append(getattr(e, "code", type(e).__name__))
                i += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_no_leader_change_while_a_follower_catches_up_200_mib(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        leader = cluster.wait_leader()
        term = cluster.status_of(leader, timeout=5)["term"]
        lag = next(i for i in cluster.addresses if i != leader)
        assert cluster.terminate(lag) == 0
        addr = cluster.addresses[leader]
        trio.run(_write, addr, 150, BIG_BATCH, 4)
        trio.run(_write, addr, 50, SMALL_BATCH, 16)
        top = cluster.status_of(leader, timeout=10)["dirty_offset"]

        producer = _QuorumProducer(cluster.servers)
        try:
            wait_for(lambda: producer.acked > 0, "the quorum producer to get going", timeout=60)
            cluster.start(lag)

            def caught_up() -> bool:
                st = cluster.status_of(lag, timeout=5)
                return bool(st and st["flushed_offset"] >= top and st["commit_index"] >= top)

            wait_for(caught_up, "the restarted follower to flush the 200 MiB backlog",
                     timeout=300, interval=0.2)
            before = producer.acked
            wait_for(lambda: producer.acked > before, "a quorum write after the catch-up")
        finally:
            producer.close()

        statuses = {i: cluster.status_of(i, timeout=10) for i in cluster.addresses}
        assert all(st is not None for st in statuses.values()), statuses
        assert {i: st["term"] for i, st in statuses.items()} == {i: term for i in statuses}, (
            f"an election happened while node {lag} caught up (term was {term})")
        assert statuses[leader]["role"] == "leader"
        assert all(st["leader_id"] == leader for st in statuses.values())
        lost = [e for e in producer.errors if e in ("NOT_LEADER", "LEADERSHIP_LOST")]
        assert not lost, f"the producer saw leadership move: {producer.errors}"
