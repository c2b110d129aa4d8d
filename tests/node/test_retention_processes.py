"""Retention on real `raftlog serve` processes: size retention keeps the newest acknowledged data
(issue 24: a batch larger than --retention-bytes stays, and `consume --from -3` reads its last
records); a GiB through a 64 MiB retention stays in bounded disk; a member that stays down holds retention back until --retention-max-ms, then is skipped
(status says so), and when it comes back behind the log start it gets the state transfer, ends
with the leader's log above the new start, and an idempotent retry across all this gets its
original offset."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from cli_helpers import raftlog
from raft.cli.localcluster import LocalCluster, wait_for
from raft.client import BlockingClient, OffsetOutOfRangeError
from raft.node.retention import data_dir_bytes

pytestmark = pytest.mark.slow
MIB = 1 << 20


def now_ms() -> int:
    return int(time.time() * 1000)


def write_bulk(client: BlockingClient, nbytes: int, record: bytes,
               cluster: LocalCluster | None = None) -> None:
    """Large batches (4 MB), acks=leader: as fast as one client pushes bytes through the
    leader. Every 4th batch is a quorum write, and with `cluster` the writer then waits until
    every node has flushed it: acks=leader alone has no flow control, and a leader rightly
    keeps what a member has not flushed, so on a loaded machine an unbounded backlog behind
    the slowest follower would measure that follower's lag, not retention. The caller ends
    with a quorum write."""
    per = (4 * 1000 * 1000) // len(record)
    values = [record] * per
    producer = int.from_bytes(os.urandom(7), "big") + 1  # retries after a leader change are safe
    for k in range(1, max(1, nbytes // (per * len(record))) + 1):
        res = client.produce(values, acks="quorum" if k % 4 == 0 else "leader",
                             producer_id=producer, sequence=k)
        if cluster is not None and k % 4 == 0:
            wait_for(lambda: all((st := cluster.status_of(i, timeout=5)) is not None
                                 and st["flushed_offset"] >= res.last_offset
                                 for i in cluster.addresses),
                     "every node to flush the last quorum write", timeout=60, interval=0.02)


class PeakSize:
    """Samples each node's data directory size in the background; keeps the largest seen."""

    def __init__(self, data_dir: Path, nodes: list[int]) -> None:
        self.dirs = {i: data_dir / f"node-{i}" for i in nodes}
        self.peak = {i: 0 for i in nodes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):  # sampling period, not synchronisation
            self.sample()

    def sample(self) -> None:
        for i, d in self.dirs.items():
            if d.exists():
                self.peak[i] = max(self.peak[i], data_dir_bytes(d))

    def close(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()
        return self.peak


def test_a_gib_through_a_64_mib_retention_stays_in_bounded_disk(tmp_path: Path) -> None:
    """Why 1 GiB: it is 16 times the retention size, so a node that kept everything (or whose
    LMDB file did not reuse freed pages) would end far past the 2x bound, while the log start
    moves through many retention rounds. Written in 4 MB batches with acks=leader (the fastest
    a single client pushes bytes through replication) and one quorum write at the end."""
    retention = 64 * MIB
    with LocalCluster(tmp_path, nodes=3,
                      extra_args=["--retention-bytes", "64MiB"]) as cluster:
        leader = cluster.wait_leader()
        sizes = PeakSize(tmp_path, list(cluster.addresses))
        try:
            with BlockingClient(cluster.servers, timeout=60) as c:
                write_bulk(c, 1 << 30, os.urandom(1000), cluster)
                (last,) = c.produce_idempotent([b"the end"], acks="quorum")

            def settled() -> bool:
                """Retention keeps at least its limit, in whole batches: at most one 4 MB
                batch more than the limit (docs/RETENTION.md)."""
                sts = [cluster.status_of(i, timeout=5) for i in cluster.addresses]
                return all(st and st["commit_index"] >= last and st["start_offset"] > 0
                           and retention <= st["retained_bytes"] < retention + 4 * MIB
                           for st in sts)
            wait_for(settled, "every node to apply retention", timeout=120, interval=0.2)
        finally:
            peak = sizes.close()
        assert all(p < 2 * retention for p in peak.values()), {
            i: f"{p / MIB:.0f} MiB" for i, p in peak.items()}
        st = cluster.status_of(leader, timeout=5)
        assert st is not None
        ret = st["retention"]
        assert ret["deleted_bytes"] > (1 << 30) - 2 * retention
        assert ret["policy"]["retention_bytes"] == retention
        with BlockingClient(cluster.servers) as c, pytest.raises(OffsetOutOfRangeError) as err:
            c.fetch(0)
        start = err.value.start_offset
        assert start is not None and start > 0 and f"[{start}," in str(err.value)


def committed_digest(cluster: LocalCluster, node: int, lo: int, hi: int) -> tuple[int, str]:
    """(records, sha256) of node's committed records in [lo, hi], read from that node."""
    h = hashlib.sha256()
    n = 0
    with BlockingClient(cluster.addresses[node], timeout=30) as c:
        offset = lo
        while offset <= hi:
            res = c.fetch(offset, max_bytes=8 * MIB, address=cluster.addresses[node])
            for r in res.records:
                if r.offset > hi:
                    break
                h.update(r.offset.to_bytes(8, "big") + r.value)
                n += 1
            if res.next_offset <= offset:
                break
            offset = res.next_offset
    return n, h.hexdigest()


def test_a_down_member_holds_retention_until_the_valve_then_rejoins_by_state_transfer(
        tmp_path: Path) -> None:
    max_ms = 3000
    with LocalCluster(tmp_path, nodes=3, extra_args=[
            "--retention-bytes", "2MiB", "--retention-max-ms", str(max_ms)]) as cluster:
        leader = cluster.wait_leader()
        lag = next(i for i in cluster.addresses if i != leader)
        with BlockingClient(cluster.servers, timeout=60) as c:
            c.produce_idempotent([b"everyone has this"], acks="quorum")
        cluster.wait_caught_up(lag)
        assert cluster.terminate(lag) == 0
        lst = cluster.status_of(leader, timeout=5)
        assert lst is not None
        lag_flushed = next(f["flushed_offset"] for f in lst["followers"] if f["node_id"] == lag)

        # While it is away: an idempotent producer's write, then bulk well past the retention.
        producer, written_at = 4242, now_ms()
        with BlockingClient(cluster.servers, timeout=60) as c:
            original = c.produce([b"once"], acks="quorum", producer_id=producer, sequence=0)
            write_bulk(c, 16 * MIB, os.urandom(1000))
            c.produce_idempotent([b"bulk done"], acks="quorum")
        assert original.base_offset > lag_flushed

        # Held for the member until the valve's age passes; then skipped, and status says so.
        seen: list[tuple[int, int, dict]] = []

        def released() -> bool:
            t = now_ms()
            st = cluster.status_of(leader, timeout=5)
            if st is None:
                return False
            seen.append((t, st["start_offset"], st["retention"]))
            return st["start_offset"] > original.base_offset
        wait_for(released, "the age valve to release the down member", timeout=90,
                 interval=0.1)
        early = [(t, start, r) for t, start, r in seen if t < written_at + max_ms]
        assert all(start <= lag_flushed + 1 for _, start, _ in early), early[:3]
        assert any(r.get("held_by") == f"member {lag}" for _, _, r in early) or not early
        ret = seen[-1][2]
        skip = [s for s in ret["skipped"] if s["holder"] == f"member {lag}"]
        assert skip and skip[0]["valve"] == "retention_max_ms"
        assert skip[0]["at_ms"] >= written_at + max_ms
        assert any({"holder": f"member {lag}", "valve": "retention_max_ms"} in r["skipping"]
                   for _, _, r in seen)

        # It comes back behind the log start: the state transfer, then catch-up.
        lead_start = cluster.status_of(leader, timeout=5)["start_offset"]
        cluster.start(lag)
        cluster.wait_caught_up(lag, timeout=120)
        mine = cluster.status_of(lag, timeout=5)
        assert mine is not None and mine["start_offset"] >= lead_start > lag_flushed + 1
        top = mine["commit_index"]
        lo = max(mine["start_offset"], cluster.status_of(leader, timeout=5)["start_offset"])
        assert committed_digest(cluster, lag, lo, top) == \
            committed_digest(cluster, leader, lo, top)

        # It leads, and the producer's retry of the write it never saw gets the original offset.
        with BlockingClient(cluster.servers, timeout=30) as c:
            c.transfer_leader(to=lag)
        assert cluster.wait_leader(timeout=30) == lag
        with BlockingClient(cluster.addresses[lag], timeout=30) as c:
            retry = c.produce([b"once"], acks="quorum", producer_id=producer, sequence=0)
        assert retry.duplicate and retry.base_offset == original.base_offset


def test_size_retention_keeps_the_batch_just_acknowledged(tmp_path: Path) -> None:
    """Issue 24's repro: three nodes with --retention-bytes 20KiB, 100 records of 510 bytes in
    one quorum-acknowledged batch (~51 KB, larger than the limit). Once every node has run a
    retention round that saw the batch committed, every node still holds it (at least 20 KiB,
    high watermark = its last offset) and `raftlog consume --from -3` prints its last three
    records. It used to delete the whole log: start_offset 101, nothing to read."""
    limit = 20 << 10
    values = [f"{k:03d}".encode() + bytes([97 + k % 26]) * 507 for k in range(100)]
    assert all(len(v) == 510 for v in values)
    with LocalCluster(tmp_path, nodes=3, extra_args=["--retention-bytes", "20KiB"]) as cluster:
        cluster.wait_leader()
        with BlockingClient(cluster.servers, timeout=30) as c:
            res = c.produce(values, acks="quorum")
        assert res.last_offset - res.base_offset == 99

        def retention_ran(i: int) -> dict | None:
            """Node i's status once its retention has planned with the batch committed (the
            commit index's hold, which every round reports, has reached the batch)."""
            st = cluster.status_of(i, timeout=5)
            if st is None or st["commit_index"] < res.last_offset:
                return None
            ret = st.get("retention") or {}
            if not any(h["holder"] == "commit index" and h["offset"] >= res.last_offset
                       for h in ret.get("holds", [])):
                return None
            return st
        for i in cluster.addresses:
            st = wait_for(lambda: retention_ran(i), f"node {i} to run retention", timeout=60,
                          interval=0.1)
            assert st["retention"]["policy"]["retention_bytes"] == limit
            assert st["start_offset"] <= res.base_offset, st["retention"]
            assert st["high_watermark"] >= res.last_offset
            assert st["retained_bytes"] >= limit, st["retention"]

        out = raftlog("consume", "--servers", cluster.servers, "--from", "-3")
        assert out.returncode == 0, out.stderr
        got = [line.split("\t", 1) for line in out.stdout.splitlines()]
        assert got == [[str(res.base_offset + k), values[k].decode()] for k in (97, 98, 99)]
