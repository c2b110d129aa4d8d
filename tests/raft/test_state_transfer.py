"""State transfer: a follower behind the leader's log start gets the state at that start (the
configuration, the producer table, the loads table, the term) with the reset, stored in the same
storage operation, and from then on votes and deduplicates as if it had the whole log. The
leader's own tables survive its retention and a restart.

Scripted on the harness: a 4-node cluster whose voters are 1-3; node 4 joins (learner, then
voter) while a follower is down, an idempotent producer writes while it is down, and retention
then moves the leader's log start past everything the follower missed."""

from __future__ import annotations

from harness import Cluster
from raft.core import messages as m
from raft.core.producers import Verdict
from raft.core.raft import RaftCore
from raft.core.retention import RetentionPolicy, core_holds, plan
from raft.core.types import Acks, Role

PRODUCER = 77
# Everything the policy may delete, every member released: the down follower falls behind.
DROP_ALL = RetentionPolicy(max_bytes=1, valve_age_ms=1)


class Spare(Cluster):
    """Nodes 1-3 are the voters; node 4 runs but is outside the configuration until added."""

    def _new_core(self, i: int, voters: list[int] | None = None) -> RaftCore:
        return super()._new_core(i, voters or [1, 2, 3])


def retain(c: Cluster, i: int, policy: RetentionPolicy = DROP_ALL) -> int:
    """Retention slices on node i until nothing more goes, as the runtime applies them."""
    core, log = c.cores[i], c.logs[i]
    while True:
        p = plan(log, policy, core_holds(core.status()), now_ms=10**12, free_bytes=None,
                 ctx=core.snapshot_context())
        if p.decision.cut <= p.decision.start:
            return log.start_offset
        log.truncate_prefix(p.decision.cut, p.snapshot)


def scenario() -> tuple[Spare, int, int, int]:
    """(cluster, leader, the follower that was down, offset of the producer's write)."""
    c = Spare(4)
    leader = c.elect()
    lag = next(i for i in (1, 2, 3) if i != leader)
    c.propose(leader, [b"before"], Acks.QUORUM)
    c.deliver()
    c.down.add(lag)
    rid = c.propose(leader, [b"p0"], Acks.QUORUM, producer_id=PRODUCER, sequence=0)
    c.deliver()
    written = c.answers[rid].base_offset
    assert written >= 0, c.answers[rid]
    # Node 4 joins and is promoted while `lag` is away.
    c.cores[leader].propose_config(-5, add_learner=4, address="n4")
    c.process(leader)
    for _ in range(50):
        c.tick()
        if 4 in c.cores[leader].config.voters:
            break
    assert 4 in c.cores[leader].config.voters
    for k in range(30):
        c.propose(leader, [f"bulk-{k}".encode()], Acks.QUORUM, producer_id=88, sequence=k)
    c.deliver()
    start = retain(c, leader)
    assert start > written and c.logs[leader].start_offset == start
    assert c.logs[lag].dirty_offset < start - 1
    return c, leader, lag, written


def hold_resets_to(c: Cluster, node: int) -> list[m.AppendEntries]:
    held: list[m.AppendEntries] = []

    def keep(msg: m.Message) -> bool:
        if isinstance(msg, m.AppendEntries) and msg.dst == node and msg.log_start_reset:
            held.append(msg)
            return False
        return True

    c.filter = keep
    return held


def test_a_follower_behind_the_log_start_gets_the_state_there() -> None:
    c, leader, lag, written = scenario()
    c.down.discard(lag)
    for _ in range(40):
        c.tick()
        if c.logs[lag].flushed_offset == c.logs[leader].dirty_offset:
            break
    lead_log, log = c.logs[leader], c.logs[lag]
    assert log.start_offset == lead_log.start_offset
    assert log.flushed_offset == lead_log.dirty_offset
    # Above the log start, the two logs are the same entries.
    assert log.read(log.start_offset, 1 << 20) == lead_log.read(log.start_offset, 1 << 20)
    core = c.cores[lag]
    assert sorted(core.config.voters) == sorted(c.cores[leader].config.voters) == [1, 2, 3, 4]
    verdict, w = core.producers.lookup(PRODUCER, 0)
    assert verdict == Verdict.DUPLICATE and w is not None and w.base_offset == written
    # It leads next, and the producer's retry gets its original offset back.
    c.cores[leader].transfer_leadership(lag)
    c.process(leader)
    for _ in range(30):
        c.tick()
        if c.cores[lag].role == Role.LEADER:
            break
    assert c.cores[lag].role == Role.LEADER
    rid = c.propose(lag, [b"p0"], Acks.QUORUM, producer_id=PRODUCER, sequence=0)
    c.deliver()
    a = c.answers[rid]
    assert a.duplicate and a.base_offset == written, a


