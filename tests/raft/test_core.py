"""Behaviour of the sans-IO core, driven by tests/raft/harness.py (synchronous, FIFO network).
The fault-injecting simulation (tests/sim) covers the same rules under random schedules."""

from __future__ import annotations

import ast
import pathlib

import pytest

from harness import Cluster
from raft.core import messages as m
from raft.core.raft import InvariantViolation, RaftConfig, RaftCore
from raft.core.progress import ProgressState
from raft.core.ready import StorageOp
from raft.core.types import Acks, ErrorCode, Role
from storage.batch import Batch
from storage.memory import MemoryLog
from storage.records import encode_values

import random


def test_one_leader_elected_and_noop_committed() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(3)
    assert [c.cores[i].role for i in c.ids].count(Role.LEADER) == 1
    terms = {c.cores[i].term for i in c.ids}
    assert len(terms) == 1
    # The no-op of the new term commits everywhere.
    assert all(c.cores[i].commit_index == 0 for i in c.ids)
    assert all(c.cores[i].leader_id == leader for i in c.ids)


def test_single_voter_commits_on_its_own_flush() -> None:
    c = Cluster(1)
    leader = c.elect()
    rid = c.propose(leader, [b"x"])
    assert c.answers[rid].error == ErrorCode.OK
    assert c.cores[leader].commit_index == c.logs[leader].flushed_offset


@pytest.mark.parametrize("acks", [Acks.QUORUM, Acks.LEADER, Acks.NONE])
def test_ack_levels_answer_at_their_moment(acks: Acks) -> None:
    """quorum waits for a majority flush; leader/none are answered on append, before any
    follower saw the batch."""
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    followers = [i for i in c.ids if i != leader]
    for f in followers:
        c.auto_flush[f] = False
    rid = c.propose(leader, [b"a", b"b"], acks)
    if acks == Acks.QUORUM:
        assert rid not in c.answers
        c.deliver()
        assert rid not in c.answers, "answered on dirty followers"
        c.flush(followers[0])
        c.deliver()
        assert c.answers[rid].error == ErrorCode.OK
    else:
        assert c.answers[rid].error == ErrorCode.OK
        assert c.answers[rid].base_offset == c.logs[leader].dirty_offset - 1


def test_dirty_offsets_never_count_towards_commit() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    before = c.cores[leader].commit_index
    for f in c.ids:
        if f != leader:
            c.auto_flush[f] = False
    c.propose(leader, [b"z"] * 10, Acks.LEADER)
    c.tick(5)
    for f in c.ids:
        if f != leader:
            assert c.logs[f].dirty_offset == c.logs[leader].dirty_offset  # replicated...
            assert c.logs[f].flushed_offset < c.logs[f].dirty_offset  # ...but not flushed
    assert c.cores[leader].commit_index == before
    pr = c.cores[leader].progress(next(i for i in c.ids if i != leader))
    assert pr is not None and pr.match_index > pr.durable_offset()


def test_follower_commit_is_bounded_by_its_own_flush() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    slow = next(i for i in c.ids if i != leader)
    c.auto_flush[slow] = False
    c.propose(leader, [b"q"], Acks.QUORUM)
    c.tick(3)
    assert c.cores[leader].commit_index == c.logs[leader].dirty_offset
    assert c.cores[slow].commit_index <= c.logs[slow].flushed_offset
    assert c.cores[slow].commit_index < c.cores[leader].commit_index


def test_idempotent_retry_returns_the_original_offsets() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    first = c.propose(leader, [b"once"], producer_id=7, sequence=0)
    c.tick(2)
    retry = c.propose(leader, [b"once"], producer_id=7, sequence=0)
    c.tick(2)
    a, b = c.answers[first], c.answers[retry]
    assert a.error == b.error == ErrorCode.OK
    assert (a.base_offset, a.last_offset) == (b.base_offset, b.last_offset)
    assert b.duplicate and not a.duplicate
    values = [x for x in c.logs[leader].read(0, 1 << 20) if x.producer_id == 7]
    assert len(values) == 1


