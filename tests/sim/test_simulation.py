"""Safety and liveness under seeded fault schedules (raft/sim). hypothesis draws the schedule
(seed, cluster size, fault mix); a failure shrinks and prints the replay command.

CI runs RAFTLOG_SIM_EXAMPLES (default 300) schedules, shared evenly by the fault profiles (one
test each, so no single test runs all 300: at ~0.2 s of CPU a schedule that one test passed
pytest's 600 s timeout on this shared 2-core machine); a soak sets it to thousands:
    RAFTLOG_SIM_EXAMPLES=5000 pytest tests/sim -k schedules --timeout=0
The many-group `topics` profile has its own seeds and soak (tests/sim/test_topics_sim.py).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raft.core.incarnation
import raft.core.leader
import raft.core.progress
import raft.core.retention
import raft.sim.node
from raft.core.retention import Hold
from raft.sim.runner import PROFILES, SimConfig, Simulation, profile_config, run_simulation
from raft.core.types import Acks
from storage.batch import Batch
from storage.records import encode_values

EXAMPLES = int(os.environ.get("RAFTLOG_SIM_EXAMPLES", "300"))
SCHEDULE_PROFILES = sorted(p for p in PROFILES if p != "topics")


@pytest.mark.parametrize("profile", SCHEDULE_PROFILES)
@settings(max_examples=-(-EXAMPLES // len(SCHEDULE_PROFILES)), deadline=None,
          derandomize=EXAMPLES <= 300, suppress_health_check=[HealthCheck.too_slow],
          database=None)
@given(seed=st.integers(0, 2**32 - 1), nodes=st.sampled_from([3, 5]))
def test_schedules_keep_every_property(profile: str, seed: int, nodes: int) -> None:
    res = run_simulation(profile_config(seed, nodes, profile))
    assert res.ok, res.describe()


def test_same_seed_same_run() -> None:
    a = run_simulation(profile_config(7, 3, "mixed"))
    b = run_simulation(profile_config(7, 3, "mixed"))
    c = run_simulation(profile_config(8, 3, "mixed"))
    assert a.trace_hash == b.trace_hash and a.stats == b.stats
    assert c.trace_hash != a.trace_hash


# -- teeth: a deliberately wrong rule must be caught -----------------------------------------

def _first_failure(profile: str, seeds: range, **overrides) -> int | None:
    for seed in seeds:
        if not run_simulation(profile_config(seed, 3, profile, **overrides)).ok:
            return seed
    return None


def test_teeth_commit_on_dirty_offsets_loses_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting a follower's dirty (unflushed) offset towards commit: crashes then lose
    acknowledged data. With the direct flushed-majority check off, the end-to-end checks
    (committed data diverging, acknowledged records missing) must still see it."""
    monkeypatch.setattr(raft.core.progress.FollowerProgress, "durable_offset",
                        lambda self: self.match_index)
    assert _first_failure("crashy", range(1, 120), check_flushed_majority=False) is not None
    assert _first_failure("mixed", range(1, 20)) is not None  # the direct check: at once


def test_teeth_commit_without_majority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raft.core.leader, "committed_index", lambda values: max(values))
    assert _first_failure("mixed", range(1, 40), check_flushed_majority=False) is not None


def test_teeth_vote_not_persisted() -> None:
    """A driver that grants votes without making them durable: after crashes a node votes
    twice in a term, and two leaders (or diverging logs) follow."""
    assert _first_failure("crashy", range(1, 200), persist_hard_state=False) is not None


def test_teeth_running_on_after_a_storage_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that logs a storage fault and runs on (instead of stopping) is caught by the disk
    profile: its core and its log disagree after the half-done step."""
    monkeypatch.setattr(raft.sim.node.SimNode, "fail_stop", lambda self, error: None)
    assert _first_failure("disk", range(1, 60)) is not None


def test_teeth_a_node_that_lost_its_disk_votes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that votes right after losing its disk (its standing never checked) is caught by
    the disk-loss profile's vote checker, or by what it lets happen."""
    monkeypatch.setattr(raft.core.incarnation.Incarnations, "may_vote", lambda self: True)
    assert _first_failure("diskloss", range(1, 30)) is not None


