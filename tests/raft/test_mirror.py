"""Mirror partitions in the core (issue 30, raft/core/mirror.py): the position rule, gaps, DATA
converted to MIRRORED in a translated group, the visible end kept through suffix truncation,
restarts, retention cuts and state transfers. Every test runs on both stores."""

from __future__ import annotations

import random
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.raft import RaftConfig, RaftCore
from raft.core import retention
from raft.core.retention import RetentionPolicy, plan
from raft.core.snapshot import StartState
from raft.core.types import Acks, ErrorCode
from storage import open_log
from storage.batch import Batch, BatchKind
from storage.memory import MemoryLog
from storage.mirrored import (
    MIRROR_SECTION,
    NEXT,
    decode_tag,
    mirrored,
    records_of,
)
from storage.records import encode_values

IMPLS = ["memory", "lmdb"]


@pytest.fixture(params=IMPLS)
def new_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[int], Any] | None]:
    """None (the harness's MemoryLog) or an LMDB log per node under tmp_path."""
    if request.param == "memory":
        yield None
        return
    opened: list[Any] = []

    def make(i: int) -> Any:
        log = open_log(tmp_path / f"n{i}", map_size=16 << 20)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def mb(base: int, count: int = 1, tag: bytes = b"r") -> Batch:
    """A MIRRORED batch at visible base `base` holding `count` records."""
    values = [tag + str(base + k).encode() for k in range(count)]
    return mirrored(base, count, 1000 + max(base, 0), encode_values(values))


def propose(c: Cluster, leader: int, batch: Batch, acks: Acks = Acks.QUORUM) -> Any:
    c._rid += 1
    rid = c._rid
    c.cores[leader].propose(rid, batch, acks)
    c.process(leader)
    c.deliver()
    return c.answers[rid]


def mirror_cluster(new_log: Any, n: int = 3, translated: bool = True) -> tuple[Cluster, int]:
    c = Cluster(n, new_log=new_log, translated=translated)
    return c, c.elect()


def visible_batches(log: Any) -> list[tuple[int, int]]:
    """(visible base, count) of every MIRRORED batch the log holds."""
    out = []
    for b in log.read(log.start_offset, 1 << 30):
        if b.kind == BatchKind.MIRRORED:
            out.append((decode_tag(b.payload), b.count))
    return out


# -- the position rule --------------------------------------------------------------------------
# (name, [(visible base, count)], [expected error per proposal], visible end after)
POSITION_CASES = [
    ("contiguous", [(0, 3), (3, 2)], [ErrorCode.OK, ErrorCode.OK], 4),
    ("same batch again", [(0, 3), (0, 3)], [ErrorCode.OK, ErrorCode.MIRROR_POSITION], 2),
    ("overlapping", [(0, 3), (2, 1)], [ErrorCode.OK, ErrorCode.MIRROR_POSITION], 2),
    ("behind", [(5, 3), (1, 1)], [ErrorCode.OK, ErrorCode.MIRROR_POSITION], 7),
    ("a gap is fine", [(0, 3), (10, 2)], [ErrorCode.OK, ErrorCode.OK], 11),
    ("a gap at the start", [(7, 1)], [ErrorCode.OK], 7),
    ("next fills in", [(0, 2), (NEXT, 3)], [ErrorCode.OK, ErrorCode.OK], 4),
    ("next after a gap", [(4, 1), (NEXT, 1), (5, 1)],
     [ErrorCode.OK, ErrorCode.OK, ErrorCode.MIRROR_POSITION], 5),
]


@pytest.mark.parametrize("case", POSITION_CASES, ids=[c[0] for c in POSITION_CASES])
def test_the_position_rule(case: tuple, new_log: Any) -> None:
    """A MIRRORED proposal is appended only past the visible end; otherwise it is answered
    MIRROR_POSITION with the visible end, and nothing is appended. Every member agrees."""
    _, proposals, expected, end = case
    c, leader = mirror_cluster(new_log)
    got = []
    for base, count in proposals:
        a = propose(c, leader, mb(base, count))
        got.append(a.error)
        if a.error == ErrorCode.MIRROR_POSITION:
            assert a.visible_end == c.cores[leader].visible_end
            assert str(a.visible_end + 1) in a.message  # where to resume
    assert got == expected
    c.tick(3)
    for i in c.ids:
        assert c.cores[i].visible_end == end
    placed = [p for p, e in zip(proposals, expected) if e == ErrorCode.OK]
    want = []
    for base, count in placed:
        want.append((want[-1][0] + want[-1][1] if base == NEXT else base, count))
    assert visible_batches(c.logs[leader]) == want