def test_idempotency_survives_a_leader_change() -> None:
    c = Cluster(3)
    old = c.elect()
    c.tick(2)
    rid = c.propose(old, [b"v"], producer_id=9, sequence=3)
    c.tick(3)
    base = c.answers[rid].base_offset
    c.down.add(old)
    c.tick(60)
    new = c.leader()
    assert new is not None and new != old
    retry = c.propose(new, [b"v"], producer_id=9, sequence=3)
    c.tick(3)
    assert c.answers[retry].duplicate and c.answers[retry].base_offset == base


def test_leadership_loss_answers_waiting_quorum_writes() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    c.filter = lambda msg: msg.src != leader and msg.dst != leader
    rid = c.propose(leader, [b"lost?"])
    c.tick(40)  # CheckQuorum: the isolated leader steps down
    assert c.cores[leader].role != Role.LEADER
    assert c.answers[rid].error == ErrorCode.LEADERSHIP_LOST


def test_conflict_hint_backs_up_a_whole_term() -> None:
    """A follower holding a long tail of an old term is repaired in one or two rejections,
    not one per batch."""
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    stale = next(i for i in c.ids if i != leader)
    # Isolate `stale`'s leader view: give the old leader 30 uncommitted batches that reach
    # only `stale`.
    other = next(i for i in c.ids if i not in (leader, stale))
    c.filter = lambda msg: other not in (msg.src, msg.dst)
    for k in range(30):
        c.propose(leader, [f"old{k}".encode()], Acks.LEADER)
    c.deliver()
    assert c.logs[stale].dirty_offset == c.logs[leader].dirty_offset
    # Now `other` leads a new term without those entries.
    c.down.update({leader, stale})
    c.filter = lambda msg: True
    for _ in range(100):
        c.tick()
        if c.cores[other].role == Role.LEADER:
            break
    c.down.clear()
    c.down.add(leader)
    # Count rejections `stale` sends while it is repaired.
    c.sent.clear()
    c.cores[other].transfer_leadership  # noqa: B018 (just checking the API exists)
    for _ in range(200):
        c.tick()
        if c.logs[stale].dirty_offset == c.logs[other].dirty_offset and \
                c.logs[stale].last_term() == c.logs[other].last_term():
            break
    rejects = [x for x in c.sent if isinstance(x, m.AppendEntriesReply) and x.src == stale
               and not x.success and not x.busy and x.term == c.cores[other].term]
    assert len(rejects) <= 3, rejects
    assert c.logs[stale].read(0, 1 << 20)[-1].term == c.cores[other].term


def test_recovery_streams_chunks_without_flush_and_pipelines() -> None:
    c = Cluster(3, recovery_chunk_bytes=4096, max_append_bytes=4096, max_inflight=4)
    leader = c.elect()
    c.tick(2)
    lag = next(i for i in c.ids if i != leader)
    c.down.add(lag)
    payload = [b"x" * 1000]
    for _ in range(200):
        c.propose(leader, payload, Acks.LEADER)
    c.tick(2)
    c.down.discard(lag)
    c.sent.clear()
    # One delivery round: the leader must have several chunks in flight at once.
    c.auto_flush[lag] = False
    c.tick(1)
    chunks = [x for x in c.sent if isinstance(x, m.AppendEntries) and x.dst == lag
              and x.batches]
    assert chunks, "no recovery traffic"
    assert not any(x.flush for x in chunks[:-1])
    for _ in range(50):
        c.auto_flush[lag] = True
        c.tick()
        if c.logs[lag].flushed_offset == c.logs[leader].dirty_offset:
            break
    assert c.logs[lag].flushed_offset == c.logs[leader].dirty_offset
    # Pipelining: several chunks leave before the first reply to them comes back, and never
    # more than max_inflight.
    run, most = 0, 0
    for x in c.sent:
        if isinstance(x, m.AppendEntries) and x.dst == lag and x.batches:
            run += 1
            most = max(most, run)
        elif isinstance(x, m.AppendEntriesReply) and x.src == lag:
            run = max(0, run - 1)
    assert 2 <= most <= 4, most
    flush_false = [x for x in c.sent if isinstance(x, m.AppendEntries) and x.dst == lag
                   and x.batches and not x.flush]
    assert len(flush_false) >= 10


