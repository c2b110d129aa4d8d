"""Retention's policy (raft/core/retention.py): where the log start may move, and who holds it back.

Table-driven planner cases over a synthetic log, then the holds of a real core: the commit index
and every member's flushed offset bound the cut on the leader, whatever the policy wants."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import raft.core.retention as retention
from harness import Cluster
from raft.core.loads import LoadTable, encode_begin
from raft.core.retention import (
    LOG_END,
    MIN_AGE,
    SATISFIED,
    SLICE,
    VALVE_AGE,
    VALVE_DISK,
    Hold,
    RetentionPolicy,
    plan,
)
from raft.core.snapshot import SnapshotContext
from raft.core.types import Acks
from storage.batch import HEADER_SIZE, Batch, BatchKind
from storage.memory import MemoryLog

NOW = 1_000_000
CTX = SnapshotContext(bootstrap_config={"voters": [1, 2, 3]})


def synthetic_log(ages_ms: list[int], size: int = 100) -> MemoryLog:
    """Batches of `size` payload bytes, one per age (oldest first), all flushed."""
    log = MemoryLog()
    for i, age in enumerate(ages_ms):
        b = Batch.create(b"x" * size, 1, timestamp_ms=NOW - age).placed(i, 1)
        log.append([b])
    log.flush()
    return log


BATCH = 100 + HEADER_SIZE  # one synthetic batch, encoded

# (case, ages, policy, holds, free bytes, expected cut, expected stop reason)
CASES = [
    ("nothing configured keeps everything", [9000] * 5, RetentionPolicy(), [], None, 0,
     SATISFIED),
    ("size: keep exactly two batches' worth", [50] * 5, RetentionPolicy(max_bytes=2 * BATCH),
     [], None, 3, SATISFIED),
    ("size: keep at least the limit, rounded up to whole batches", [50] * 5,
     RetentionPolicy(max_bytes=2 * BATCH + 1), [], None, 2, SATISFIED),
    ("size: one batch larger than the limit stays", [50], RetentionPolicy(max_bytes=BATCH - 1),
     [], None, 0, SATISFIED),
    ("age: older than 100 ms goes", [500, 400, 90, 50, 10], RetentionPolicy(max_age_ms=100),
     [], None, 2, SATISFIED),
    ("age counts from the newest timestamp so far", [500, 10, 400, 300], 
     RetentionPolicy(max_age_ms=100), [], None, 1, SATISFIED),
    ("min age wins over size", [500, 300, 90, 50], RetentionPolicy(max_bytes=1, min_age_ms=200),
     [], None, 2, MIN_AGE),
    ("a hard hold stops it", [500] * 5, RetentionPolicy(max_bytes=1),
     [Hold("commit index", 2, False)], None, 2, "commit index"),
    ("a member holds without a valve", [500] * 5, RetentionPolicy(max_bytes=1),
     [Hold("member 3", 1, True)], None, 1, "member 3"),
    ("the age valve releases a member for old batches only", [900, 800, 100, 50],
     RetentionPolicy(max_bytes=1, valve_age_ms=500), [Hold("member 3", 0, True)], None, 2,
     "member 3"),
    ("low disk releases a member", [50] * 4, RetentionPolicy(max_bytes=1, low_disk_bytes=1000),
     [Hold("member 3", 0, True), Hold("commit index", 2, False)], 999, 2, "commit index"),
    ("low disk never releases the commit index", [50] * 4,
     RetentionPolicy(max_bytes=1, low_disk_bytes=1000), [Hold("commit index", 1, False)], 10,
     1, "commit index"),
    ("low disk never releases an open load", [50] * 4,
     RetentionPolicy(max_bytes=1, low_disk_bytes=1000), [Hold("load 'x'", 2, False)], 10, 2,
     "load 'x'"),
    ("plenty of disk: no valve", [50] * 4, RetentionPolicy(max_bytes=1, low_disk_bytes=1000),
     [Hold("member 3", 1, True)], 5000, 1, "member 3"),
    ("a slice stops at its batch limit", [500] * 6, RetentionPolicy(max_bytes=1,
                                                                    slice_batches=4),
     [], None, 4, SLICE),
    ("a slice stops at its byte limit (one batch at least)", [500] * 6,
     RetentionPolicy(max_bytes=1, slice_bytes=10), [], None, 1, SLICE),
    ("size never takes the last batch (at least one byte stays)", [500] * 3,
     RetentionPolicy(max_bytes=1), [], None, 2, SATISFIED),
    ("age alone, without holds, may reach the log end (on a node the commit index holds the "
     "newest committed batch)", [500] * 3, RetentionPolicy(max_age_ms=100), [], None, 3,
     LOG_END),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_planner(case: tuple) -> None:
    _, ages, policy, holds, free, cut, stopped = case
    log = synthetic_log(ages)
    p = plan(log, policy.validate(), holds, now_ms=NOW, free_bytes=free, ctx=CTX)
    assert (p.decision.cut, p.decision.stopped_by) == (cut, stopped)
    assert p.decision.more == (stopped == SLICE)
    if cut:
        assert p.snapshot is not None and p.snapshot["start_offset"] == cut


def test_a_valve_names_what_it_skipped() -> None:
    log = synthetic_log([900, 800, 100])
    p = plan(log, RetentionPolicy(max_bytes=1, valve_age_ms=500),
             [Hold("member 3", 0, True)], now_ms=NOW, free_bytes=None, ctx=CTX)
    assert [(s.holder, s.valve) for s in p.decision.skipped] == [("member 3", VALVE_AGE)]
    p = plan(synthetic_log([10, 10]), RetentionPolicy(max_bytes=1, low_disk_bytes=100),
             [Hold("member 2", 0, True)], now_ms=NOW, free_bytes=1, ctx=CTX)
    assert [(s.holder, s.valve) for s in p.decision.skipped] == [("member 2", VALVE_DISK)]


def test_an_open_load_holds_its_staged_data() -> None:
    """The first offset of an open Spark load, and anything the loads table has not applied,
    are never deleted, whatever the valves say."""
    table = LoadTable(0)
    for i in range(3):
        table.apply(Batch.create(b"d", 1).placed(i, 1))
    table.apply(Batch.create(encode_begin("job"), 1, kind=BatchKind.CONTROL).placed(3, 1))
    holds = retention.load_holds(table)
    assert Hold("load 'job'", 3, False) in holds
    log = synthetic_log([500] * 8)
    p = plan(log, RetentionPolicy(max_bytes=1, low_disk_bytes=10), holds, now_ms=NOW,
             free_bytes=0, ctx=CTX)
    assert p.decision.cut == 3 and p.decision.stopped_by == "load 'job'"
    table2 = LoadTable(0)
    table2.apply(Batch.create(b"d", 1).placed(0, 1))  # applied up to 0 only
    p = plan(log, RetentionPolicy(max_bytes=1), retention.load_holds(table2), now_ms=NOW,
             free_bytes=None, ctx=CTX)
    assert p.decision.cut == 1


def test_policy_refuses_a_valve_below_the_minimum() -> None:
    with pytest.raises(ValueError, match="retention_max_ms"):
        RetentionPolicy(max_bytes=1, min_age_ms=1000, valve_age_ms=500).validate()
    with pytest.raises(ValueError):
        RetentionPolicy(max_bytes=0).validate()


# -- the holds of a real core ------------------------------------------------------------------

def retain(c: Cluster, i: int, policy: RetentionPolicy, now_ms: int = 10**12) -> int:
    """One retention slice on node i, as the runtime applies it; returns the new log start.
    (The holds are looked up through the module, so tests/raft/test_mutants.py can swap them.)"""
    core, log = c.cores[i], c.logs[i]
    p = plan(log, policy, retention.core_holds(core.status()), now_ms=now_ms, free_bytes=None,
             ctx=core.snapshot_context())
    if p.decision.cut > p.decision.start:
        log.truncate_prefix(p.decision.cut, p.snapshot)
    return log.start_offset


def base_of(c: Cluster, i: int, offset: int) -> int:
    """The base offset of the batch holding `offset` in node i's log."""
    (b, *_) = c.logs[i].read(offset, 1)
    assert b.base_offset <= offset <= b.last_offset
    return b.base_offset


