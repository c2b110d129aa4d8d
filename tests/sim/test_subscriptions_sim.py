"""Subscriptions under the simulation's fault schedules (raft/sim/subscription_model.py): consumers
resumed from the committed position never skip a committed record and re-read at most what
followed their last acknowledged commit; every node's table agrees. The schedules of
test_simulation.py run consumers too; these pin the checker's teeth."""

from __future__ import annotations

import pytest

import raft.sim.subscription_model
from raft.sim.runner import profile_config, run_simulation


def test_consumers_resume_and_commit_under_faults() -> None:
    """Not a vacuous checker: across a few schedules consumers do resume (after their own
    crashes, node crashes and lease expiry) and commits are acknowledged, and every property
    holds."""
    resumes = acked = entries = 0
    for seed in range(1, 6):
        res = run_simulation(profile_config(seed, 3, "mixed"))
        assert res.ok, res.describe()
        resumes += res.stats["sub_resumes"]
        acked += res.stats["sub_acked"]
        entries += res.stats["sub_entries"]
    assert resumes >= 20 and acked > 100 and entries > 50


def test_teeth_applying_uncommitted_entries_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that applies its table past the commit index answers verdicts for entries a
    crash can still erase: acknowledged commits go missing, tables diverge."""
    monkeypatch.setattr(raft.sim.subscription_model.SimSubscriptions, "apply_upto",
                        staticmethod(lambda node: node.log.dirty_offset))
    # Seeds 1-15: which schedules catch it moves with any change to the core's trajectories
    # (seed 11 alone did before heartbeat replies freed the leader's window; 12, 14 and 15
    # since): the claim is that some schedule does.
    failed = [seed for seed in range(1, 16)
              if not run_simulation(profile_config(seed, 3, "crashy")).ok]
    assert failed, "no schedule caught a table applied past the commit index"


def test_teeth_a_lost_commit_verdict_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that acknowledges commits without writing them (the verdict without the entry)
    is caught by the resume check: the position comes back lower than acknowledged."""
    original = raft.sim.subscription_model.SimSubscriptions.submit

    def lying_submit(self, node_id, op, reply):  # noqa: ANN001, ANN202
        if op.op.value == "commit" and self.world.nodes[node_id].is_leader:
            from raft.core.subscription_table import Outcome
            from raft.core.types import ErrorCode
            reply(Outcome(ErrorCode.OK, "", {"position": op.position}))
            return True
        return original(self, node_id, op, reply)

    monkeypatch.setattr(raft.sim.subscription_model.SimSubscriptions, "submit", lying_submit)
    res = run_simulation(profile_config(3, 3, "mixed"))
    assert any(v.prop == "subscription keeps acknowledged commits" for v in res.violations), \
        res.describe()