def test_teeth_messages_from_an_unknown_disk_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that takes replies (and voters that take votes) from any data directory."""
    monkeypatch.setattr(raft.core.incarnation.Incarnations, "_screen", lambda self, msg: True)
    assert _first_failure("diskloss", range(1, 30)) is not None


RETENTION_PROFILES = sorted(name for name, p in PROFILES.items() if p.get("retention"))


@pytest.mark.parametrize("profile", RETENTION_PROFILES)
def test_retention_profiles_check_that_retention_keeps_the_newest_data(profile: str) -> None:
    """Every profile with retention cuts logs, and every cut goes through the checkers' keep-
    the-newest checks (the newest committed batch stays; size alone keeps retention-bytes)."""
    assert RETENTION_PROFILES  # the profiles below still exercise retention
    res = run_simulation(profile_config(1, 3, profile))
    assert res.ok, res.describe()
    assert res.stats["retention_cuts"] > 0
    assert res.stats["retention_checked"] == res.stats["retention_cuts"]


def test_teeth_retention_deletes_the_newest_committed_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit index holding from one past itself (issue 24: the newest committed batch may
    go) is caught by the retention checker."""
    real = raft.sim.node.core_holds

    def past_the_commit(status):  # type: ignore[no-untyped-def]
        return [Hold(h.holder, h.offset + 1 if h.holder == "commit index" else h.offset,
                     h.valve) for h in real(status)]
    monkeypatch.setattr(raft.sim.node, "core_holds", past_the_commit)
    assert _first_failure("crashy", range(1, 20)) is not None


