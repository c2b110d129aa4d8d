"""The simulation with a controller and many partition groups per node (the `topics` profile,
raft/sim/topics_runner.py): topics are created, grown and deleted through the controller while
nodes crash, pause and are partitioned, and every checker runs per group.

CI runs a bounded number of seeds (RAFTLOG_SIM_TOPICS_RUNS per node count, default 6 with 3
nodes and 3 with 5); the long soak is the command line:
    python -m raft.sim --profile topics --nodes 3 --runs 500 --seed 1
    python -m raft.sim --profile topics --nodes 5 --runs 500 --seed 100000
"""

from __future__ import annotations

import os

import pytest

import raft.controller.reconcile
from raft.controller.state import ClusterMetadata
from raft.sim.runner import profile_config, run_simulation

RUNS = int(os.environ.get("RAFTLOG_SIM_TOPICS_RUNS", "6"))
SEEDS = [(seed, 3) for seed in range(1, RUNS + 1)] + \
    [(seed, 5) for seed in range(1, max(1, RUNS // 2) + 1)]
# Safety properties (the rest are liveness: convergence after healing).
SAFETY = ("election safety", "log matching", "committed prefix identical",
          "commit needs a flushed majority", "controller metadata identical")


@pytest.mark.parametrize("seed,nodes", SEEDS)
def test_topic_schedules_keep_every_property(seed: int, nodes: int) -> None:
    res = run_simulation(profile_config(seed, nodes, "topics"))
    assert res.ok, res.describe()


# A schedule whose admin deletes topics (which seeds do depends on everything that moves the
# schedule's timing: seed 1 stopped deleting when followers began to campaign at once on a
# leader reported down, 2026-11-26).
DELETES_SEED = 2


def test_the_profile_creates_grows_and_deletes_topics_under_faults() -> None:
    """What the checks above stand on: the schedules really run many groups, create and
    delete topics, drop deleted logs, apply the controller log on every node, and group
    commit flushes several groups in one store commit."""
    res = run_simulation(profile_config(DELETES_SEED, 3, "topics"))
    assert res.ok, res.describe()
    s = res.stats
    assert 10 <= s["live_partitions"] <= 50 and s["groups"] >= s["live_partitions"]
    assert s["creates"] >= 3 and s["deletes"] >= 1 and s["dropped_logs"] >= 3
    assert s["metadata_checked"] > 3 * 10 and s["quorum_acked"] > 50
    assert s["restarts"] >= 1 and s["flushed_groups"] > s["flush_rounds"]


def test_the_controller_log_is_cut_and_a_node_behind_its_start_restores_the_metadata() -> None:
    """The controller's log is cut by retention with its metadata in the state at the log
    start; a node that lost its controller log (or fell behind its start) gets that state by
    state transfer and restores the metadata from it, and every checker (metadata identical at
    one applied offset on every node, per-group safety, convergence) still holds."""
    res = run_simulation(profile_config(3, 3, "topics"))
    assert res.ok, res.describe()
    assert res.stats["controller_cuts"] >= 3 and res.stats["metadata_restores"] >= 1


def test_catch_ups_queue_for_their_nodes_recovery_slots() -> None:
    """Nodes back from crashes and partitions catch up in many small chunks and wait for one
    of their node's two recovery slots (recovery/budget.py), and every property still holds:
    the budget delays catch-up, it never loses or stalls a partition."""
    res = run_simulation(profile_config(6, 3, "topics"))
    assert res.ok, res.describe()
    assert res.stats["recovery_granted"] > 0 and res.stats["recovery_denied"] > 0


def test_same_seed_same_run() -> None:
    a = run_simulation(profile_config(3, 3, "topics"))
    b = run_simulation(profile_config(3, 3, "topics"))
    c = run_simulation(profile_config(4, 3, "topics"))
    assert a.trace_hash == b.trace_hash and a.stats == b.stats
    assert c.trace_hash != a.trace_hash


def test_partitions_are_placed_on_shards_and_traffic_stays_shard_to_shard() -> None:
    """Nodes of 2 shards (docs/SHARDS.md): the controller places partitions on both shard
    indexes, every replica of a partition runs on the shard the metadata gives it, and every
    message of a group goes from that shard of one node to the same shard of another, under
    the same faults, with every property kept."""
    res = run_simulation(profile_config(1, 3, "topics", shards=2))
    assert res.ok, res.describe()
    by_shard = res.stats["partitions_by_shard"]
    assert len(by_shard) == 2 and min(by_shard) > 0, res.stats
    assert res.stats["shard_messages"] > 0, res.stats


# -- teeth ------------------------------------------------------------------------------------
# These are the killers of the simulation's mutants in tests/raft/test_mutants.py; each fails
# when the rule it guards is switched off.

def test_messages_reach_their_own_group() -> None:
    """A node that routes an envelope to another group than the one it names (here: by the
    group's position among those it runs, which shifts once a topic is deleted) breaks log
    matching and the committed prefix of the groups involved."""
    res = run_simulation(profile_config(4, 3, "topics"))
    safety = [v for v in res.violations if v.prop.startswith(SAFETY)]
    assert not safety, res.describe()
    assert res.ok, res.describe()


def test_a_deleted_topics_groups_stop_and_their_logs_are_dropped() -> None:
    res = run_simulation(profile_config(DELETES_SEED, 3, "topics"))
    stray = [v for v in res.violations if v.prop.startswith("a deleted topic's groups")]
    assert not stray, res.describe()
    assert res.ok and res.stats["dropped_logs"] > 0, res.describe()


def test_teeth_a_node_that_never_drops_deleted_groups_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = raft.controller.reconcile.reconcile

    def keep_everything(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        plan = real(*args, **kwargs)
        return type(plan)(plan.start, plan.stop, (), plan.unknown)

    monkeypatch.setattr(raft.controller.reconcile, "reconcile", keep_everything)
    res = run_simulation(profile_config(DELETES_SEED, 3, "topics"))
    props = {v.prop for v in res.violations}
    assert any(p.startswith("a deleted topic's groups stop") for p in props), res.describe()


def _first_failure(seeds: range, nodes: int = 3, **overrides) -> int | None:  # noqa: ANN003
    for seed in seeds:
        if not run_simulation(profile_config(seed, nodes, "topics", **overrides)).ok:
            return seed
    return None


def test_teeth_votes_not_persisted_make_two_leaders_in_some_group() -> None:
    assert _first_failure(range(1, 40), persist_hard_state=False) is not None


def test_teeth_nodes_that_apply_the_controller_log_differently_are_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A state machine that is not a pure function of the log (here: every fifth apply in
    the process is refused, so nodes differ) is caught by the metadata-agreement check."""
    real = ClusterMetadata.apply
    calls = [0]

    def flaky(self, offset, command):  # noqa: ANN001, ANN202
        calls[0] += 1
        if calls[0] % 5 == 0:
            self._advance(offset)
            return None
        return real(self, offset, command)

    monkeypatch.setattr(ClusterMetadata, "apply", flaky)
    res = run_simulation(profile_config(1, 3, "topics"))
    props = {v.prop for v in res.violations}
    assert any(p.startswith("controller metadata identical") for p in props), res.describe()


@pytest.mark.parametrize("seed,nodes", [(1131, 3), (5071, 5)])
def test_schedules_that_once_failed(seed: int, nodes: int) -> None:
    """Found by the sweep: the controller's leader lost its disk and restarted faster than the
    failure detector's down bound; its groups did not run again (a wiped controller log must be
    re-added first; a data group waits for the metadata), and the followers it had quiesced,
    never told it was down, waited for it forever. The detector now reports a peer whose
    process restarted (a newer epoch on its pings) down and up again."""
    res = run_simulation(profile_config(seed, nodes, "topics"))
    assert res.ok, res.describe()


def test_a_peer_that_restarted_unseen_wakes_its_quiet_followers() -> None:
    for seed, nodes in [(1131, 3), (5071, 5)]:
        res = run_simulation(profile_config(seed, nodes, "topics"))
        assert res.ok and res.stats["restarts_seen"] > 0, res.describe()
