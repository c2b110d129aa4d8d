"""Disk loss and corruption on real processes (docs/DISK-LOSS.md).

- A follower whose data directory is deleted while it is stopped comes back with the same id
  and shows it is rejoining; in the election forced right after (its leader killed at that
  moment, the third node lacking the last acknowledged writes) it refuses its vote, so that
  node cannot win and lose them; once the old leader is back, the wiped node is re-added,
  caught up and promoted, and every acknowledged record is on all three.
- Random bytes of a stopped follower's LMDB file are overwritten inside stored batches: the
  damage is found when it starts again and repaired from the leader; the same under a running
  follower is found by the scrubber; every node's log then hashes the same.
- Twenty rounds of wiping, then rotting, one node in turn under a quorum writer lose nothing
  acknowledged.
"""

from __future__ import annotations

import random
import shutil
import threading
from pathlib import Path

import lmdb
import pytest

from raft.cli.demo import verify
from raft.cli.localcluster import LocalCluster, wait_for
from raft.client import BlockingClient, RaftlogError
from storage.batch import HEADER_SIZE

pytestmark = pytest.mark.slow

REJOINING = "rejoining: lost its disk"


# -- helpers ---------------------------------------------------------------------------------------
def node_dir(cluster: LocalCluster, node_id: int) -> Path:
    return cluster.data_dir / f"node-{node_id}"


def write(c: BlockingClient, acked: dict[int, bytes], tag: str, n: int, size: int = 64) -> None:
    values = [f"{tag}-{i:06d}-".encode() + b"x" * size for i in range(n)]
    res = c.produce(values, acks="quorum")
    acked.update({res.base_offset + i: v for i, v in enumerate(values)})


