"""The simulation of cross-cluster replication (the `link` profile, raft/sim/link_runner.py): a
source and a sink cluster and a link between them, with faults on both clusters and on the link;
every mirror partition must be a prefix of its source (raft/sim/link_checker.py).

CI runs a few seeds (RAFTLOG_SIM_LINK_RUNS, default 3); the long soak is the command line:
    python -m raft.sim --profile link --runs 500 --seed 1
"""

from __future__ import annotations

import os

import pytest

import raft.sim.link_actor as link_actor
import raft.sim.link_subscriptions as link_subscriptions
from raft.core.subscription_table import make_entry
from raft.sim.link_contract import VisibleBatch
from raft.sim.runner import profile_config, run_simulation

RUNS = int(os.environ.get("RAFTLOG_SIM_LINK_RUNS", "3"))


@pytest.mark.parametrize("seed", range(1, RUNS + 1))
def test_link_schedules_keep_every_property(seed: int) -> None:
    res = run_simulation(profile_config(seed, 3, "link"))
    assert res.ok, res.describe()


def test_retried_fetches_are_refused_by_the_position_rule_and_the_mirror_stays_exact() -> None:
    """The link hands the sink leader the same batches more than once (a retried fetch whose
    first reply was only slow, a duplicated reply): the position rule refuses them, the link
    resyncs from the sink's visible end, and no mirror has a duplicate. The killer of the
    position-rule mutant (tests/raft/test_mutants.py)."""
    refused = 0
    for seed in (1, 2):
        res = run_simulation(profile_config(seed, 3, "link"))
        assert res.ok, res.describe()
        refused += res.stats["position_refusals"]
    assert refused > 0, "no duplicate proposal in these seeds: the rule was never exercised"


def test_a_reply_fetched_ahead_of_one_not_placed_whole_is_dropped() -> None:
    """The pullers fetch ahead (raft/node/links/puller.py): the next fetch goes out at a
    reply's end before that reply is proposed. When that reply was not placed whole (a refusal
    partway, a leadership lost), the one fetched after it is dropped and the link resyncs from
    the sink's visible end: appended, it would leave out what the first did not place, a gap
    the position rule allows and the checker finds. The killer of that rule's mutant."""
    res = run_simulation(profile_config(25, 3, "link"))
    assert res.ok, res.describe()
    assert res.stats["fetched_ahead"] > 50 and res.stats["ahead_dropped"] >= 1


def test_the_profile_mirrors_under_faults_and_bootstraps_after_retention() -> None:
    """What the checks stand on: the link mirrors hundreds of batches through crashes and
    leader changes on both sides (resyncs); a long cut of the link lets the source's retention
    delete past its position, so it bootstraps with a recorded gap; the mirrors are cut too,
    and a sink node behind the start gets the mirror's visible end by state transfer; storage
    faults fail-stop nodes."""
    res = run_simulation(profile_config(5, 3, "link"))
    assert res.ok, res.describe()
    s = res.stats
    assert s["mirrored_batches"] > 200 and s["restarts"] >= 3 and s["resyncs"] >= 3
    assert s["bootstraps"] >= 1 and s["retention_cuts"] >= 10 and s["link_dropped"] >= 1
    assert s["sink_cuts"] >= 10 and s["sink_state_transfers"] >= 1 and s["fail_stops"] >= 1


def test_a_sink_restarted_idle_takes_its_visible_end_from_its_log_start() -> None:
    """After the mirrors caught up they sit idle past the sink's retention age and the whole
    sink cluster restarts twice, so no MIRRORED batch is left in any sink log: each node's
    visible end comes from the `mirror` section at its log start, and the link mirrors
    nothing twice. The killer of the end-to-end mutant of that section (test_mutants.py)."""
    res = run_simulation(profile_config(1, 3, "link"))
    assert res.ok, res.describe()
    assert res.stats["idle_restarts"] == 2 and res.stats["sink_cuts"] >= 10


def _break_the_link(monkeypatch: pytest.MonkeyPatch, change) -> None:  # noqa: ANN001
    """The source's fetch handler as the link sees it, with `change` applied to its reply."""
    serve = link_actor.Link._serve

    def broken(self, node_id: int, group: int, position: int):  # noqa: ANN001, ANN202
        reply = serve(self, node_id, group, position)
        if reply is not None and reply.batches:
            reply.batches = change(reply.batches)
        return reply

    monkeypatch.setattr(link_actor.Link, "_serve", broken)