def test_teeth_size_retention_deletes_while_over_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24's size rule (delete a batch while the log holds more than the limit, which
    overshoots below it) is caught by the retention checker: the wrapper makes today's rule
    (remaining - size >= limit) answer as that one did (remaining > limit)."""
    real = raft.core.retention.Planner._keep_reason

    def over_the_limit(self, b):  # type: ignore[no-untyped-def]
        self._remaining += b.size - 1
        try:
            return real(self, b)
        finally:
            self._remaining -= b.size - 1
    monkeypatch.setattr(raft.core.retention.Planner, "_keep_reason", over_the_limit)
    assert _first_failure("membership", range(1, 20)) is not None


def test_disk_loss_fires_and_the_cluster_repairs_itself() -> None:
    """The disk-loss profile really wipes, cuts and rots disks, and the run still converges with
    every acknowledged record on every member."""
    res = run_simulation(profile_config(4, 3, "diskloss"))
    assert res.ok, res.describe()
    assert res.stats["disk_losses"] >= 3


def test_disk_faults_fire_and_fail_stop() -> None:
    """The disk profile really injects faults that stop nodes (and they come back)."""
    res = run_simulation(profile_config(1, 3, "disk"))
    assert res.ok, res.describe()
    assert res.stats["fail_stops"] > 0


# -- recovery scenarios ------------------------------------------------------------------------

def _scenario(seed: int) -> Simulation:
    sim = Simulation(SimConfig(seed=seed, faults=(), clients=0, fault_time_us=0,
                               raft={"max_append_bytes": 2048, "recovery_chunk_bytes": 1024,
                                     "follower_flush_bytes": 4096}))
    return sim


def _leader(sim: Simulation) -> int:
    sim.loop.run_until(sim.loop.now + 3_000_000, stop=lambda: len(sim.leaders()) == 1)
    (leader,) = sim.leaders()
    return leader


def _write(sim: Simulation, leader: int, n: int, acks: Acks = Acks.LEADER) -> None:
    for i in range(n):
        batch = Batch.create(encode_values([f"bulk-{sim.loop.now}-{i}".encode() * 20]), 1)
        sim.nodes[leader].propose(10_000_000 + i, batch, acks)


@pytest.mark.parametrize("seed", range(8))
def test_follower_crash_and_leader_change_in_the_middle_of_recovery(seed: int) -> None:
    sim = _scenario(seed)
    leader = _leader(sim)
    lag = next(i for i in sim.nodes if i != leader)
    sim.nodes[lag].crash()
    _write(sim, leader, 400)
    sim.loop.run_until(sim.loop.now + 200_000)
    sim.nodes[lag].start()
    # Part-way through catch-up: crash the follower again (its unflushed chunks vanish) ...
    sim.loop.run_until(sim.loop.now + 30_000)
    sim.nodes[lag].crash()
    sim.loop.run_until(sim.loop.now + 50_000)
    sim.nodes[lag].start()
    sim.loop.run_until(sim.loop.now + 30_000)
    # ... then kill the leader mid-stream; the new leader restarts recovery from what the
    # follower actually has.
    sim.nodes[leader].crash()
    sim.loop.run_until(sim.loop.now + 300_000)
    sim.nodes[leader].start()
    sim.loop.run_until(sim.loop.now + 5_000_000, stop=sim.converged)
    assert sim.converged(), {i: (n.log.dirty_offset, n.log.flushed_offset)
                             for i, n in sim.nodes.items()}
    sim._final_checks()
    assert not sim.checkers.violations, sim.checkers.violations


def test_recovery_chunks_are_deferred_flush_and_commit_follows_flushes() -> None:
    """During catch-up of committed entries the follower gets flush=False chunks and flushes
    on its own schedule; the leader's commit index follows the flushed offsets it reports,
    never the dirty ones. (Entries not yet committed go to it in step, each request flushed:
    the quorum waits for them.)"""
    sim = _scenario(3)
    leader = _leader(sim)
    lag = next(i for i in sim.nodes if i != leader)
    other = next(i for i in sim.nodes if i not in (leader, lag))
    sim.nodes[lag].crash()
    _write(sim, leader, 300)  # the bulk commits without `lag`
    sim.loop.run_until(sim.loop.now + 100_000)
    sim.nodes[other].crash()  # no majority: nothing written from now on can commit yet
    _write(sim, leader, 30)
    sim.loop.run_until(sim.loop.now + 100_000)
    commit_before = sim.nodes[leader].core.commit_index
    assert commit_before < sim.nodes[leader].log.dirty_offset
    seen: list[tuple[bool, int]] = []
    send = sim.network.send

    def spy(msg) -> None:  # noqa: ANN001
        from raft.core import messages as m
        if isinstance(msg, m.AppendEntries) and msg.dst == lag and msg.batches:
            seen.append((msg.flush, len(msg.batches)))
        send(msg)

    sim.network.send = spy
    for n in sim.nodes.values():
        n.send = spy
    sim.nodes[lag].start()
    sim.loop.run_until(sim.loop.now + 5_000_000, stop=lambda: sim.nodes[lag].log.flushed_offset
                       == sim.nodes[leader].log.dirty_offset)
    assert sim.nodes[lag].log.flushed_offset == sim.nodes[leader].log.dirty_offset
    assert sum(1 for f, _ in seen if not f) >= 5, seen  # the bulk went without flush
    assert commit_before < sim.nodes[leader].core.commit_index
    assert not sim.checkers.violations, sim.checkers.violations


@pytest.mark.parametrize("seed,nodes", [(5299, 3), (90275, 3), (7131584, 3), (29782835, 3),
                                        (11250097, 3), (11250113, 3), (11250769, 3),
                                        (77281, 5), (77353, 5), (112, 3)])
def test_disk_loss_schedules_that_once_failed(seed: int, nodes: int) -> None:
    """5299: damage in a range retention had deleted everywhere else was never repaired until
    the follower dropped it with its prefix (raft/core/repair.py, _drop_damaged_prefix). 90275: a
    leader damaged at an entry only it held could never hand over (TimeoutNow waited for the
    target to match its whole log) and the commit index stood still; it now hands over once
    the target has everything it can still send (raft/core/leader.py). 7131584 (issue 24): a node
    whose copy of an idempotent write rotted led, and its producer table, rebuilt from a log
    it could not fully read, took the producer's retry as new: committed twice. A table that
    missed a damaged batch now answers UNKNOWN until it is repaired (raft/core/producers.py).
    29782835 (issue 24): a new leader whose copy of a committed entry rotted declared it lost
    after hearing from one voter far behind, while the voter holding it was down (it counted a
    voter it had never heard from as answered); it now waits for evidence from every voter
    (raft/core/repair.py, CopyCensus). 11250097, 11250113, 11250769, 77281 and 77353 (5 nodes): a node
    restarted faster than the failure detector's down bound, so it never looked down, while
    its group was quiesced: wiped (11250097), its bootstrap probes were answered and woke
    nobody; with a lost position (the others; in 11250769, 77281 and 77353 the leader) it may
    not campaign and sent nothing. It stayed empty or behind, no leader in three of them, until
    a write; now a member's probe wakes a quiet core and such a node pings every member
    (raft/core/quiesce.py, tests/raft/test_quiet_rejoin.py). 112: a partition 2 ms into the
    founding cut node 3 off after its probes were counted, before the answers it needed; then
    node 1 lost its metadata, and two of three nodes could not vote (no leader for good). A
    founder now vouches for a voter it counted while that voter is still as new, with the same
    directory (raft/core/incarnation.py's founders rule, tests/raft/test_founders.py)."""
    res = run_simulation(profile_config(seed, nodes, "diskloss"))
    assert res.ok, res.describe()


# -- quiescence and node liveness (raft/core/quiesce.py, raft/sim/liveness.py) --------------------

@pytest.mark.parametrize("nodes", [3, 5])
def test_the_quiet_phase_quiesces_every_member_and_a_dead_quiet_leader_is_replaced(
        nodes: int) -> None:
    res = run_simulation(profile_config(11, nodes, "mixed"))
    assert res.ok, res.describe()
    s = res.stats
    assert s["quiet_messages"] == 0 and s["quiesce_ms"] <= 400
    assert s["failover_ms"] <= 1000 and s["peer_down"] > 0 and s["quiet_ticks"] > 0


def test_teeth_a_group_that_never_quiesces_is_caught() -> None:
    res = run_simulation(profile_config(11, 3, "mixed", raft={"quiesce_ticks": 1000}))
    assert [v.prop for v in res.violations] == ["idle groups quiesce"], res.describe()


def test_teeth_a_quiet_follower_deaf_to_node_liveness_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without peer_down reaching the cores, a quiet group whose leader's node died never
    elects again: the quiet phase's failover check and the final liveness check say so."""
    from raft.core.quiesce import Quiescence
    monkeypatch.setattr(Quiescence, "peer_down", lambda self, node_id: None)
    res = run_simulation(profile_config(11, 3, "mixed"))
    props = {v.prop for v in res.violations}
    assert "a quiet group's leader crash is noticed" in props, res.describe()


def test_without_quiescence_the_quiet_phase_still_checks_failover() -> None:
    res = run_simulation(profile_config(11, 3, "noquiesce"))
    assert res.ok, res.describe()
    assert "quiet_messages" not in res.stats and res.stats["failover_ms"] <= 1000


@pytest.mark.parametrize("seed", range(4))
def test_merged_writes_are_found_at_the_offsets_each_was_answered(seed: int) -> None:
    """The merging profile: plain writes proposed in one Ready pass share a stored batch
    (raft/core/merging.py); the final checks find every acknowledged write at its own answered
    offset, and nothing twice, among the faults. The runs must really merge."""
    res = run_simulation(profile_config(seed, 3, "merging"))
    assert res.ok, res.describe()
    assert res.stats["merged_batches"] > 0, res.stats