def test_retention_never_passes_the_commit_index() -> None:
    """The leader has flushed far past the commit index (no follower answers): however much the
    policy wants gone, and with every member released by the valve, the cut stops at the
    newest committed batch, which stays (the uncommitted tail may yet be truncated away: it
    must not be what is left of the log)."""
    c = Cluster(3)
    leader = c.elect()
    for k in range(5):
        c.propose(leader, [f"v{k}".encode()], Acks.QUORUM)
    c.deliver()
    committed = c.cores[leader].commit_index
    c.down |= {i for i in c.ids if i != leader}
    for k in range(20):
        c.propose(leader, [f"w{k}".encode()], Acks.LEADER)
    c.flush(leader)
    assert c.logs[leader].flushed_offset > committed + 10
    start = retain(c, leader, RetentionPolicy(max_bytes=1, valve_age_ms=1))
    assert start == base_of(c, leader, committed) and start > 0


def test_a_follower_never_deletes_past_its_commit_index() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.propose(leader, [b"a", b"b"], Acks.QUORUM)
    c.tick(2)  # the followers learn that [a, b] committed
    c.propose(leader, [b"c"], Acks.QUORUM)
    c.deliver()  # they hold [c] flushed before they learn it committed
    f = next(i for i in c.ids if i != leader)
    commit = c.cores[f].commit_index
    assert 0 < commit < c.logs[f].flushed_offset
    start = retain(c, f, RetentionPolicy(max_bytes=1, valve_age_ms=1))
    assert start == base_of(c, f, commit) and start > 0


