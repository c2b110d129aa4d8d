"""The `link` profile's checker: every mirror partition is a prefix of its source.

The source's committed DATA batches are recorded as they commit (`on_source_ready`, after every
Ready of a source replica, and before every retention cut), so what the source's retention
deletes later is still known. The committed prefix is identical on every source replica (the
per-group Checkers check that), so any replica's log serves.

For every sink replica's committed log, its visible batches (MIRRORED, raft/sim/link_contract.py)
must be, in log order: strictly increasing in visible offset (no duplicate, no reordering); each
identical to the source's committed DATA batch at the same visible offset (count, timestamp,
payload bytes); and with nothing of the source's skipped between two of them (nor before the
first) unless a recorded bootstrap gap (raft/sim/link_actor.py) covers it. After the faults heal
the link must catch up: the sink leader's committed visible end reaches the source's last
committed DATA batch within the convergence bound.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raft.sim.checkers import read_whole
from raft.sim.link_actor import Gap
from raft.sim.link_contract import VisibleBatch, visible_end, visible_of
from storage.batch import BatchKind

if TYPE_CHECKING:
    from raft.sim.link_cluster import SimCluster
    from raft.sim.topics_node import GroupReplica


@dataclass
class SourceHistory:
    """The committed DATA batches of one source partition, kept past retention."""

    batches: dict[int, VisibleBatch] = field(default_factory=dict)  # base -> batch
    bases: list[int] = field(default_factory=list)  # sorted
    recorded_to: int = -1  # every committed offset up to here is recorded

    def advance(self, replica: "GroupReplica") -> None:
        core, log = replica.core, replica.log
        if core is None:
            return
        commit = min(core.commit_index, log.dirty_offset)
        off = self.recorded_to + 1
        if off > commit or off < log.start_offset:
            return  # nothing new, or this replica no longer has it (another one will)
        while off <= commit:
            batches, skip_to = read_whole(log, off, 1 << 20)
            if skip_to >= 0:
                return  # damaged here: another replica's copy will be read
            for b in batches:
                if b.last_offset > commit:
                    return
                if b.kind == BatchKind.DATA:
                    self.batches[b.base_offset] = VisibleBatch(b.base_offset, b.count,
                                                               b.timestamp_ms, b.payload)
                    self.bases.append(b.base_offset)
                self.recorded_to = b.last_offset
            off = batches[-1].last_offset + 1

    def between(self, lo: int, hi: int) -> list[int]:
        """Bases of recorded DATA batches with lo <= base <= hi."""
        i = bisect.bisect_left(self.bases, lo)
        j = bisect.bisect_right(self.bases, hi)
        return self.bases[i:j]

    @property
    def data_end(self) -> int:
        """The last offset of the last committed DATA batch (-1: none)."""
        return self.batches[self.bases[-1]].last_offset if self.bases else -1


def sink_visible(replica: "GroupReplica") -> list[VisibleBatch]:
    """The visible batches of a sink replica's committed log, in log order."""
    core, log = replica.core, replica.log
    assert core is not None
    upto = min(core.commit_index, log.dirty_offset)
    out: list[VisibleBatch] = []
    off = log.start_offset
    while off <= upto:
        batches, skip_to = read_whole(log, off, 1 << 22)
        if skip_to >= 0:
            off = skip_to
            continue
        for b in batches:
            if b.last_offset > upto:
                return out
            v = visible_of(b)
            if v is not None:
                out.append(v)
        off = batches[-1].last_offset + 1
    return out


@dataclass
class MirrorChecker:
    source: "SimCluster"
    sink: "SimCluster"
    history: dict[int, SourceHistory] = field(default_factory=dict)
    mirrored: dict[int, int] = field(default_factory=dict)  # partition -> visible batches

    def on_source_ready(self, replica: "GroupReplica") -> None:
        self.history.setdefault(replica.group, SourceHistory()).advance(replica)

    def _covered(self, gaps: list[Gap], group: int, first: int, last: int) -> bool:
        return any(g.group == group and g.first <= first and last <= g.last for g in gaps)

    def check_replica(self, group: int, node_id: int, replica: "GroupReplica",
                      gaps: list[Gap]) -> int:
        """Check one sink replica's committed mirror; returns its committed visible end."""
        hist = self.history.get(group, SourceHistory())
        prev_last = -1
        fail = self.sink.fail
        visible = sink_visible(replica)
        self.mirrored[group] = max(self.mirrored.get(group, 0), len(visible))
        for v in visible:
            where = f"sink node {node_id} partition {group}"
            if v.base_offset <= prev_last:
                fail(group, "mirror: no duplicate, no reordering",
                     f"{where}: visible batch at {v.base_offset} (count {v.count}) follows "
                     f"one ending at {prev_last}")
                return prev_last
            src = hist.batches.get(v.base_offset)
            if src is None:
                fail(group, "mirror: every batch is the source's",
                     f"{where}: visible batch at {v.base_offset} is no committed DATA batch "
                     f"of the source (source recorded to {hist.recorded_to})")
                return prev_last
            if src != v:
                fail(group, "mirror: identical offsets, counts, timestamps and bytes",
                     f"{where}: at {v.base_offset} the mirror has count {v.count} ts "
                     f"{v.timestamp_ms} {len(v.payload)} bytes, the source count {src.count} "
                     f"ts {src.timestamp_ms} {len(src.payload)} bytes"
                     + ("" if src.payload == v.payload else " (payloads differ)"))
                return prev_last
            skipped = hist.between(prev_last + 1, v.base_offset - 1)
            missing = [b for b in skipped
                       if not self._covered(gaps, group, b, hist.batches[b].last_offset)]
            if missing:
                fail(group, "mirror: no gap without a recorded bootstrap",
                     f"{where}: source batches at {missing[:5]} ({len(missing)} in all) "
                     f"between visible {prev_last} and {v.base_offset} were never mirrored "
                     f"and no bootstrap covers them (gaps {[(g.first, g.last) for g in gaps if g.group == group]})")
                return prev_last
            prev_last = v.last_offset
        return prev_last

    def check(self, gaps: list[Gap]) -> dict[int, int]:
        """Every sink replica of every partition; the committed visible end per partition
        (the highest any replica has)."""
        ends: dict[int, int] = {}
        for group in self.sink.groups:
            for node_id, replica in sorted(self.sink.members(group).items()):
                if replica.core is None:
                    continue
                end = self.check_replica(group, node_id, replica, gaps)
                ends[group] = max(ends.get(group, -1), end)
        return ends

    def caught_up(self) -> bool:
        """Both clusters converged (so every sink log is committed to its end) and every
        partition's sink leader holds the source's last committed DATA batch."""
        if not (self.source.converged() and self.sink.converged()):
            return False
        for group in self.sink.groups:
            lead = self.sink.leader_of(group)
            hist = self.history.get(group, SourceHistory())
            if lead is None or lead.core is None:
                return False
            if visible_end(lead.core, lead.log) < hist.data_end:
                return False
        return True