def stored_batches(path: Path) -> dict[int, bytes]:
    """base offset -> stored record, read from a stopped node's LMDB log."""
    env = lmdb.open(str(path), subdir=True, max_dbs=4, readonly=True, lock=False)
    try:
        db = env.open_db(b"log", create=False)
        with env.begin(db=db) as txn:
            return {int.from_bytes(k, "big"): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def rot(path: Path, bases: list[int], rng: random.Random) -> None:
    """Overwrite random bytes inside the payloads of these stored batches of a stopped node,
    in every copy of their record in data.mdb (LMDB may keep stale copies in free pages; the
    live one is surely among them)."""
    records = stored_batches(path)
    data_file = path / "data.mdb"
    data = data_file.read_bytes()
    with open(data_file, "r+b") as f:
        for base in bases:
            value = records[base]
            at, hits = data.find(value), 0
            while at >= 0:
                for _ in range(8):
                    f.seek(at + rng.randrange(HEADER_SIZE, len(value) - 4))
                    f.write(bytes([rng.randrange(256)]))
                hits += 1
                at = data.find(value, at + len(value))
            assert hits, f"the record of offset {base} is not in {data_file}"


def data_bases(path: Path, min_bytes: int = 256) -> list[int]:
    return sorted(k for k, v in stored_batches(path).items() if len(v) >= min_bytes)


def status(cluster: LocalCluster, node_id: int) -> dict:
    return cluster.status_of(node_id, timeout=3.0) or {}


def wait_whole(cluster: LocalCluster, node_id: int, timeout: float = 60.0) -> None:
    """Until `node_id` is a voter in good standing again, with nothing damaged, holding what
    the leader had committed when we started waiting."""
    leader = cluster.wait_leader(timeout=timeout)
    target = status(cluster, leader).get("commit_index", 0)

    def whole() -> bool:
        ldr = cluster.leader()
        st, lst = status(cluster, node_id), status(cluster, ldr) if ldr else {}
        return bool(st and lst and node_id in lst.get("voters", ())
                    and st.get("standing") == "member" and not st.get("damaged")
                    and st.get("flushed_offset", -1) >= target)

    wait_for(whole, f"node {node_id} to be a whole voter again", timeout)


class Writer:
    """A background quorum writer; `acked` maps offsets to what was acknowledged there."""

    def __init__(self, servers: str) -> None:
        self.acked: dict[int, bytes] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(servers,), daemon=True)
        self._thread.start()

    def _run(self, servers: str) -> None:
        with BlockingClient(servers, timeout=10) as c:
            i = 0
            while not self._stop.is_set():
                values = [f"w-{i:07d}-{k}-".encode() + b"y" * 200 for k in range(8)]
                i += 1
                try:
                    res = c.produce(values, acks="quorum", timeout=5.0)
                except RaftlogError:
                    self.errors += 1  # outcome unknown: not counted as acknowledged
                    continue
                self.acked.update({res.base_offset + k: v for k, v in enumerate(values)})

    def wait_more(self, n: int = 16, timeout: float = 30.0) -> None:
        start = len(self.acked)
        wait_for(lambda: len(self.acked) >= start + n, "acknowledged writes", timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def digests(cluster: LocalCluster, upto: int) -> dict[int, str]:
    import hashlib

    out = {}
    with BlockingClient(cluster.servers, timeout=20) as c:
        for i, addr in cluster.addresses.items():
            h, offset = hashlib.sha256(), 0
            while offset <= upto:
                res = c.fetch(offset, max_bytes=4 << 20, address=addr)
                for r in res.records:
                    if r.offset <= upto:
                        h.update(r.offset.to_bytes(8, "big") + r.value)
                if res.next_offset <= offset:
                    break
                offset = res.next_offset
            out[i] = h.hexdigest()
    return out


# -- the acceptance tests -------------------------------------------------------------------------
def test_a_wiped_follower_does_not_vote_then_rejoins_and_nothing_is_lost(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        leader = cluster.wait_leader()
        lag, wiped = [i for i in sorted(cluster.addresses) if i != leader]
        acked: dict[int, bytes] = {}
        with BlockingClient(cluster.servers, timeout=20) as c:
            write(c, acked, "all-three", 100)
            assert cluster.terminate(lag) == 0
            write(c, acked, "without-lag", 100)  # on the leader and `wiped` only
        assert cluster.terminate(wiped) == 0
        shutil.rmtree(node_dir(cluster, wiped))
        cluster.start(lag)
        cluster.start(wiped)
        cluster.kill(leader)  # the election is forced now: `lag` and `wiped` are left
        lag_led = []

        def refused_lags_requests() -> bool:
            if status(cluster, lag).get("role") == "leader":
                lag_led.append(True)
            st = status(cluster, wiped)
            return st.get("standing") == REJOINING and st.get("votes_refused", 0) >= 3

        wait_for(refused_lags_requests, "the wiped node to refuse the lagging node's "
                                        "vote requests", timeout=60)
        assert not lag_led and status(cluster, lag).get("role") != "leader", (
            "the lagging node won with the vote of a node that lost its disk")
        cluster.start(leader)
        wait_whole(cluster, wiped)
        st = status(cluster, wiped)
        assert st["incarnation"] and st["standing"] == "member"
        lst = status(cluster, cluster.wait_leader())
        assert sorted(lst["voters"]) == sorted(cluster.addresses)
        problems = verify(cluster, acked)
        assert not problems, problems[:5]
        assert len(set(digests(cluster, max(acked)).values())) == 1


def test_overwritten_bytes_are_found_repaired_and_the_logs_hash_the_same(tmp_path: Path) -> None:
    """Bytes rot in a stopped follower's file (found when it starts again), then in a running
    one's (found by the scrubber): every damaged batch is repaired from the leader."""
    rng = random.Random(17)
    with LocalCluster(tmp_path, nodes=3, extra_args=["--scrub-rate", "64"]) as cluster:
        leader = cluster.wait_leader()
        f = next(i for i in sorted(cluster.addresses) if i != leader)
        acked: dict[int, bytes] = {}
        with BlockingClient(cluster.servers, timeout=30) as c:
            for k in range(40):
                write(c, acked, f"b{k:03d}", 100, size=1000)
        cluster.wait_caught_up(f)
        assert cluster.terminate(f) == 0
        bases = data_bases(node_dir(cluster, f), 64 << 10)
        stopped = [bases[1], bases[len(bases) // 2], bases[-1]]
        rot(node_dir(cluster, f), stopped, rng)
        cluster.start(f)

        def repaired(n: int) -> bool:
            st = status(cluster, f)
            return bool(st) and not st.get("damaged") and cluster.node_log(f).count(
                "log_damage_repaired") >= n

        wait_for(lambda: repaired(len(stopped)), "the damage to be found and repaired", 60)
        found = " ".join(status(cluster, f)["open_findings"]) + cluster.node_log(f)
        for b in stopped:
            assert f"offsets {b}.." in found and f"offsets={b}.." in found, b
        # Now rot an old batch under the running follower: only the scrubber reads it (once the
        # subscription table, rebuilt from the log after the restart, has read past it).
        wait_for(lambda: status(cluster, f).get("subscriptions", {}).get("applied", -1)
                 >= bases[-1], "the restarted follower's subscription table to catch up", 60)
        running = [bases[2]]
        rot(node_dir(cluster, f), running, rng)
        wait_for(lambda: status(cluster, f).get("scrub", {}).get("found", 0) >= 1,
                 "the scrubber to find the damage", 60)
        wait_for(lambda: repaired(len(stopped) + len(running)), "the repair", 60)
        assert f"offsets={running[0]}.." in cluster.node_log(f)
        problems = verify(cluster, acked)
        assert not problems, problems[:5]
        assert len(set(digests(cluster, max(acked)).values())) == 1


def test_twenty_rounds_of_wiping_then_rotting_one_node_lose_nothing(tmp_path: Path) -> None:
    rng = random.Random(20)
    with LocalCluster(tmp_path, nodes=3, extra_args=["--scrub-rate", "64"]) as cluster:
        cluster.wait_leader()
        writer = Writer(cluster.servers)
        ids = sorted(cluster.addresses)
        try:
            for r in range(20):
                victim = ids[r % 3]
                writer.wait_more()
                cluster.kill(victim)
                shutil.rmtree(node_dir(cluster, victim))
                cluster.start(victim)
                wait_whole(cluster, victim)
                writer.wait_more()
                cluster.kill(victim)
                bases = data_bases(node_dir(cluster, victim))
                rot(node_dir(cluster, victim), rng.sample(bases, min(3, len(bases))), rng)
                found = cluster.node_log(victim).count("log_damage_found")
                cluster.start(victim)
                wait_whole(cluster, victim)
                assert cluster.node_log(victim).count("log_damage_found") > found
        finally:
            writer.close()
        assert len(writer.acked) > 20 * 2 * 16
        problems = verify(cluster, writer.acked)
        assert not problems, problems[:5]
