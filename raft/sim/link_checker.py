"""The `link` profile's checker: every mirror partition is a prefix of its source.

The source's committed DATA batches are recorded as they commit (`on_source_ready`, after every
Ready of a source replica, and before every retention cut), so what the source's retention
deletes later is still known. The committed prefix is identical on every source replica (the
per-group Checkers check that), so any replica's log serves.

Every sink partition's committed log is checked as it commits; its visible batches (MIRRORED,
raft/sim/link_contract.py) must be, in log order: strictly increasing in visible offset (no
duplicate, no reordering); each identical to the source's committed DATA batch at the same
visible offset (count, timestamp, payload bytes); and with nothing of the source's skipped
between two of them (nor before the first) unless a recorded bootstrap gap
(raft/sim/link_actor.py) covers it. At the end each sink replica is read back through the
shared read functions (storage/mirrored.py). After the faults heal the link must catch up: the
sink leader holds the source's last committed DATA batch within the convergence bound.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raft.sim.checkers import read_whole
from raft.sim.link_actor import Gap
from raft.sim.link_contract import VisibleBatch, visible_end, visible_of
from storage import mirrored
from storage.batch import Batch, BatchKind

if TYPE_CHECKING:
    from raft.sim.link_cluster import SimCluster
    from raft.sim.link_subscriptions import Subscriptions
    from raft.sim.topics_node import GroupReplica


@dataclass
class SourceHistory:
    """The committed DATA batches of one source partition, kept past retention."""

    batches: dict[int, VisibleBatch] = field(default_factory=dict)  # base -> batch
    bases: list[int] = field(default_factory=list)  # sorted
    recorded_to: int = -1  # every committed offset up to here is recorded

    def advance(self, replica: "GroupReplica",
                on_batch: Callable[[int, Batch], None] | None = None) -> None:
        """Record what `replica` committed past `recorded_to`; `on_batch` sees every committed
        batch (DATA or not), once, in log order."""
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
                if on_batch is not None:
                    on_batch(replica.group, b)
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


@dataclass
class MirrorProgress:
    """How far one mirror partition's committed log has been checked."""

    checked_to: int = -1  # sink log offset: every committed batch up to here was checked
    visible_last: int = -1  # the visible end of what was checked
    batches: int = 0  # visible batches checked
    # (log offset of its last record, visible base) of every checked visible batch, in order:
    # what a consumer of the mirror must read through the read functions.
    entries: list[tuple[int, int]] = field(default_factory=list)
    failed: bool = False  # a violation was recorded: stop (one is enough)