def test_the_leader_keeps_what_a_member_has_not_flushed() -> None:
    """A follower that appended (matched) but never flushed holds the leader's log from its
    flushed offset on, until a valve releases it."""
    c = Cluster(3)
    leader = c.elect()
    c.propose(leader, [b"first"], Acks.QUORUM)
    c.deliver()
    slow = next(i for i in c.ids if i != leader)
    c.auto_flush[slow] = False
    held_from = c.logs[slow].flushed_offset + 1
    for k in range(10):
        c.propose(leader, [f"v{k}".encode()], Acks.QUORUM)
    c.tick(3)  # its heartbeat replies report the dirty offset it matched
    pr = c.cores[leader].progress(slow)
    assert pr is not None and pr.match_index > held_from + 2  # matched, not flushed
    assert retain(c, leader, RetentionPolicy(max_bytes=1)) == held_from
    # The age valve releases it (the batches are older than its limit).
    assert retain(c, leader, RetentionPolicy(max_bytes=1, valve_age_ms=1)) > held_from


def test_the_loads_table_survives_retention_and_a_state_transfer() -> None:
    """A committed load whose entries retention dropped keeps its outcome; an open load keeps
    its staged data and can still commit after the log start moved; a node reset to that start
    (the state transfer) rebuilds the same table from the state alone."""
    from raft.core.loads import LoadIndex, StageTag, encode_commit, encode_staged_payload
    from storage.records import encode_values

    def control(payload: bytes) -> Batch:
        return Batch.create(payload, 1, kind=BatchKind.CONTROL)

    def staged(lid: str, gen: int) -> Batch:
        body = encode_staged_payload(StageTag(lid, gen, 0, 0, 0), encode_values([b"r"]))
        return Batch.create(body, 1, kind=BatchKind.STAGED)

    entries = [Batch.create(encode_values([b"d0"]), 1), control(encode_begin("done")),
               staged("done", 1), control(encode_commit("done", 1, [(0, 0, 1, 1)])),
               Batch.create(encode_values([b"d4"]), 1), control(encode_begin("open")),
               staged("open", 5), Batch.create(encode_values([b"d7"]), 1)]
    log = MemoryLog()
    for i, b in enumerate(entries):
        log.append([b.placed(i, 1)])
    log.flush()
    index = LoadIndex(log)
    assert index.catch_up(7)
    holds = retention.load_holds(index.table) + [Hold("commit index", 8, False)]
    p = plan(log, RetentionPolicy(max_bytes=1, low_disk_bytes=1), holds, now_ms=NOW,
             free_bytes=0, ctx=CTX)
    assert (p.decision.cut, p.decision.stopped_by) == (5, "load 'open'")
    log.truncate_prefix(p.decision.cut, p.snapshot)

    fresh = MemoryLog()
    fresh.reset(5, 1, p.snapshot)  # a follower after the state transfer
    for b in log.read(5, 1 << 20):
        fresh.append([b])
    for lg in (log, fresh):
        again = LoadIndex(lg)
        assert again.catch_up(7)
        done, still_open = again.table.get("done"), again.table.get("open")
        assert done is not None and done.state.value == "committed" and done.rows == 1
        assert still_open is not None and still_open.state.value == "open"
        assert again.stable_offset(7) == 4  # held before the open load
        lg.append([control(encode_commit("open", 5, [(0, 0, 1, 1)])).placed(8, 1)])
        assert again.catch_up(8) and again.table.get("open").state.value == "committed"
        shown = again.visible_batches(lg.read(5, 1 << 20), 8)
        assert [b.base_offset for b, _ in shown] == [6, 7]


# -- issue 24: retention keeps the newest data ------------------------------------------------