def test_a_plain_group_refuses_mirrored_batches(new_log: Any) -> None:
    c, leader = mirror_cluster(new_log, translated=False)
    a = propose(c, leader, mb(0, 2))
    assert a.error == ErrorCode.BAD_REQUEST and "mirror" in a.message
    assert c.cores[leader].visible_end == -1 and visible_batches(c.logs[leader]) == []
    # ...and its DATA stays DATA.
    rid = c.propose(leader, [b"x"])
    c.deliver()
    assert c.answers[rid].error == ErrorCode.OK
    (b,) = [x for x in c.logs[leader].read(0, 1 << 20) if x.kind == BatchKind.DATA]


def test_data_in_a_translated_group_becomes_mirrored_at_the_next_visible_offset(
        new_log: Any) -> None:
    """A client produce to a promoted mirror continues its visible offsets; an idempotent retry
    is answered as a duplicate (after the producer check), not appended again."""
    c, leader = mirror_cluster(new_log)
    assert propose(c, leader, mb(10, 5)).error == ErrorCode.OK
    rid = c.propose(leader, [b"a", b"b"], producer_id=7, sequence=0)
    c.deliver()
    first = c.answers[rid]
    assert first.error == ErrorCode.OK and not first.duplicate
    (b,) = c.logs[leader].read(first.base_offset, 1 << 20, 1)
    assert b.kind == BatchKind.MIRRORED and decode_tag(b.payload) == 15 and b.count == 2
    assert (b.producer_id, b.sequence) == (7, 0)
    assert records_of(b) == encode_values([b"a", b"b"])
    rid = c.propose(leader, [b"a", b"b"], producer_id=7, sequence=0)
    c.deliver()
    again = c.answers[rid]
    assert again.duplicate and again.base_offset == first.base_offset
    c.tick(3)
    for i in c.ids:
        assert c.cores[i].visible_end == 16
    assert visible_batches(c.logs[leader]) == [(10, 5), (15, 2)]


def test_control_batches_pass_and_take_no_visible_offsets(new_log: Any) -> None:
    c, leader = mirror_cluster(new_log)
    propose(c, leader, mb(0, 2))
    a = propose(c, leader, Batch.create(b"\x80", 1, kind=BatchKind.CONTROL))
    assert a.error == ErrorCode.OK
    assert c.cores[leader].visible_end == 1
    assert propose(c, leader, mb(2, 1)).error == ErrorCode.OK


def test_staged_batches_are_refused_in_a_translated_group(new_log: Any) -> None:
    c, leader = mirror_cluster(new_log)
    a = propose(c, leader, Batch.create(b"xx", 1, kind=BatchKind.STAGED))
    assert a.error == ErrorCode.BAD_REQUEST and "Spark" in a.message


def test_a_malformed_tag_is_a_bad_request(new_log: Any) -> None:
    c, leader = mirror_cluster(new_log)
    bad = Batch.create(b"\x09" + b"\x00" * 8, 1, kind=BatchKind.MIRRORED)
    a = propose(c, leader, bad)
    assert a.error == ErrorCode.BAD_REQUEST and "version" in a.message
    assert c.cores[leader].visible_end == -1


# -- truncation --------------------------------------------------------------------------------
# (name, the follower's batches in term 1 as (visible base, count) or None for a CONTROL batch,
#  the log offset the new leader's entry replaces from, visible end after)
TRUNCATION_CASES = [
    ("back to an earlier mirrored batch", [(0, 3), (3, 2), (10, 1)], 5, 4),
    ("past a control batch", [(0, 3), None, (3, 2)], 4, 2),
    ("everything", [(0, 3), (3, 2)], 0, -1),
    ("nothing mirrored dropped", [(0, 3), None], 3, 2),
]


