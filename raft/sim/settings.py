"""What one simulation run is asked to do (SimConfig) and what it found (SimResult).

Apart from raft/sim/runner.py so the runner of the single-group profiles and the topics
profile's runner (raft/sim/topics_runner.py) share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raft.sim.checkers import Violation
from raft.sim.nemesis import KINDS


@dataclass
class SimConfig:
    seed: int
    nodes: int = 3
    # Extra processes that start outside the configuration; the "member" fault adds them as
    # learners (promoted once caught up) and removes members.
    spare_nodes: int = 0
    clients: int = 3
    client_think_us: tuple[int, int] = (500, 10_000)  # a client's pause between writes
    # Clients without a producer id (never retrying a write: each attempt writes a new value),
    # whose writes the leader may merge into one batch (raft/core/merging.py), and how long a
    # node's Ready pass waits after a proposal (raft/sim/node.py) so that several come in one.
    plain_clients: int = 0
    propose_ready_us: int = 0
    # Consumers of subscriptions (raft/sim/subscription_model.py), one per subscription.
    subscriptions: int = 2
    fault_time_us: int = 2_000_000
    # After healing, the cluster must elect one leader and converge within this bound.
    converge_within_us: int = 4_000_000
    mean_fault_gap_us: int = 150_000
    faults: tuple[str, ...] = KINDS
    tick_us: int = 10_000
    raft: dict[str, Any] = field(default_factory=dict)
    profile: str = "mixed"  # the name shown in replay hints
    persist_hard_state: bool = True  # False only in the teeth tests
    # The direct "commit needs a flushed majority" check; the teeth tests turn it off to show
    # the end-to-end checks (lost acknowledged records, diverging committed data) also catch
    # a wrong commit rule.
    check_flushed_majority: bool = True
    keep_trace: bool = False
    # RetentionPolicy fields (small limits) for every node; None = keep everything.
    retention: dict[str, Any] | None = None
    # Quiescence (raft/core/quiesce.py) with the node-level failure detector that backs it
    # (raft/sim/liveness.py). False: quiesce_ticks = 0 and no detector, the runs as before.
    quiesce: bool = True
    liveness_ping_us: int = 20_000
    liveness_down_us: int = 100_000
    # After convergence: a quiet phase (no clients, no faults) in which every node must
    # quiesce within `quiesce_within_ticks` ticks and then send no Raft message for
    # `quiet_window_us`; then the quiet leader's node crashes and another node must lead
    # within `failover_within_us` (the liveness that node liveness has to give back).
    quiet_phase: bool = True
    quiesce_within_ticks: int = 40
    quiet_window_us: int = 1_000_000
    failover_within_us: int = 1_000_000
    # The topics profile (raft/sim/topics_runner.py): a controller and many partition groups
    # per node; the admin keeps the partition count between these bounds.
    topics: bool = False
    partitions: tuple[int, int] = (10, 50)
    # RetentionPolicy fields for the controller's log (group 0) in the topics profile: cut
    # with its metadata in the state at the log start, as the runtime does. None = keep it.
    controller_retention: dict[str, Any] | None = None
    # Recovery slots per node shared by its groups (recovery/budget.py; 0 = no limit): few, so
    # catch-ups after crashes and partitions queue for them.
    recovery_streams: int = 2
    # Shard processes per node (docs/SHARDS.md): the nodes register this many, the controller
    # places each partition on a shard index, and every replica runs on it; a message of a
    # group must leave and reach the replicas on that shard ("shard to shard" checker).
    shards: int = 1
    # The link profile (raft/sim/link_runner.py): a source and a sink cluster of `nodes` each
    # and a link mirroring `link_partitions` partitions between them.
    link: bool = False
    link_partitions: int = 2
    # RetentionPolicy fields for the sink's mirror partitions (the source's are `retention`):
    # cut with the visible end in the `mirror` snapshot section. None = keep everything.
    sink_retention: dict[str, Any] | None = None


@dataclass
class SimResult:
    seed: int
    violations: list[Violation]
    trace_hash: str
    stats: dict[str, Any]
    trace_tail: list[str]
    profile: str = "mixed"
    quiesce: bool = True
    shards: int = 1

    @property
    def ok(self) -> bool:
        return not self.violations

    def describe(self) -> str:
        lines = [f"seed {self.seed}: {'OK' if self.ok else 'FAILED'}  {self.stats}"]
        for v in self.violations:
            lines.append(f"  [{v.time_us} us] {v.prop}: {v.detail}")
        if not self.ok and self.trace_tail:
            lines.append("  last events:")
            lines.extend("    " + t for t in self.trace_tail[-25:])
            lines.append(f"  replay: python -m raft.sim --seed {self.seed} "
                         f"--nodes {self.stats.get('nodes')} --profile {self.profile}"
                         + ("" if self.quiesce or self.profile == "noquiesce"
                            else " --no-quiesce")
                         + ("" if self.shards == 1 else f" --shards {self.shards}"))
        return "\n".join(lines)