def test_follower_crash_loses_tail_and_is_caught_up_again() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    f = next(i for i in c.ids if i != leader)
    c.auto_flush[f] = False
    for k in range(20):
        c.propose(leader, [f"r{k}".encode()], Acks.LEADER)
    c.tick(1)
    assert c.logs[f].dirty_offset > c.logs[f].flushed_offset
    c.crash(f)
    c.auto_flush[f] = True
    c.tick(30)
    assert c.logs[f].dirty_offset == c.logs[leader].dirty_offset
    assert [b.payload for b in c.logs[f].read(0, 1 << 20)] == \
        [b.payload for b in c.logs[leader].read(0, 1 << 20)]


def test_truncating_below_commit_is_an_invariant_violation() -> None:
    log = MemoryLog()
    core = RaftCore(RaftConfig(node_id=2, voters=[1, 2, 3]), log, random.Random(1))
    b0 = Batch.create(encode_values([b"a"]), 1).placed(0, 1)
    b1 = Batch.create(encode_values([b"b"]), 1).placed(1, 1)
    core.step(m.AppendEntries(1, 2, 1, -1, 0, [b0, b1], 1, True, 1))
    core.flushed(log.flush())
    assert core.commit_index == 1
    rogue = Batch.create(encode_values([b"c"]), 1).placed(1, 2)
    with pytest.raises(InvariantViolation):
        core.step(m.AppendEntries(3, 2, 2, 0, 1, [rogue], 0, True, 1))


def test_a_truncation_is_the_drivers_work_and_the_log_waits_for_it() -> None:
    """A follower's truncation fsyncs, so the core hands it to the driver (Ready.storage) and
    changes nothing in the log until the driver says it is done: an append arriving meanwhile
    is neither applied nor acknowledged, the node does not campaign, and the append that asked
    for the truncation is handled once it is done."""
    log = MemoryLog()
    core = RaftCore(RaftConfig(node_id=2, voters=[1, 2, 3]), log, random.Random(1))
    old = [Batch.create(encode_values([v]), 1).placed(i, 1) for i, v in enumerate([b"a", b"b"])]
    core.step(m.AppendEntries(1, 2, 1, -1, 0, old, 0, True, 1))
    core.flushed(log.flush())
    core.ready()
    new = Batch.create(encode_values([b"B"]), 1).placed(1, 2)
    core.step(m.AppendEntries(3, 2, 2, 0, 1, [new], 0, True, 1))
    rd = core.ready()
    assert rd.storage is not None and rd.storage.op == StorageOp.TRUNCATE_SUFFIX
    assert rd.storage.offset == 0
    assert not any(isinstance(x, m.AppendEntriesReply) for x in rd.messages)
    assert (log.dirty_offset, log.term_at(1)) == (1, 1)  # untouched until the driver runs it
    # Meanwhile: a later append of the new leader is neither applied nor acknowledged, and a
    # vote for this node is not sought.
    later = Batch.create(encode_values([b"C"]), 1).placed(2, 2)
    core.step(m.AppendEntries(3, 2, 2, 1, 1, [later], 0, False, 2))
    assert not core.ready().messages and log.dirty_offset == 1
    assert not core._may_campaign()
    rd.storage.run(log)
    core.stored()
    core.flushed(log.flush())
    replies = [x for x in core.ready().messages if isinstance(x, m.AppendEntriesReply)]
    assert [(r.success, r.last_appended) for r in replies] == [(True, 1)]
    assert (log.dirty_offset, log.term_at(1)) == (1, 2)