@dataclass
class MirrorChecker:
    """Checks each sink partition's committed log once, as it commits (`on_sink_ready`, after
    every Ready of a sink replica and before every retention cut of one), against the source's
    history and the link's recorded bootstrap gaps (`gaps`, the link's own list). The committed
    prefix is identical on every sink replica (the per-group Checkers check that), so every
    committed offset is checked once, on whichever replica commits it first."""

    source: "SimCluster"
    sink: "SimCluster"
    gaps: list[Gap]
    history: dict[int, SourceHistory] = field(default_factory=dict)
    progress: dict[int, MirrorProgress] = field(default_factory=dict)
    # Replicated subscriptions (raft/sim/link_subscriptions.py): fed every committed batch of
    # both sides, in log order, as they are checked here.
    subs: "Subscriptions | None" = None
    # A promoted mirror's own writes (raft/sim/link_admin.py): `own_write(group, payload)`
    # tells them apart; they are kept here (group -> base -> batch) for the reads' check.
    own_write: Callable[[int, bytes], bool] | None = None
    own: dict[int, dict[int, VisibleBatch]] = field(default_factory=dict)
    promoted: set[int] = field(default_factory=set)  # the link's own set (no catching up)

    def on_source_ready(self, replica: "GroupReplica") -> None:
        self.history.setdefault(replica.group, SourceHistory()).advance(
            replica, None if self.subs is None else self.subs.on_source_batch)

    def on_sink_ready(self, replica: "GroupReplica") -> None:
        prog = self.progress.setdefault(replica.group, MirrorProgress())
        core, log = replica.core, replica.log
        if prog.failed or core is None:
            return
        commit = min(core.commit_index, log.dirty_offset)
        off = prog.checked_to + 1
        if off > commit or off < log.start_offset:
            return  # nothing new, or cut here already (checked on another replica)
        while off <= commit:
            batches, skip_to = read_whole(log, off, 1 << 20)
            if skip_to >= 0:
                return  # damaged here: another replica's copy will be read
            for b in batches:
                if b.last_offset > commit:
                    return
                v = visible_of(b)
                if v is not None:
                    if not self._check(replica, prog, v):
                        prog.failed = True
                        return
                    prog.entries.append((b.last_offset, v.base_offset))
                if self.subs is not None:
                    self.subs.on_sink_batch(replica, b, prog.visible_last)
                prog.checked_to = b.last_offset
            off = batches[-1].last_offset + 1

    def _covered(self, group: int, first: int, last: int) -> bool:
        return any(g.group == group and g.first <= first and last <= g.last for g in self.gaps)

    def _check(self, replica: "GroupReplica", prog: MirrorProgress, v: VisibleBatch) -> bool:
        """One committed visible batch, after those already checked: False on a violation."""
        group = replica.group
        hist = self.history.get(group, SourceHistory())
        prev_last = prog.visible_last
        where = f"sink node {replica.node_id} partition {group}"
        fail = self.sink.fail
        if v.base_offset <= prev_last:
            fail(group, "mirror: no duplicate, no reordering",
                 f"{where}: visible batch at {v.base_offset} (count {v.count}) committed "
                 f"after one ending at {prev_last}")
            return False
        if self.own_write is not None and self.own_write(group, v.payload):
            self.own.setdefault(group, {})[v.base_offset] = v  # the promoted mirror's write
            prog.visible_last = v.last_offset
            prog.batches += 1
            return True
        src = hist.batches.get(v.base_offset)
        if src is None:
            fail(group, "mirror: every batch is the source's",
                 f"{where}: visible batch at {v.base_offset} is no committed DATA batch of the "
                 f"source (source recorded to {hist.recorded_to})")
            return False
        if src != v:
            fail(group, "mirror: identical offsets, counts, timestamps and bytes",
                 f"{where}: at {v.base_offset} the mirror has count {v.count} ts "
                 f"{v.timestamp_ms} {len(v.payload)} bytes, the source count {src.count} ts "
                 f"{src.timestamp_ms} {len(src.payload)} bytes"
                 + ("" if src.payload == v.payload else " (payloads differ)"))
            return False
        skipped = hist.between(prev_last + 1, v.base_offset - 1)
        missing = [b for b in skipped if not self._covered(group, b, hist.batches[b].last_offset)]
        if missing:
            gaps = [(g.first, g.last) for g in self.gaps if g.group == group]
            fail(group, "mirror: no gap without a recorded bootstrap",
                 f"{where}: source batches at {missing[:5]} ({len(missing)} in all) between "
                 f"visible {prev_last} and {v.base_offset} were never mirrored and no "
                 f"bootstrap covers them (gaps {gaps})")
            return False
        prog.visible_last = v.last_offset
        prog.batches += 1
        return True

    def check(self, rng: random.Random) -> dict[int, int]:
        """At the end: what every sink replica committed is checked, and read back through the
        read functions; the committed visible end per partition."""
        for group in self.sink.groups:
            for _, replica in sorted(self.sink.members(group).items()):
                self.on_sink_ready(replica)
            for _, replica in sorted(self.sink.members(group).items()):
                if replica.core is not None and not self.progress[group].failed:
                    self.check_reads(replica, rng)
        return {g: self.progress.get(g, MirrorProgress()).visible_last for g in self.sink.groups}

    def check_reads(self, replica: "GroupReplica", rng: random.Random) -> None:
        """What a consumer reads of this replica's committed mirror through the shared read
        functions (storage/mirrored.py): from the visible start to the visible high watermark
        exactly the checked batches the log still holds, in order, with each batch's fields;
        the visible high watermark their end; and a fetch from any visible offset (inside a
        gap too) starts with the batch holding it or the next one."""
        group, log, core = replica.group, replica.log, replica.core
        assert core is not None
        prog = self.progress.get(group, MirrorProgress())
        hist = self.history.get(group, SourceHistory())
        upto = min(core.commit_index, log.dirty_offset)
        where = f"sink node {replica.node_id} partition {group}"
        held = [vb for last, vb in prog.entries if log.start_offset <= last <= upto]
        start = mirrored.visible_start(log)
        hw = mirrored.run_sync(mirrored.visible_end_upto(log, upto))
        batches = {**hist.batches, **self.own.get(group, {})}
        want_hw = batches[held[-1]].last_offset if held else start - 1
        if hw != want_hw:
            self.sink.fail(group, "mirror reads: visible high watermark",
                           f"{where}: visible_end_upto(commit {upto}) = {hw}, the committed "
                           f"mirror ends at {want_hw}")
            return
        got: list[VisibleBatch] = []
        pos, hint = start, None
        while True:
            out, pos, hint = mirrored.run_sync(mirrored.fetch(log, pos, upto, 700, 7, hint))
            if not out:
                break
            got.extend(VisibleBatch.of_reply(d) for d in out)
        want = [batches[vb] for vb in held]
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                         min(len(got), len(want)))
            self.sink.fail(group, "mirror reads: a consumer reads the committed mirror",
                           f"{where}: fetching from visible start {start} read {len(got)} "
                           f"batches, the committed log holds {len(want)}; first difference "
                           f"at #{first}: {got[first:first + 1]} vs {want[first:first + 1]}")
            return
        for _ in range(5):
            if not want:
                break
            v = rng.randint(start, want[-1].last_offset)
            out, _, _ = mirrored.run_sync(mirrored.fetch(log, v, upto, 1, 1))
            expect = next(b for b in want if b.last_offset >= v)
            if not out or VisibleBatch.of_reply(out[0]) != expect:
                self.sink.fail(group, "mirror reads: a fetch from a visible offset",
                               f"{where}: fetch from visible {v} returned "
                               f"{out[:1]}, the batch holding it (or the next) is at "
                               f"{expect.base_offset}")
                return

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
            if group in self.promoted:
                continue  # no longer a mirror: it follows nothing
            if visible_end(lead.core) < hist.data_end:
                return False
        return True