def test_the_checker_finds_a_batch_skipped_without_a_bootstrap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Teeth: a link that drops a batch from a reply (and records no gap) leaves a hole the
    checker names."""
    _break_the_link(monkeypatch, lambda bs: bs[1:] if len(bs) > 2 else bs)
    res = run_simulation(profile_config(1, 3, "link"))
    assert any("no gap without a recorded bootstrap" in v.prop for v in res.violations), \
        res.describe()


def test_the_checker_finds_a_batch_mirrored_with_other_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Teeth: a link that changes a batch's timestamp is caught by the identical-batches check."""
    _break_the_link(monkeypatch, lambda bs: [VisibleBatch(b.base_offset, b.count,
                                                          b.timestamp_ms + 1, b.payload)
                                             for b in bs])
    res = run_simulation(profile_config(1, 3, "link"))
    assert any("identical offsets" in v.prop for v in res.violations), res.describe()


def test_mirrored_subscription_positions_are_capped_at_the_mirror_end() -> None:
    """Consumers commit positions on the source; the link copies them into the mirrors at
    min(source position, the mirror's committed visible end + 1), checked as each copy applies
    on the sink (never ahead of the mirror there, never ahead of the source, never refused);
    after the mirrors caught up every position is the source's. In this seed a source position
    is past the mirror's appended end while the link catches up: copied uncapped, the sink's
    bound refuses it (the position is lost for the round). The killer of the cap's mutant."""
    res = run_simulation(profile_config(3, 3, "link"))
    assert res.ok, res.describe()
    s = res.stats
    assert s["sub_positions_set"] >= 20 and s["sub_positions_capped"] >= 1


def test_the_checker_finds_a_mirrored_position_ahead_of_the_source(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Teeth: a source that answers each position one past its committed one (a skipped
    record for a consumer resuming on the mirror) is caught as the copy applies."""
    serve = link_subscriptions.Subscriptions._serve

    def ahead(self, node_id: int, group: int):  # noqa: ANN001, ANN202
        rows = serve(self, node_id, group)
        return None if rows is None else {n: p + 1 for n, p in rows.items()}

    monkeypatch.setattr(link_subscriptions.Subscriptions, "_serve", ahead)
    res = run_simulation(profile_config(1, 3, "link"))
    assert any("never ahead of the source" in v.prop for v in res.violations), res.describe()


def test_a_paused_link_appends_nothing_and_a_promoted_mirror_takes_writes_not_the_link() -> None:
    """`link pause` / `resume` and `topic promote` as scripted events (raft/sim/link_admin.py):
    while paused no sink node takes a MIRRORED proposal, and resumed the link resyncs and
    catches up; after the promote the link never proposes to that partition again, the
    promoted mirror takes (and commits) a write of its own, and its consumers, resuming from
    their mirrored positions, skip nothing the source had committed below them. The killer
    of the pause's and the promote's mutants (tests/raft/test_mutants.py)."""
    res = run_simulation(profile_config(1, 3, "link"))
    assert res.ok, res.describe()
    s = res.stats
    assert s["pauses"] >= 1 and s["promotes"] == 1 and s["own_writes_checked"] == 1
    assert s["resume_checks"] == 2 and s["sub_positions_set"] >= 10


def test_the_checker_finds_a_mirrored_position_ahead_of_the_mirror(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Teeth: the cap and the sink entry's bound both 100 too high (each alone is enough to
    keep a copy within the mirror: the bound is the core's, the cap the link's), so a
    position past what the mirror holds at that point of its log is set, and named."""
    committed_end = link_subscriptions.Subscriptions._committed_visible_end
    monkeypatch.setattr(link_subscriptions.Subscriptions, "_committed_visible_end",
                        staticmethod(lambda lead: committed_end(lead) + 100))
    monkeypatch.setattr(link_subscriptions, "make_entry",
                        lambda src, ops, now, bound=None: make_entry(
                            src, ops, now, None if bound is None else bound + 100))
    res = run_simulation(profile_config(7, 3, "link"))
    assert any("never ahead of the mirror" in v.prop for v in res.violations), res.describe()