def _truncation_running(held: bool) -> tuple[MemoryLog, RaftCore, object]:
    """A follower holding offsets 0-1 of term 1 (unflushed) that a leader of term 2 asked to
    truncate after 0: the truncation handed to the driver, not run yet. With `held`, the
    new leader's first append (offset 0 again, flush=True) left a reply waiting for the
    flush."""
    log = MemoryLog()
    core = RaftCore(RaftConfig(node_id=2, voters=[1, 2, 3]), log, random.Random(1))
    old = [Batch.create(encode_values([v]), 1).placed(i, 1) for i, v in enumerate([b"a", b"b"])]
    core.step(m.AppendEntries(1, 2, 1, -1, 0, old, 0, False, 1))
    core.ready()
    if held:
        core.step(m.AppendEntries(3, 2, 2, -1, 0, old[:1], 0, True, 1))
        assert not _log_reports(core.ready().messages)  # waits for the flush
    new = Batch.create(encode_values([b"B"]), 1).placed(1, 2)
    core.step(m.AppendEntries(3, 2, 2, 0, 1, [new], 0, True, 1))
    rd = core.ready()
    assert rd.storage is not None and rd.storage.op == StorageOp.TRUNCATE_SUFFIX
    return log, core, rd.storage


def _log_reports(messages: list) -> list:
    return [x for x in messages if isinstance(x, (m.HeartbeatReply, m.AppendEntriesReply))]


@pytest.mark.parametrize("held", [False, True], ids=["own-schedule", "held-reply"])
def test_a_flush_completing_during_a_truncation_is_answered_once_the_log_is_stored(
        held: bool) -> None:
    """A flush the driver finished while a truncation runs on its worker: the follower's
    answers to it (the replies that waited for it, its own-schedule report) read the log's
    end and that end's term, two reads a running truncation can split (an end from before it
    with a term from after), and would report offsets it is removing as flushed. They wait
    for stored(), and then describe the log as the truncation left it."""
    log, core, work = _truncation_running(held)
    core.flushed(log.flush())  # the flush thread finishes first
    assert not _log_reports(core.ready().messages)
    work.run(log)
    core.stored()
    reports = _log_reports(core.ready().messages)
    assert all((r.dirty_offset, r.dirty_term) == (0, 1) and r.flushed_offset <= 0
               for r in reports)
    assert [(type(r), r.dst) for r in reports] == [
        (m.AppendEntriesReply if held else m.HeartbeatReply, 3)]


def test_a_ping_asked_for_during_a_truncation_is_sent_once_the_log_is_stored() -> None:
    """The unsolicited reports (a ping to the leader the detector saw come back, to the
    members, the repair notice) read the log too: while a truncation runs they wait for it."""
    log, core, work = _truncation_running(False)
    core.peer_down(3)
    core.peer_up(3)  # the leader's node is back: ping it
    assert not _log_reports(core.ready().messages)
    work.run(log)
    core.stored()
    reports = [x for x in core.ready().messages if isinstance(x, m.HeartbeatReply)]
    assert [(r.dst, r.dirty_offset, r.dirty_term) for r in reports] == [(3, 0, 1)]


def test_transfer_leadership_moves_to_target() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(3)
    target = next(i for i in c.ids if i != leader)
    c.cores[leader].transfer_leadership(target)
    c.deliver()
    c.tick(3)
    assert c.cores[target].role == Role.LEADER
    assert c.cores[leader].role == Role.FOLLOWER
    with pytest.raises(ValueError):
        c.cores[leader].transfer_leadership(None)


def test_learner_is_added_caught_up_and_promoted_then_removed() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(3)
    for k in range(10):
        c.propose(leader, [f"d{k}".encode()])
    c.tick(2)
    # Node 4 joins.
    c.ids.append(4)
    c.logs[4] = MemoryLog()
    c.cores[4] = c._new_core(4, voters=[1, 2, 3])
    c.auto_flush[4] = True
    c.cores[leader]._answers  # noqa: B018
    c._rid += 1
    c.cores[leader].propose_config(c._rid, add_learner=4, address="127.0.0.1:1")
    c.tick(10)
    assert c.answers[c._rid].error == ErrorCode.OK
    assert 4 in c.cores[leader].config.voters, "learner not promoted"
    assert c.logs[4].dirty_offset == c.logs[leader].dirty_offset
    # Remove a follower.
    gone = next(i for i in (1, 2, 3) if i != leader)
    c._rid += 1
    c.cores[leader].propose_config(c._rid, remove=gone)
    c.tick(10)
    assert c.answers[c._rid].error == ErrorCode.OK
    assert gone not in c.cores[leader].config.members
    # A second concurrent change is refused while one is in flight.
    c._rid += 1
    c.cores[leader].propose_config(c._rid, remove=4)
    c._rid += 1
    c.cores[leader].propose_config(c._rid, remove=4)
    c.process(leader)
    assert c.answers[c._rid].error == ErrorCode.BACKPRESSURE


