"""The `link` profile (issue 30): two simulated clusters and a link, on one event loop and clock.

The source cluster (nodes 1..3) runs `link_partitions` partition groups with idempotent
producers and a small retention policy; the sink cluster (nodes 101..103) runs the mirror
partitions, `translated` groups (REPL-DESIGN.md); the link (raft/sim/link_actor.py) pulls each
partition's committed DATA from the source leader into the sink leader as MIRRORED batches.
Each cluster has its own nemesis (partitions, one-way blocks, crashes, leader kills, pauses,
loss, duplication) and the link its own (cuts, loss, duplication, slow paths); a long cut now
and then lets the source's retention delete past the link's position, and the link bootstraps.

Checked: per group of either cluster, the Raft checks of the topics profile (election safety,
commit monotonic, committed prefix identical, flushed majority, log matching, committed data
above log starts); the source's partitions: exactly once, per-key order, quorum-acked records
kept; every mirror partition a prefix of its source (raft/sim/link_checker.py); replicated
subscriptions (raft/sim/link_subscriptions.py: consumers commit positions on the source, the link
copies them capped at the mirror's end; each copy set, never ahead of the mirror at its point of
the sink's log, never ahead of the source); `link pause`/`resume` and `topic promote` as
scripted events (raft/sim/link_admin.py: nothing proposed to the sink while paused or after the
promote, consumers resuming on a promoted mirror skip nothing); and after the faults heal,
within a bound, both clusters converged, every mirror caught up and every mirrored position is
its source's.
"""

from __future__ import annotations

import hashlib
import random

from raft.core.retention import RetentionPolicy
from raft.sim.checkers import Violation
from raft.sim.link_actor import Link
from raft.sim.link_admin import LinkAdmin
from raft.sim.link_checker import MirrorChecker
from raft.sim.link_cluster import SimCluster
from raft.sim.link_subscriptions import Subscriptions
from raft.sim.loop import EventLoop
from raft.sim.settings import SimConfig, SimResult
from raft.sim.topics_node import GroupReplica
from storage.batch import Batch

CONVERGE_POLL_US = 5_000
SINK_IDS_FROM = 101


