"""The operator of the `link` profile: `link pause` / `link resume` and `topic promote` as
scripted events, and what they promise (issue 30, docs/REPLICATION.md).

Pause: at a random moment of the fault window the link is paused for 50-300 ms (once or twice
a run); while paused its pullers stop (a reply in flight is dropped: the runtime's pullers are
cancelled) and so do the subscription copies. Resume starts new pullers, which resync from the
sink leader's visible end. Promote: in about half the runs, late in the fault window, the last
mirror partition is promoted: the link stops for it for good, and the promoted mirror takes a
write of its own (a DATA batch to its leader, which the translated core appends at its
visible end + 1).

Checked, by watching every proposal a sink node takes (SimCluster.on_proposed), apart from the
link's own bookkeeping: no MIRRORED batch is proposed on the sink while the link is paused, nor
to a promoted partition after its promote. At the promote and again at the end, a consumer
resuming on the promoted mirror from its mirrored subscription position skips nothing: that
position is not past the mirror's committed visible end + 1, nor past the source's position of
the same name, and every source DATA batch below it is in the mirror or in a recorded
bootstrap gap (raft/sim/link_checker.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raft.core.types import Acks
from storage.batch import Batch, BatchKind
from storage.records import encode_values

if TYPE_CHECKING:
    from raft.sim.link_actor import Link
    from raft.sim.link_cluster import SimCluster
    from raft.sim.link_subscriptions import Subscriptions
    from raft.sim.loop import EventLoop

OWN_WRITE = b"promoted-write-"  # the payload prefix of the promoted mirror's own writes


@dataclass
class LinkAdmin:
    loop: "EventLoop"
    source: "SimCluster"
    sink: "SimCluster"
    link: "Link"
    subs: "Subscriptions"
    mirror: Any  # the MirrorChecker (raft/sim/link_checker.py imports this module's users)
    rng: random.Random
    trace_tail: list[str]
    paused_since: int | None = None
    promoted_at: dict[int, int] = field(default_factory=dict)  # group -> time (us)
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("pauses", "promotes", "own_writes", "resume_checks"), 0))

    def schedule(self, end_us: int) -> None:
        for _ in range(self.rng.randint(1, 2)):
            at = self.rng.randint(end_us // 10, end_us * 8 // 10)
            self.loop.at(at, lambda d=self.rng.randint(50_000, 300_000): self._pause(d))
        if self.rng.random() < 0.5:
            group = self.sink.groups[-1]
            self.loop.at(self.rng.randint(end_us * 7 // 10, end_us * 9 // 10),
                         lambda: self.promote(group))

    # -- pause / resume --------------------------------------------------------------------
    def _pause(self, for_us: int) -> None:
        if self.paused_since is not None:
            return
        self.paused_since = self.loop.now
        self.link.pause()
        self.stats["pauses"] += 1
        self.trace_tail.append(f"{self.loop.now:>10} us  link paused for {for_us} us")
        self.loop.after(for_us, self._resume)

    def _resume(self) -> None:
        self.paused_since = None
        self.link.resume()
        self.trace_tail.append(f"{self.loop.now:>10} us  link resumed")

    # -- promote ---------------------------------------------------------------------------
    def promote(self, group: int) -> None:
        self.promoted_at[group] = self.loop.now
        self.link.promote(group)
        self.stats["promotes"] += 1
        self.trace_tail.append(f"{self.loop.now:>10} us  topic promote: partition {group}")
        self.check_resume(group)
        self.loop.after(self.rng.randint(1_000, 30_000), lambda: self._own_write(group, 0))

    def _own_write(self, group: int, attempt: int) -> None:
        """The promoted mirror takes a write (retried on another leader a few times)."""
        lead = self.sink.leader_of(group)
        payload = encode_values([OWN_WRITE + str(group).encode()])
        batch = Batch.create(payload, 1, kind=BatchKind.DATA, timestamp_ms=self.loop.now // 1000)
        if lead is not None and lead.host.propose(group, self.sink.next_request_id(), batch,
                                                  Acks.LEADER):
            self.stats["own_writes"] += 1
        elif attempt < 20:
            self.loop.after(20_000, lambda: self._own_write(group, attempt + 1))

    @staticmethod
    def own_write(payload: bytes) -> bool:
        return OWN_WRITE in payload

    # -- the checks --------------------------------------------------------------------------
    def on_proposed(self, cluster: "SimCluster", node_id: int, group: int, b: Batch) -> None:
        """Every proposal a node of either cluster took."""
        if cluster is not self.sink or b.kind != BatchKind.MIRRORED:
            return
        if self.paused_since is not None:
            self.sink.fail(group, "link pause: nothing appended while paused",
                           f"sink node {node_id} took a MIRRORED proposal at "
                           f"{self.loop.now} us; the link was paused at {self.paused_since} us")
        if group in self.promoted_at:
            self.sink.fail(group, "promote: the link never appends again",
                           f"sink node {node_id} took a MIRRORED proposal at "
                           f"{self.loop.now} us; partition {group} was promoted at "
                           f"{self.promoted_at[group]} us")

    def check_resume(self, group: int) -> None:
        """Consumers resuming on the promoted mirror from their mirrored positions skip
        nothing the source had committed below them."""
        table = self.subs.sink_tables.get(group)
        if table is None:
            return
        self.stats["resume_checks"] += 1
        prog = self.mirror.progress.get(group)
        hist = self.mirror.history.get(group)
        mirrored = set() if prog is None else {base for _, base in prog.entries}
        end = -1 if prog is None else prog.visible_last
        source = self.subs.source_tables.get(group)
        for name, sub in sorted(table.subs.items()):
            p = sub.position
            src = None if source is None else source.get(name)
            where = f"promoted partition {group}: {name!r} resumes at {p}"
            if p > end + 1 or src is None or p > src.position:
                self.sink.fail(group, "promote: a consumer resumes with no skipped record",
                               f"{where}; the mirror's committed visible end is {end}, the "
                               f"source's position {None if src is None else src.position}")
                continue
            missing = [] if hist is None else [
                b for b in hist.between(0, p - 1) if b not in mirrored
                and not self.mirror._covered(group, b, hist.batches[b].last_offset)]
            if missing:
                self.sink.fail(group, "promote: a consumer resumes with no skipped record",
                               f"{where}; source batches at {missing[:5]} below it are "
                               f"neither in the mirror nor in a recorded bootstrap gap")
