"""The core's knobs (RaftConfig) and the one source of randomness it takes (Rng).

Ticks are the runtime's unit of time; the runtime maps them to milliseconds
(raft.node.config.NodeConfig.tick_ms), the simulation to simulated microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class Rng(Protocol):
    """The only randomness the core uses (election timeouts), passed in already seeded: the
    runtime seeds it from the OS, the simulation from its schedule seed."""

    def randrange(self, stop: int) -> int: ...


@dataclass(slots=True)
class RaftConfig:
    """Knobs of the core. Ticks are the runtime's unit of time (raft.node.config.NodeConfig.tick_ms,
    50 ms by default)."""

    node_id: int
    voters: list[int]
    learners: list[int] = field(default_factory=list)
    # A follower that hears nothing for a random [election_ticks, 2 * election_ticks) campaigns.
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    # Bytes per AppendEntries in normal replication and per recovery chunk (at least one batch
    # is always sent, whatever its size; a chunk may run an eighth over, recovery/stream.py).
    max_append_bytes: int = 1 << 20
    recovery_chunk_bytes: int = 512 << 10
    # ...and at most this many batches per request: the leader reads and encodes, the follower
    # decodes and appends, a whole request in one step of its event loop, so with small
    # batches this bounds that step (docs/PERFORMANCE.md, bounded event-loop work).
    max_append_batches: int = 1024
    # Pipelining limits per follower.
    max_inflight: int = 4
    max_inflight_bytes: int = 8 << 20
    # A follower receiving flush=False data flushes once this many bytes are unflushed, or
    # after this many ticks, whichever comes first.
    follower_flush_bytes: int = 8 << 20
    follower_flush_ticks: int = 2
    pre_vote: bool = True
    check_quorum: bool = True
    # Quorum produce requests waiting for commit; beyond it the leader answers BACKPRESSURE.
    max_pending_produce: int = 10_000
    # Bytes the leader may hold appended past its commit index before it answers acks=leader
    # and acks=none writes BACKPRESSURE (raft/core/backlog.py): such writes are paced by
    # replication instead of running the leader's log far ahead of its followers (0 = no limit).
    max_uncommitted_bytes: int = 32 << 20
    # Concurrent single-producer DATA writes proposed within one Ready pass are appended as one
    # batch (raft/core/merging.py) of at most this many records and bytes (and never more than
    # max_append_bytes). 0 records = every write a batch of its own.
    merge_max_records: int = 1024
    merge_max_bytes: int = 256 << 10
    # Sequences remembered per idempotent producer, and producers remembered.
    producer_window: int = 8
    max_producers: int = 100_000
    # Baseline for benchmarks only: every recovery chunk asks the follower to flush before it
    # replies (the behaviour the RFC replaces). Off in production.
    recovery_flush_per_chunk: bool = False
    # The commit index is saved with the metadata at most this often (and whenever term, vote
    # or configuration change), so a restarted node starts from a recent commit index instead
    # of -1 (Kafka checkpoints its high watermark the same way). 0 = only with other changes.
    commit_checkpoint_ticks: int = 20
    # Recovery throttle: bytes of flush=False catch-up chunks the leader may send per tick,
    # summed over all followers (0 = unlimited), with bursts up to recovery_burst_bytes
    # (0 = one recovery chunk). It lives in the core, in ticks, so throttled chunks are never
    # queued behind later heartbeats (which made followers look like they lost them).
    recovery_rate_bytes_per_tick: int = 0
    recovery_burst_bytes: int = 0
    # Quiescence (raft/core/quiesce.py): a leader whose group has had nothing to do for this
    # many ticks (every follower matched, flushed and told the commit index; nothing pending)
    # tells its followers, and then neither heartbeats nor times out until something happens.
    # Six ticks as CockroachDB does (300 ms at the default 50 ms tick). 0 = never quiesce.
    # Only safe to turn on in a runtime that feeds node liveness (peer_down / peer_up):
    # without it a quiesced follower would not notice its leader's node dying.
    quiesce_ticks: int = 6
    # Snapshot sections only this group's state at the log start carries, besides the
    # registered ones (raft.core.snapshot.Section; group 0 passes the controller's metadata,
    # raft.controller.section), so its log can be cut without data partitions carrying them.
    snapshot_sections: tuple[Any, ...] = ()
    # A mirror partition (issue 30, raft/core/mirror.py): every batch consumers see is MIRRORED,
    # at visible offsets; DATA proposals become MIRRORED at the next visible offset. Set when the
    # group is created (a topic with an origin) and never cleared: offsets must keep their
    # meaning after `topic promote`. False: visible offset == log offset, as always.
    translated: bool = False

    def validate(self) -> "RaftConfig":
        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"raft setting {name}={value!r} must be a positive integer")

        for name in ("node_id", "election_ticks", "heartbeat_ticks", "max_append_bytes",
                     "recovery_chunk_bytes", "max_append_batches", "max_inflight",
                     "max_inflight_bytes",
                     "follower_flush_bytes", "follower_flush_ticks", "max_pending_produce",
                     "producer_window", "max_producers"):
            positive(name)
        for name in ("recovery_rate_bytes_per_tick", "recovery_burst_bytes", "quiesce_ticks",
                     "max_uncommitted_bytes", "merge_max_records", "merge_max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"raft setting {name}={value!r} must be an integer >= 0 "
                                 f"(0 = {'never' if name == 'quiesce_ticks' else 'no limit'})")
        if self.heartbeat_ticks >= self.election_ticks:
            raise ValueError(f"heartbeat_ticks ({self.heartbeat_ticks}) must be below "
                             f"election_ticks ({self.election_ticks}); raise election_ticks")
        if not self.voters:
            raise ValueError("voters is empty: list every voting node, this one included")
        return self