class LinkSimulation:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.loop = EventLoop()
        self.trace = hashlib.blake2b(digest_size=16)
        self.trace_tail: list[str] = []
        self._rid = 0
        knobs = {"election_ticks": 10, "heartbeat_ticks": 1, "max_append_bytes": 4096,
                 "recovery_chunk_bytes": 2048, "follower_flush_bytes": 8192, **cfg.raft}
        groups = list(range(1, cfg.link_partitions + 1))
        retention = (RetentionPolicy(**cfg.retention).validate() if cfg.retention is not None
                     else None)
        sink_retention = (RetentionPolicy(**cfg.sink_retention).validate()
                          if cfg.sink_retention is not None else None)
        common = {"faults": cfg.faults, "mean_fault_gap_us": cfg.mean_fault_gap_us}
        self.source = SimCluster(self, "source", list(range(1, cfg.nodes + 1)), groups, knobs,
                                 retention=retention, translated=False, **common)
        self.sink = SimCluster(self, "sink",
                               list(range(SINK_IDS_FROM, SINK_IDS_FROM + cfg.nodes)), groups,
                               knobs, retention=sink_retention, translated=True, **common)
        self.link = Link(self.loop, self.source, self.sink,
                         random.Random(self.rng.getrandbits(64)), self.trace_tail)
        self.mirror = MirrorChecker(self.source, self.sink, self.link.gaps)
        self.subs = Subscriptions(self.loop, self.source, self.sink, self.link,
                                  self.mirror.history, random.Random(self.rng.getrandbits(64)))
        self.mirror.subs = self.subs
        self.admin = LinkAdmin(self.loop, self.source, self.sink, self.link, self.subs,
                               self.mirror, random.Random(self.rng.getrandbits(64)),
                               self.trace_tail)
        self.mirror.own_write = lambda g, payload: (g in self.link.promoted
                                                    and self.admin.own_write(payload))
        self.mirror.promoted = self.link.promoted
        self._last_poll = -CONVERGE_POLL_US
        self._last_verdict = False
        self.idle_restarts = 0

    # -- what the clusters report ------------------------------------------------------------
    def next_request_id(self) -> int:
        self._rid += 1
        return self._rid

    def on_ready(self, cluster: SimCluster, replica: GroupReplica) -> None:
        if cluster is self.source:
            self.mirror.on_source_ready(replica)
        else:
            self.mirror.on_sink_ready(replica)

    def on_proposed(self, cluster: SimCluster, node_id: int, group: int, batch: Batch) -> None:
        self.admin.on_proposed(cluster, node_id, group, batch)

    def on_retention_plan(self, cluster: SimCluster, replica: GroupReplica) -> None:
        """Record (check) what the cut is about to delete while it is still there."""
        self.on_ready(cluster, replica)

    # -- the run -------------------------------------------------------------------------------
    def _poll(self) -> bool:
        if self.loop.now - self._last_poll >= CONVERGE_POLL_US:
            self._last_poll = self.loop.now
            self._last_verdict = self.mirror.caught_up()
        return self._last_verdict

    def _wait_caught_up(self) -> bool:
        self._last_poll = -CONVERGE_POLL_US
        self.loop.run_until(self.loop.now + self.cfg.converge_within_us, stop=self._poll)
        return self.mirror.caught_up()

    def _not_caught_up(self, when: str) -> None:
        self.sink.fail(self.sink.groups[0], "liveness",
                       f"both clusters converged and every mirror caught up with its source "
                       f"not reached {self.cfg.converge_within_us} us {when}: "
                       f"{self.source.states()}; {self.sink.states()}; source DATA ends "
                       f"{ {g: h.data_end for g, h in self.mirror.history.items()} }")

    def _wait_positions(self) -> None:
        """Once the mirrors caught up, the link's next rounds carry every position exactly."""
        self.loop.run_until(self.loop.now + self.cfg.converge_within_us,
                            stop=self.subs.in_step)
        if not self.subs.in_step():
            self.sink.fail(self.sink.groups[0], "liveness",
                           f"the mirrors caught up but their subscription positions are not "
                           f"the source's {self.cfg.converge_within_us} us later: "
                           f"{self.subs.describe()}")

    def _idle_restarts(self) -> None:
        """The mirrors caught up and sit idle past the sink's retention age, so each sink log
        is cut to its newest batch; then the whole sink cluster restarts, twice (the first
        restart's elections append NOOPs, so after the second idle wait no MIRRORED batch is
        left in the logs at all). Every sink node must then take its visible end from the
        `mirror` section at its log start: a mirror that forgot it would fetch from the
        source's start again and append duplicates, and the link must mirror nothing more."""
        age = (self.cfg.sink_retention or {}).get("max_age_ms")
        if age is None:
            return
        for round_ in (1, 2):
            self.loop.run_until(self.loop.now + 2 * age * 1000)
            for n in self.sink.nodes.values():
                n.crash()
            self.trace_tail.append(f"{self.loop.now:>10} us  idle phase: the sink cluster "
                                   f"restarts ({round_} of 2)")
            for n in self.sink.nodes.values():
                n.start()
            if not self._wait_caught_up():
                self._not_caught_up(f"after the sink's idle restart {round_}")
                return
        self.idle_restarts = 2

    def run(self) -> SimResult:
        cfg = self.cfg
        self.source.producers.start(cfg.clients)
        for c in (self.source, self.sink):
            c.nemesis.schedule(0, cfg.fault_time_us)
            c.liveness.start()
        self.link.schedule_faults(0, cfg.fault_time_us)
        self.link.start()
        self.subs.start()
        self.admin.schedule(cfg.fault_time_us)
        try:
            self.loop.run_until(cfg.fault_time_us)
            self.source.producers.stopped = self.subs.stopped = True
            if self._wait_caught_up():
                self._wait_positions()
                self._idle_restarts()
            else:
                self._not_caught_up("after healing")
        except Exception as e:  # noqa: BLE001 (a core invariant failure is a finding)
            self.sink.fail(self.sink.groups[0], "core raised", f"{type(e).__name__}: {e}")
            return self._result({})
        self.source.final_checks(check_data=True)
        self.sink.final_checks(check_data=False)
        ends = self.mirror.check(random.Random(self.rng.getrandbits(64)))
        for group in sorted(self.link.promoted):
            self.admin.check_resume(group)
        return self._result(ends)

    def _result(self, ends: dict[int, int]) -> SimResult:
        cfg = self.cfg
        violations = [Violation(v.time_us, f"{v.prop} (group {g})", v.detail)
                      for c in (self.source, self.sink) for g, v in c.violations()]
        stats = {"nodes": cfg.nodes, "sim_ms": self.loop.now // 1000,
                 "events": self.loop.events_run,
                 "messages": self.source.network.sent + self.sink.network.sent,
                 "requests": self.source.producers.sent,
                 "acked": len(self.source.producers.acked),
                 "source_batches": sum(len(h.bases) for h in self.mirror.history.values()),
                 "mirrored_batches": sum(p.batches for p in self.mirror.progress.values()),
                 "mirror_ends": ends, "idle_restarts": self.idle_restarts, **self.link.stats,
                 **self.subs.stats, **self.admin.stats,
                 "own_writes_checked": sum(len(o) for o in self.mirror.own.values()),
                 "restarts": sum(n.restarts for c in (self.source, self.sink)
                                 for n in c.nodes.values()),
                 "fail_stops": sum(n.fail_stops for c in (self.source, self.sink)
                                   for n in c.nodes.values()),
                 "retention_cuts": sum(r.retention_cuts for n in self.source.nodes.values()
                                       for r in n.replicas.values()),
                 "retention_checked": sum(c.retention_checked
                                          for c in self.source.group_checkers.values()),
                 "sink_cuts": sum(r.retention_cuts for n in self.sink.nodes.values()
                                  for r in n.replicas.values()),
                 "sink_state_transfers": sum(c.state_transfers
                                             for c in self.sink.group_checkers.values())}
        return SimResult(cfg.seed, violations, self.trace.hexdigest(), stats,
                         list(self.trace_tail), cfg.profile, cfg.quiesce)