@pytest.mark.parametrize("case", TRUNCATION_CASES, ids=[c[0] for c in TRUNCATION_CASES])
def test_a_suffix_truncation_recomputes_the_visible_end(case: tuple, new_log: Any) -> None:
    """A follower whose uncommitted tail a new leader overwrites forgets the visible offsets
    of the dropped batches: were it elected later, the position rule must accept them again."""
    _, entries, replace_from, end = case
    log = MemoryLog() if new_log is None else new_log(2)
    core = RaftCore(RaftConfig(node_id=2, voters=[1, 2, 3], translated=True), log,
                    random.Random(1))
    batches, off = [], 0
    for e in entries:
        b = (Batch.create(b"\x80", 1, kind=BatchKind.CONTROL) if e is None else mb(*e))
        batches.append(b.placed(off, 1))
        off += b.count
    core.step(m.AppendEntries(1, 2, 1, -1, 0, batches, -1, True, 1))
    core.flushed(log.flush())
    core.ready()
    assert core.visible_end == max((b + n - 1 for b, n in (e for e in entries if e)), default=-1)
    prev = replace_from - 1
    prev_term = 1 if prev >= 0 else 0
    new = Batch.create(b"", 1, kind=BatchKind.NOOP).placed(replace_from, 2)
    core.step(m.AppendEntries(3, 2, 2, prev, prev_term, [new], -1, True, 1))
    rd = core.ready()
    assert rd.storage is not None
    rd.storage.run(log)
    core.stored()
    assert core.visible_end == end
    assert log.dirty_offset == replace_from


# -- the state at the log start: restarts, retention, state transfers ---------------------------
def test_the_visible_end_survives_a_restart(new_log: Any, tmp_path: Path) -> None:
    c, leader = mirror_cluster(new_log, n=1)
    propose(c, leader, mb(3, 4))
    c.flush(leader)
    log = c.logs[leader]
    if new_log is not None:
        log.close()
        log = open_log(tmp_path / f"n{leader}", map_size=16 << 20)
    core = RaftCore(RaftConfig(node_id=leader, voters=[leader], translated=True), log,
                    random.Random(2))
    assert core.visible_end == 6
    if new_log is not None:
        log.close()


def test_the_mirror_section_survives_a_retention_cut_and_a_state_transfer(
        new_log: Any, tmp_path: Path) -> None:
    """Retention cuts every MIRRORED batch (a later NOOP and CONTROL batch stay): the visible
    end lives on in the `mirror` section of the state at the new start, so a restarted node,
    and a node reset to that start by a state transfer, still refuse what was mirrored."""
    c, leader = mirror_cluster(new_log, n=1)
    for base in (0, 5, 9):
        assert propose(c, leader, mb(base, 2)).error == ErrorCode.OK
    assert propose(c, leader, Batch.create(b"\x80", 1, kind=BatchKind.CONTROL)).error == \
        ErrorCode.OK
    c.flush(leader)
    core, log = c.cores[leader], c.logs[leader]
    p = plan(log, RetentionPolicy(max_bytes=1), retention.core_holds(core.status()),
             now_ms=10**12, free_bytes=None, ctx=core.snapshot_context())
    assert p.decision.cut == log.dirty_offset  # only the newest (CONTROL) batch stays
    log.truncate_prefix(p.decision.cut, p.snapshot)
    assert visible_batches(log) == []
    assert log.snapshot["sections"][MIRROR_SECTION] == 10
    assert core.visible_end == 10
    # A restart on the cut log.
    if new_log is not None:
        log.close()
        log = open_log(tmp_path / f"n{leader}", map_size=16 << 20)
        c.logs[leader] = log
    c.cores[leader] = again = c._new_core(leader)
    assert again.visible_end == 10
    leader = c.elect()
    assert propose(c, leader, mb(9, 2)).error == ErrorCode.MIRROR_POSITION
    assert propose(c, leader, mb(11, 1)).error == ErrorCode.OK
    # A state transfer: a new node's log reset to the start, with the state there.
    fresh = MemoryLog() if new_log is None else open_log(tmp_path / "fresh",
                                                          map_size=16 << 20)
    state = StartState.from_snapshot(p.snapshot, core.snapshot_context())
    assert state.states[MIRROR_SECTION] == [10]
    fresh.reset(p.snapshot["start_offset"], log.start_term, p.snapshot)
    other = RaftCore(RaftConfig(node_id=2, voters=[1, 2], translated=True), fresh,
                     random.Random(3))
    assert other.visible_end == 10
    if new_log is not None:
        fresh.close()


def test_a_malformed_mirror_section_is_refused() -> None:
    from raft.core.mirror import section_load
    from raft.core.snapshot import SnapshotContext

    for raw in ("5", -2, True, None):
        with pytest.raises(ValueError):
            section_load(raw, SnapshotContext())
    assert section_load(-1, SnapshotContext()) == [-1]