def test_restart_keeps_term_vote_and_a_recent_commit_index() -> None:
    c = Cluster(3, commit_checkpoint_ticks=5)
    leader = c.elect()
    c.tick(3)
    for k in range(5):
        c.propose(leader, [f"c{k}".encode()])
    c.tick(12)
    term, commit = c.cores[leader].term, c.cores[leader].commit_index
    f = next(i for i in c.ids if i != leader)
    c.crash(leader)
    assert c.cores[leader].term == term
    assert c.cores[leader].voted_for == leader
    # The checkpointed commit index survives (bounded by the flushed log), so a restarted node
    # does not report an older high watermark than it served before.
    assert c.cores[leader].commit_index == commit
    c.crash(f)
    assert c.cores[f].commit_index == commit


def test_prevote_keeps_a_rejoining_node_from_disrupting() -> None:
    c = Cluster(3)
    leader = c.elect()
    c.tick(3)
    iso = next(i for i in c.ids if i != leader)
    term = c.cores[leader].term
    c.filter = lambda msg: iso not in (msg.src, msg.dst)
    c.tick(100)  # iso keeps timing out but pre-votes fail: its term does not climb
    assert c.cores[iso].term == term
    c.filter = lambda msg: True
    c.tick(5)
    assert c.cores[leader].role == Role.LEADER and c.cores[leader].term == term


ROOT = pathlib.Path(__file__).resolve().parents[2]
# Every file of the core (raft/*.py) and of the recovery machinery it calls (recovery/*.py).
CORE_FILES = sorted(str(p.relative_to(ROOT)) for d in ("raft", "recovery")
                    for p in (ROOT / d).glob("*.py"))
FORBIDDEN = {"trio", "socket", "time", "random", "threading", "asyncio", "os", "selectors",
             "datetime"}


@pytest.mark.parametrize("name", CORE_FILES)
def test_core_is_sans_io(name: str) -> None:
    """No event loop, sockets, clocks, threads or global randomness in the core."""
    path = ROOT / name
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module.split(".")[0]]
        assert not (set(mods) & FORBIDDEN), f"{name} imports {mods}"


def test_recovery_throttle_spends_its_budget_per_tick_and_resends_nothing() -> None:
    """The recovery throttle lives in the core, in ticks: a throttled chunk is not sent (and so
    cannot be overtaken by a heartbeat that makes it look lost). The follower catches up at
    about the rate, and no range is sent twice."""
    rate = 8192
    c = Cluster(3, recovery_chunk_bytes=4096, max_append_bytes=4096,
                recovery_rate_bytes_per_tick=rate)
    leader = c.elect()
    c.tick(2)
    lag = next(i for i in c.ids if i != leader)
    c.down.add(lag)
    for _ in range(200):
        c.propose(leader, [b"x" * 1000], Acks.LEADER)
    c.tick(2)
    c.down.discard(lag)
    behind = sum(b.size for b in c.logs[leader].read(c.logs[lag].dirty_offset + 1, 1 << 30))
    per_tick: list[int] = []
    for _ in range(200):
        c.sent.clear()
        c.tick()
        per_tick.append(sum(b.size for x in c.sent if isinstance(x, m.AppendEntries)
                            and x.dst == lag and not x.flush for b in x.batches))
        if c.logs[lag].dirty_offset == c.logs[leader].dirty_offset:
            break
    assert c.logs[lag].dirty_offset == c.logs[leader].dirty_offset, "never caught up"
    # Within the budget (one chunk of burst on top), and at about the rate overall.
    assert max(per_tick) <= rate + 4096, per_tick
    assert len(per_tick) >= behind // (rate + 4096)
    assert sum(per_tick) <= behind * 1.02, f"sent {sum(per_tick)} bytes for {behind} behind"
