"""Issue 24 items 2 and 4 on real `raftlog serve` processes (docs/DISK-LOSS.md).

Both start from the same shape, which a real cluster reaches without any timing trick:
`behind` is stopped while a batch B commits on `good` and `damaged`; all stop; B's payload
rots in `damaged`'s LMDB file (a record that still looks valid: its header and offsets hold,
its checksum fails); `behind` and `damaged` start while `good` stays down. `behind` cannot win
(its log is shorter), so `damaged` leads once its doubled election timeout runs out, holding B
damaged, with no running voter holding a good copy.

- Item 4: committed data is declared lost only on evidence from every voter. `damaged` must not
  stop with DataLost (on the old code it did, having heard only from `behind`), and its status
  names `good` in `damage_waiting_for`; once `good` is back, B is repaired and every
  acknowledged record reads back exactly once from every node, and no node exited.
- Item 2: B is an idempotent producer's batch (P, S). Its retry reaches `damaged` while it leads
  and cannot read B (its producer table, rebuilt at start-up, could not read it). It must not
  be appended a second time: the answer is a retryable BACKPRESSURE, and once `good` is back
  the same retry gets B's original offsets; the log holds the record exactly once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from raft.cli.demo import verify
from raft.cli.localcluster import LocalCluster, wait_for
from raft.client import BlockingClient, RaftlogError
from test_disk_loss_processes import node_dir, rot, stored_batches

pytestmark = pytest.mark.slow

PRODUCER = 0x5EED_2402
SEQUENCE = 0
ELECTION_TICKS = 10  # the core's default (raft/core/config.py); the cluster sets none


@dataclass(slots=True)
class Shape:
    behind: int
    good: int
    damaged: int
    first: int  # B's offsets
    last: int


def status(cluster: LocalCluster, node_id: int) -> dict:
    return cluster.status_of(node_id, timeout=3.0) or {}


def live_status(cluster: LocalCluster, node_id: int, why: str) -> dict:
    """`node_id`'s status; fails with its log if it exited (`why` says what that means).
    {} when it did not answer this time."""
    st = status(cluster, node_id)
    if not st and not cluster.alive(node_id):
        raise AssertionError(f"node {node_id} exited ({cluster.returncode(node_id)}) {why}:\n"
                             + cluster.node_log(node_id)[-3000:])
    return st


def read_all(client: BlockingClient, address: str) -> list[tuple[int, bytes]]:
    """Every committed record one node serves, in order."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        res = client.fetch(offset, max_bytes=4 << 20, address=address)
        out.extend((r.offset, r.value) for r in res.records)
        if not res.records or res.next_offset <= offset:
            return out
        offset = res.next_offset


def damaged_leads(cluster: LocalCluster, acked: dict[int, bytes],
                  b_values: list[bytes], **b_kwargs: object) -> Shape:
    """Brings the cluster to the shape of the module docstring. B (`b_values`, produced with
    `b_kwargs`) is acknowledged into `acked`."""
    first_leader = cluster.wait_leader()
    ids = sorted(cluster.addresses)
    behind = next(i for i in ids if i != first_leader)
    damaged = next(i for i in ids if i not in (behind, first_leader))
    good = first_leader
    with BlockingClient(cluster.servers, timeout=20) as c:
        for k in range(3):  # on all three
            values = [f"all-{k}-{i:04d}-".encode() + b"a" * 100 for i in range(50)]
            res = c.produce(values, acks="quorum")
            acked.update({res.base_offset + i: v for i, v in enumerate(values)})
        cluster.wait_caught_up(behind)
        assert cluster.terminate(behind) == 0
        res = c.produce(b_values, acks="quorum", **b_kwargs)  # on `good` and `damaged` only
        acked.update({res.base_offset + i: v for i, v in enumerate(b_values)})
    first, last = res.base_offset, res.last_offset
    # `damaged` must know B is committed (its checkpointed commit index passes it) and hold it.
    wait_for(lambda: status(cluster, damaged).get("commit_index", -1) >= last
             and status(cluster, damaged).get("flushed_offset", -1) >= last,
             f"node {damaged} to flush and learn the commit of {first}..{last}", 60)
    assert cluster.terminate(good) == 0
    assert cluster.terminate(damaged) == 0
    assert first in stored_batches(node_dir(cluster, damaged))
    rot(node_dir(cluster, damaged), [first], random.Random(24))
    cluster.start(behind)
    cluster.start(damaged)

    def damaged_leader() -> bool:
        st = live_status(cluster, damaged, "before it led")
        return st.get("role") == "leader" and bool(st.get("damaged"))

    wait_for(damaged_leader, f"node {damaged}, with {first}..{last} damaged, to lead", 60)
    return Shape(behind, good, damaged, first, last)


def assert_no_node_exited(cluster: LocalCluster, *, down: tuple[int, ...] = ()) -> None:
    """Every node but those the test stopped (`down`) still runs."""
    for i in cluster.addresses:
        if i in down:
            continue
        assert cluster.alive(i), (f"node {i} exited ({cluster.returncode(i)}):\n"
                                  + cluster.node_log(i)[-3000:])