def test_size_retention_keeps_the_newest_batch_larger_than_the_limit() -> None:
    """The repro of issue 24 on a real core: one committed batch of 100 records of 510 bytes
    (~51 KB) under a 20 KiB limit. The whole log went (start one past the commit index,
    nothing readable); the batch must stay, on the leader and on every follower."""
    c = Cluster(3)
    leader = c.elect()
    rid = c.propose(leader, [bytes([65 + k % 26]) * 510 for k in range(100)], Acks.QUORUM)
    c.tick(2)  # the followers learn the commit index
    assert c.answers[rid].error.name == "OK"
    for i in c.ids:
        commit = c.cores[i].commit_index
        assert c.logs[i].retained_bytes > 20 << 10
        start = retain(c, i, RetentionPolicy(max_bytes=20 << 10))
        assert start <= commit, f"node {i} deleted its newest committed batch"
        (b, *_) = c.logs[i].read(commit, 1 << 20)
        assert b.last_offset == commit and b.count == 100


def test_size_retention_keeps_at_least_the_limit_in_whole_batches() -> None:
    """Twenty committed batches of ~1 KB under a 3.5 KB limit: at least 3.5 KB stays (four
    batches: the limit rounded up to whole batches), not the three that fit under it."""
    c = Cluster(3)
    leader = c.elect()
    for k in range(20):
        c.propose(leader, [bytes([97 + k]) * 1000], Acks.QUORUM)
    c.tick(2)
    log = c.logs[leader]
    one = log.read(c.cores[leader].commit_index, 1 << 20)[0].size
    limit = 3 * one + one // 2
    start = retain(c, leader, RetentionPolicy(max_bytes=limit))
    assert log.retained_bytes >= limit
    assert log.retained_bytes - one < limit  # and not a whole batch more than it needs
    assert start == c.cores[leader].commit_index - 3


def test_time_retention_keeps_the_newest_committed_batch() -> None:
    """Everything is older than --retention-ms: every batch but the newest committed one goes
    (Kafka never deletes the active segment); a consumer still reads the newest records."""
    c = Cluster(3)
    leader = c.elect()
    for k in range(5):
        c.propose(leader, [f"old{k}".encode()], Acks.QUORUM)
    c.tick(2)
    for i in c.ids:
        commit = c.cores[i].commit_index
        start = retain(c, i, RetentionPolicy(max_age_ms=1))
        assert start == base_of(c, i, commit) and start > 0


def test_a_plan_from_headers_on_disk_folds_the_same_state_as_one_from_whole_batches(
        tmp_path) -> None:
    """Retention's plan reads DATA and NOOP batches as their headers on disk (a cold front of
    a log larger than the page cache must not be read whole); what it decides and the state it
    folds must be what whole batches give: producers' ids and sequences, timestamps, sizes."""
    from storage.lmdb_log import LmdbLog

    batches: list[Batch] = []
    at = 0
    for i in range(12):
        if i == 4:
            b = Batch.create(encode_begin("job"), 1, kind=BatchKind.CONTROL,
                             timestamp_ms=NOW - 300)
        elif i == 7:
            b = Batch.create(b"", 1, kind=BatchKind.NOOP, timestamp_ms=NOW - 200)
        else:
            b = Batch.create(b"r" * (50 + i), 2, timestamp_ms=NOW - 400 + i,
                             producer_id=1 + i % 3, sequence=i)
        batches.append(b.placed(at, 1 + i // 6))
        at += b.count
    mem = MemoryLog()
    disk = LmdbLog(tmp_path / "log")
    try:
        for log in (mem, disk):
            log.append(batches)
            log.flush()
        policy = RetentionPolicy(max_bytes=3 * BATCH, max_age_ms=350).validate()
        plans = [plan(log, policy, [], now_ms=NOW, free_bytes=None, ctx=CTX)
                 for log in (mem, disk)]
        assert plans[0].decision.cut > 8  # past the CONTROL and NOOP batches
        assert plans[1].decision == plans[0].decision
        assert plans[1].snapshot == plans[0].snapshot
    finally:
        disk.close()
    # Cold (reopened: no header held in memory), the plan and the prefix delete read no record
    # but the CONTROL batch's (a kind the plan reads whole): the headers come from the heads DB
    # (storage/lmdb_heads.py, issue 28), the delete walks it. The wrapper refuses any other read.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "storage"))
    from lmdb_untouched import values_untouched

    disk = LmdbLog(tmp_path / "log", verify_tail_bytes=0)
    try:
        with values_untouched(disk, allowed={batches[4].base_offset}) as seen:
            cold = plan(disk, policy, [], now_ms=NOW, free_bytes=None, ctx=CTX)
            assert cold.decision == plans[0].decision and cold.snapshot == plans[0].snapshot
            assert seen.gets == [batches[4].base_offset]
            d = cold.decision
            disk.advance_start(d.cut, cold.snapshot, d.deleted_bytes)
            disk.persist_start()
        assert disk.read(d.cut, 1 << 20) == [b for b in batches if b.base_offset >= d.cut]
    finally:
        disk.close()