def test_the_state_survives_a_crash_right_after_the_reset() -> None:
    """The reset and the state are one storage operation: a crash before the node even saved
    its metadata comes back with the new start and its tables, never batches without them."""
    c, leader, lag, written = scenario()
    held = hold_resets_to(c, lag)
    c.down.discard(lag)
    for _ in range(10):
        c.tick()
        if held:
            break
    assert held and held[0].snapshot is not None
    c.cores[lag].step(held[0])
    rd = c.cores[lag].ready()
    assert rd.storage is not None
    rd.storage.run(c.logs[lag])  # stored, then the process dies before the core hears of it
    assert c.logs[lag].start_offset == c.logs[leader].start_offset
    c.crash(lag)
    core = c.cores[lag]
    assert c.logs[lag].start_offset == c.logs[leader].start_offset
    assert sorted(core.config.voters) == [1, 2, 3, 4]
    verdict, w = core.producers.lookup(PRODUCER, 0)
    assert verdict == Verdict.DUPLICATE and w is not None and w.base_offset == written


def test_a_malformed_state_is_rejected_not_applied() -> None:
    c, leader, lag, _ = scenario()
    held = hold_resets_to(c, lag)
    c.down.discard(lag)
    for _ in range(10):
        c.tick()
        if held:
            break
    before = (c.logs[lag].start_offset, c.logs[lag].dirty_offset)
    for bad in ({"v": 1}, {"v": 1, "start_offset": 3, "sections": {"producers": "x"}},
                {**held[0].snapshot, "start_offset": held[0].prev_offset + 7}):
        msg = held[0]
        c.cores[lag].step(m.AppendEntries(msg.src, msg.dst, msg.term, msg.prev_offset,
                                          msg.prev_term, msg.batches, msg.commit_index,
                                          msg.flush, msg.seq, True, bad))
        rd = c.cores[lag].ready()
        assert any(isinstance(x, m.AppendEntriesReply) and not x.success for x in rd.messages)
        assert (c.logs[lag].start_offset, c.logs[lag].dirty_offset) == before


def test_the_leader_keeps_its_producer_table_across_retention_and_a_restart() -> None:
    c = Cluster(3)
    leader = c.elect()
    rid = c.propose(leader, [b"p0"], Acks.QUORUM, producer_id=PRODUCER, sequence=0)
    c.deliver()
    written = c.answers[rid].base_offset
    for k in range(20):
        c.propose(leader, [f"x{k}".encode()], Acks.QUORUM)
    c.deliver()
    for i in c.ids:
        retain(c, i)
    assert c.logs[leader].start_offset > written
    c.crash(leader)  # rebuilt from the state at its log start plus the rest of the log
    verdict, w = c.cores[leader].producers.lookup(PRODUCER, 0)
    assert verdict == Verdict.DUPLICATE and w is not None and w.base_offset == written


def test_damage_below_the_leaders_log_start_is_dropped_with_the_prefix_and_the_state_there(
        ) -> None:
    """A follower's damaged batch lies below the leader's log start: retention deleted it
    everywhere else, so nobody can send it again. The follower drops its prefix up to the
    leader's start, taking the leader's state there, and only a state for exactly that start
    (raft/core/repair.py, _drop_damaged_prefix)."""
    from test_disk_loss_rules import rot

    c = Cluster(3)
    leader = c.elect()
    f = next(i for i in (1, 2, 3) if i != leader)
    for k in range(30):
        c.propose(leader, [f"v{k}".encode()], Acks.QUORUM)
    c.deliver()
    c.tick(3)
    early = c.logs[f].start_offset + 2
    c.down.add(f)
    rot(c, f, early)
    start = retain(c, leader)
    assert start > early and c.logs[f].damaged()
    held = hold_resets_to(c, f)
    c.down.discard(f)
    for _ in range(20):
        c.tick()
        if held:
            break
    assert held and held[0].prev_offset == start - 1 and held[0].snapshot is not None
    msg = held[0]
    before = (c.logs[f].start_offset, c.logs[f].dirty_offset)
    bad = {**msg.snapshot, "start_offset": msg.prev_offset + 7}
    c.cores[f].step(m.AppendEntries(msg.src, msg.dst, msg.term, msg.prev_offset, msg.prev_term,
                                    msg.batches, msg.commit_index, msg.flush, msg.seq, True, bad))
    c.process(f)  # (the driver carries out whatever storage work the core asks for)
    assert (c.logs[f].start_offset, c.logs[f].dirty_offset) == before  # refused
    assert c.logs[f].damaged()
    c.cores[f].step(msg)
    c.process(f)
    assert c.logs[f].start_offset == start and c.logs[f].dirty_offset == before[1]
    assert not c.logs[f].damaged()
    c.filter = lambda msg: True
    c.tick(5)
    assert c.logs[f].read(start, 1 << 20) == c.logs[leader].read(start, 1 << 20)
