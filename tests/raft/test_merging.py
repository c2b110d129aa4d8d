"""Concurrent produces proposed within one Ready pass are appended as one stored batch
(raft/core/merging.py, issue 28), and every producer finds its records at the offsets it was
answered, at its own ack level.

Table-driven: each case proposes writes on the leader with no Ready pass between them, then
lets the cluster run; it names the stored batches the writes must form (by write index) and
checks, on every node, that each OK answer's offsets hold exactly that write's records.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness import Cluster
from raft.core.types import Acks, ErrorCode
from storage.batch import Batch, BatchKind
from storage.records import decode_records, encode_values


@dataclass(frozen=True)
class W:
    """One write: `n` records; `pid` != 0 is an idempotent producer."""

    n: int = 1
    acks: Acks = Acks.QUORUM
    ts: int = 5
    pid: int = 0
    kind: BatchKind = BatchKind.DATA


@dataclass(frozen=True)
class Case:
    name: str
    writes: tuple[W, ...]
    batches: tuple[tuple[int, ...], ...]  # the stored batches, as indexes into writes
    knobs: tuple[tuple[str, int], ...] = ()


CASES = [
    Case("three writes at one timestamp, every ack level: one batch",
         (W(), W(acks=Acks.LEADER), W(acks=Acks.NONE)), ((0, 1, 2),)),
    Case("multi-record writes keep their records together and in order",
         (W(3), W(1), W(20, Acks.LEADER)), ((0, 1, 2),)),
    Case("another timestamp starts another batch", (W(ts=5), W(ts=5), W(ts=6), W(ts=6)),
         ((0, 1), (2, 3))),
    Case("an idempotent write stays alone, and the writes around it do not join across it",
         (W(), W(pid=7), W(), W()), ((0,), (1,), (2, 3))),
    Case("idempotent writes of one producer never join each other",
         (W(pid=7), W(pid=8)), ((0,), (1,))),
    Case("control batches never join", (W(), W(kind=BatchKind.CONTROL), W()),
         ((0,), (1,), (2,))),
    Case("the record cap", (W(2), W(1), W(2), W(1)), ((0, 1), (2, 3)),
         (("merge_max_records", 3),)),
    Case("a write above the record cap is stored alone", (W(), W(4), W()), ((0,), (1,), (2,)),
         (("merge_max_records", 3),)),
    Case("the byte cap", (W(), W(), W(), W()), ((0, 1), (2, 3)), (("merge_max_bytes", 110),)),
    Case("merging off", (W(), W()), ((0,), (1,)), (("merge_max_records", 0),)),
]


def _values(i: int, w: W) -> list[bytes]:
    return [f"w{i}-r{k}".encode() * 4 for k in range(w.n)]


def _batch(i: int, w: W) -> Batch:
    if w.kind == BatchKind.CONTROL:
        return Batch.create(b"control %d" % i, 1, kind=BatchKind.CONTROL, timestamp_ms=w.ts)
    return Batch.create(encode_values(_values(i, w)), w.n, timestamp_ms=w.ts,
                        producer_id=w.pid, sequence=0 if w.pid else -1)


def _stored(c: Cluster, node: int, first: int) -> list[Batch]:
    log = c.logs[node]
    out: list[Batch] = []
    off = first
    while off <= log.dirty_offset:
        got = log.read(off, 1 << 20)
        out.extend(got)
        off = got[-1].last_offset + 1
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_writes_proposed_in_one_pass_share_a_batch_at_their_answered_offsets(case: Case) -> None:
    c = Cluster(3, **dict(case.knobs))
    leader = c.elect()
    c.tick(2)
    core = c.cores[leader]
    first = c.logs[leader].dirty_offset + 1
    rids = list(range(100, 100 + len(case.writes)))
    for rid, (i, w) in zip(rids, enumerate(case.writes)):
        core.propose(rid, _batch(i, w), w.acks)
    c.deliver()
    c.tick(2)
    answers = [c.answers[r] for r in rids]
    assert all(a.error == ErrorCode.OK for a in answers), answers
    for node in c.ids:
        stored = _stored(c, node, first)
        # The batches the writes formed, each write wholly inside one batch, in order.
        formed = [tuple(i for i, a in enumerate(answers)
                        if b.base_offset <= a.base_offset and a.last_offset <= b.last_offset)
                  for b in stored]
        assert formed == list(case.batches), f"node {node}"
        for b in stored:
            b.verify()  # the merged batch's CRC is its own
        # Each write's records are at the offsets it was answered, nothing else is.
        by_offset = {}
        for b in stored:
            if b.kind == BatchKind.DATA:
                for k, r in enumerate(decode_records(b.payload, b.count)):
                    by_offset[b.base_offset + k] = r.value
                assert b.timestamp_ms in {w.ts for w in case.writes}
        for (i, w), a in zip(enumerate(case.writes), answers):
            assert a.last_offset - a.base_offset + 1 == w.n
            if w.kind == BatchKind.DATA:
                got = [by_offset[o] for o in range(a.base_offset, a.last_offset + 1)]
                assert got == _values(i, w), f"node {node}, write {i}"


def test_a_merged_batch_keeps_the_timestamp_its_writes_carry() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    first = c.logs[leader].dirty_offset + 1
    for rid in (1, 2):
        c.cores[leader].propose(rid, _batch(rid, W(ts=1234)), Acks.QUORUM)
    c.deliver()
    [stored] = _stored(c, leader, first)
    assert (stored.count, stored.timestamp_ms) == (2, 1234)


def test_writes_still_open_when_leadership_ends_are_answered_not_leader_and_never_written() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    core = c.cores[leader]
    end = c.logs[leader].dirty_offset
    core.propose(1, _batch(1, W()), Acks.QUORUM)
    core.propose(2, _batch(2, W()), Acks.LEADER)
    core._become_follower(core.term + 1, None)  # a newer term, heard before the Ready pass
    c.process(leader)
    assert [c.answers[r].error for r in (1, 2)] == [ErrorCode.NOT_LEADER] * 2
    assert c.logs[leader].dirty_offset == end


def test_an_idempotent_retry_of_a_write_proposed_beside_others_is_a_duplicate() -> None:
    """The producer table must see the idempotent write as its own batch: a retry of it is
    answered with the first write's offsets, not appended again."""
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    core = c.cores[leader]
    core.propose(1, _batch(1, W()), Acks.QUORUM)
    core.propose(2, _batch(2, W(pid=9)), Acks.QUORUM)
    core.propose(3, _batch(3, W()), Acks.QUORUM)
    c.deliver()
    c.tick(2)
    end = c.logs[leader].dirty_offset
    core.propose(4, _batch(2, W(pid=9)), Acks.QUORUM)  # the retry: same producer, sequence 0
    c.deliver()
    c.tick(2)
    first, retry = c.answers[2], c.answers[4]
    assert retry.error == ErrorCode.OK and retry.duplicate
    assert (retry.base_offset, retry.last_offset) == (first.base_offset, first.last_offset)
    assert c.logs[leader].dirty_offset == end