def wait_repaired(cluster: LocalCluster, s: Shape) -> None:
    """`good` is back: the damaged range is repaired, the leader waits for nobody, and every
    node has caught up with the leader."""
    def repaired() -> bool:
        assert_no_node_exited(cluster)
        st = status(cluster, s.damaged)
        return (bool(st) and not st.get("damaged") and not st.get("damage_waiting_for")
                and "log_damage_repaired" in cluster.node_log(s.damaged)
                and cluster.leader() is not None)

    wait_for(repaired, f"node {s.damaged}'s copy of {s.first}..{s.last} to be repaired", 90)
    for i in cluster.addresses:
        cluster.wait_caught_up(i)


# -- item 4 ----------------------------------------------------------------------------------------
def test_committed_data_is_not_declared_lost_while_the_voter_holding_it_is_down(
        tmp_path: Path) -> None:
    acked: dict[int, bytes] = {}
    b_values = [f"b-{i:04d}-".encode() + b"b" * 200 for i in range(200)]
    with LocalCluster(tmp_path, nodes=3) as cluster:
        s = damaged_leads(cluster, acked, b_values)

        # `behind` answers without B (its log ends before it); `good` has said nothing.
        why = (f"although voter {s.good}, holding a good copy of {s.first}..{s.last}, is only "
               f"down")

        def behind_answered() -> bool:
            st = live_status(cluster, s.damaged, why)
            assert not st or st.get("role") == "leader", st
            return st.get("damage_waiting_for") == [s.good]  # not `behind`: it answered

        wait_for(behind_answered, f"node {s.damaged} to say it waits for voter {s.good}", 60)
        # Evidence that the leader waited, not a sleep: its own count of ticks since it last
        # heard from `good` passes four election timeouts (the old rule gave up after one),
        # while it stays leader in the same term, alive, naming `good`.
        term = status(cluster, s.damaged)["term"]

        def waited_long() -> bool:
            st = live_status(cluster, s.damaged, why)
            if not st:
                return False
            assert st.get("role") == "leader" and st.get("term") == term, st
            assert st.get("damage_waiting_for") == [s.good], st.get("damage_waiting_for")
            heard = {f["node_id"]: f["last_heard_ticks"] for f in st.get("followers", [])}
            return heard.get(s.good, 0) >= 4 * ELECTION_TICKS

        wait_for(waited_long, f"node {s.damaged} to wait {4 * ELECTION_TICKS} ticks for "
                              f"voter {s.good}", 60)
        assert "DataLost" not in cluster.node_log(s.damaged)

        cluster.start(s.good)
        wait_repaired(cluster, s)
        problems = verify(cluster, acked)
        assert not problems, problems[:5]
        with BlockingClient(cluster.servers, timeout=20) as c:
            for i, addr in cluster.addresses.items():
                values = [v for _, v in read_all(c, addr)]
                for v in acked.values():
                    assert values.count(v) == 1, (i, v[:20], values.count(v))
        assert_no_node_exited(cluster)
        for i in cluster.addresses:
            assert "DataLost" not in cluster.node_log(i), i


# -- item 2 ----------------------------------------------------------------------------------------
def test_a_leader_that_cannot_read_a_damaged_batch_does_not_append_its_retry_again(
        tmp_path: Path) -> None:
    acked: dict[int, bytes] = {}
    b_values = [f"idem-{i:04d}-".encode() + b"p" * 200 for i in range(200)]
    ids = {"producer_id": PRODUCER, "sequence": SEQUENCE}
    with LocalCluster(tmp_path, nodes=3) as cluster:
        s = damaged_leads(cluster, acked, b_values, **ids)
        assert cluster.leader() == s.damaged

        # The producer's retry of (P, S), same payload, while `damaged` leads and cannot read B.
        # The client retries retryable answers inside its timeout; a short one lets the test
        # see the answer it gave up on. acks=leader: the answer says what the leader did with
        # the write (appended as new, found, refused) without waiting for a commit that cannot
        # come while `good` is down.
        outcome: dict[str, object] = {}
        with BlockingClient(cluster.servers, timeout=5) as c:
            try:
                res = c.produce(b_values, acks="leader", timeout=3.0, **ids)
                outcome["offsets"] = (res.base_offset, res.last_offset)
            except RaftlogError as e:
                outcome["error"] = e.code
        assert outcome.get("error") == "BACKPRESSURE" or outcome.get("offsets") == (
            s.first, s.last), f"the retry of ({PRODUCER}, {SEQUENCE}) was answered {outcome}"
        assert_no_node_exited(cluster, down=(s.good,))
        st = status(cluster, s.damaged)
        assert st.get("dirty_offset", 0) < s.first + 2 * len(b_values), (
            f"node {s.damaged} appended the retry again: its log ends at {st.get('dirty_offset')}")

        cluster.start(s.good)
        wait_repaired(cluster, s)
        with BlockingClient(cluster.servers, timeout=30) as c:
            again = c.produce(b_values, acks="quorum", timeout=30.0, **ids)
            assert (again.base_offset, again.last_offset) == (s.first, s.last), (
                f"the retry of ({PRODUCER}, {SEQUENCE}) got {again}, not {s.first}..{s.last}")
            assert again.duplicate
            for i in cluster.addresses:
                cluster.wait_caught_up(i)  # and knows the commit of the retry's answer
            for i, addr in cluster.addresses.items():
                values = [v for _, v in read_all(c, addr)]
                copies = values.count(b_values[0])
                assert copies == 1, f"node {i} holds the retried batch {copies} times"
        problems = verify(cluster, acked)
        assert not problems, problems[:5]
        assert_no_node_exited(cluster)
