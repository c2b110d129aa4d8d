"""Replicated subscriptions in the `link` profile (issue 30): consumers commit positions on the
source, the link copies them into the mirrors, capped at what each mirror holds.

Source side: a few named consumers per partition read the source's committed DATA and commit
their position (the next offset to read) now and then, as the core's subscription operations in
a CONTROL entry proposed to the source partition's leader (raft/core/subscription_table.py;
acks=quorum, no lease). Every committed batch of a source partition is applied, in log order,
to one SubscriptionTable for the partition (the committed prefix is identical on every source
replica), fed by the mirror checker's history as it records commits (raft/sim/link_checker.py),
so it outlives the source's retention cuts.

The link (as raft/node/links/subscriptions.py `mirror_subscriptions` and puller.py
`_mirror_subscriptions`): every SUBS_EVERY_US per partition, sooner (CAPPED_AGAIN_US) after a
round that capped a position while the mirror's end has moved since, the sink partition's
leader asks a source node (over the link network, with its faults) for the partition's
positions; the source leader answers with its committed table (the runtime's `sub_list` reads
after an entry of its own: a linearizable read). For each position the sink leader sets
min(source position, mirror's committed visible high watermark + 1) with a reset, where its
table differs, in one CONTROL entry bounded by its visible end + 1 (as the node's
subscription service does for a mirror). An answer that arrives under another sink
leadership is dropped.

Checked as each sink entry of the link's applies, in the sink's committed log order (one table
per mirror partition, fed by the mirror checker): every copied position is set (a refusal means
it was past the mirror's end: the cap missed); it is never ahead of the mirror's committed
visible end + 1 at that point of the log (a consumer resuming there on the mirror finds it
holds everything before it); and never ahead of the source's committed position of the same
name (the source's positions only move forward here, so a position past it would skip
records the source's consumer had not processed). At the end, after the link caught up and
one more round, every mirrored position equals its source's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raft.core.subscription_table import (Applied, Op, OpRequest, SubscriptionTable,
                                          decode_entry, make_entry)
from raft.core.types import Acks
from storage import mirrored
from storage.batch import Batch

if TYPE_CHECKING:
    from raft.sim.link_actor import Link
    from raft.sim.link_cluster import SimCluster
    from raft.sim.loop import EventLoop
    from raft.sim.topics_node import GroupReplica

LINK_NODE = 0  # the `src` node id of the link's entries on the sink (no node has id 0)
CONSUMER_NODE = -1  # the `src` node id of the source consumers' entries
SUBS_EVERY_US = 60_000
CAPPED_AGAIN_US = 15_000
CONSUMERS_PER_PARTITION = 2
COMMIT_EVERY_US = (10_000, 80_000)


@dataclass
class Consumer:
    group: int
    name: str
    position: int = 0  # the next offset it reads (committed DATA below it is processed)


@dataclass
class Copier:
    """One partition's copy rounds on the sink side."""

    group: int
    due_us: int = 0
    capped_at: int | None = None  # the mirror's end at a round that capped a position
    last_round_us: int = 0
    asking: bool = False


@dataclass
class Subscriptions:
    loop: "EventLoop"
    source: "SimCluster"
    sink: "SimCluster"
    link: "Link"
    history: dict[int, Any]  # the mirror checker's SourceHistory per partition
    rng: random.Random
    stopped: bool = False  # the source consumers stop with the producers
    source_tables: dict[int, SubscriptionTable] = field(default_factory=dict)
    sink_tables: dict[int, SubscriptionTable] = field(default_factory=dict)
    consumers: list[Consumer] = field(default_factory=list)
    copiers: dict[int, Copier] = field(default_factory=dict)
    seq: int = 0
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("sub_commits_proposed", "sub_rounds", "sub_positions_proposed", "sub_positions_capped",
         "sub_positions_set", "sub_stale_answers"), 0))

    # -- the run ---------------------------------------------------------------------------
    def start(self) -> None:
        for g in self.source.groups:
            for i in range(CONSUMERS_PER_PARTITION):
                c = Consumer(g, f"c{i}")
                self.consumers.append(c)
                self.loop.after(self.rng.randint(*COMMIT_EVERY_US), lambda c=c: self._consume(c))
            self.copiers[g] = Copier(g)
            self.loop.after(self.rng.randint(0, SUBS_EVERY_US), lambda g=g: self._tick(g))

    # -- the source's consumers ------------------------------------------------------------
    def _consume(self, c: Consumer) -> None:
        """Read on a few committed DATA batches past the position and commit the new one."""
        if self.stopped:
            return
        self.loop.after(self.rng.randint(*COMMIT_EVERY_US), lambda: self._consume(c))
        hist = self.history.get(c.group)
        lead = self.source.leader_of(c.group)
        if hist is None or lead is None:
            return
        ahead = hist.between(c.position, hist.data_end)
        if not ahead:
            return
        base = ahead[min(len(ahead) - 1, self.rng.randint(0, 4))]
        position = hist.batches[base].last_offset + 1
        self.seq += 1
        ops = [OpRequest(Op.OPEN, c.name, c.name, 0, 0),
               OpRequest(Op.COMMIT, c.name, c.name, position, 0)]
        batch = make_entry((CONSUMER_NODE, c.group, self.seq), ops, self.loop.now // 1000)
        if lead.host.propose(c.group, self.source.next_request_id(), batch, Acks.QUORUM):
            c.position = position  # committed or not: the table has the truth
            self.stats["sub_commits_proposed"] += 1

    # -- the link's copy rounds ------------------------------------------------------------
    def _tick(self, group: int) -> None:
        if self.link.stopped:
            return
        self.loop.after(CAPPED_AGAIN_US, lambda: self._tick(group))
        cp = self.copiers[group]
        lead, owner = self.link._leadership(group)
        if lead is None or cp.asking:
            return
        now = self.loop.now
        end = self._committed_visible_end(lead)
        due = now >= cp.due_us or (cp.capped_at is not None and end > cp.capped_at
                                   and now >= cp.last_round_us + CAPPED_AGAIN_US)
        if not due:
            return
        cp.due_us, cp.last_round_us, cp.asking = now + SUBS_EVERY_US, now, True
        self.stats["sub_rounds"] += 1
        target = self.link.pullers[group].source_hint
        if target not in self.source.nodes or self.rng.random() < 0.1:
            target = self.rng.choice(sorted(self.source.nodes))

        def at_source() -> None:
            rows = self._serve(target, group)
            if rows is None:
                cp.asking = False  # (as a timed-out call: asked again next round)
                return
            self._carry(lambda: self._on_rows(group, owner, rows), target,
                        lambda: setattr(cp, "asking", False))

        self._carry(at_source, target, lambda: setattr(cp, "asking", False))

    def _carry(self, action, node: int, lost) -> None:  # noqa: ANN001
        """One message over the link network (its faults), either way; `lost` if dropped."""
        f = self.link.faults
        if f.cut or node in f.blocked or self.rng.random() < f.loss:
            lost()
            return
        delay = self.rng.randint(f.min_delay_us, f.max_delay_us)

        def arrive() -> None:
            if self.link.faults.cut or node in self.link.faults.blocked:
                lost()
            else:
                action()

        self.loop.after(delay, arrive)

    def _serve(self, node_id: int, group: int) -> dict[str, int] | None:
        """The source node's `sub_list`: on the partition's leader, its committed table."""
        node = self.source.nodes[node_id]
        rep = node.replicas.get(group)
        if not node.up or node.paused or rep is None or not rep.up or not rep.is_leader:
            return None
        table = self.source_tables.get(group)
        return {} if table is None else {n: s.position for n, s in table.subs.items()}

    @staticmethod
    def _committed_visible_end(lead: "GroupReplica") -> int:
        """The sink leader's visible high watermark: what its consumers may read."""
        assert lead.core is not None
        upto = min(lead.core.commit_index, lead.log.dirty_offset)
        return mirrored.run_sync(mirrored.visible_end_upto(lead.log, upto))

    def _on_rows(self, group: int, owner: tuple[int, ...] | None,
                 rows: dict[str, int]) -> None:
        cp = self.copiers[group]
        cp.asking = False
        lead, now_owner = self.link._leadership(group)
        if lead is None or now_owner != owner:
            self.stats["sub_stale_answers"] += 1
            return
        end = self._committed_visible_end(lead)
        cap = end + 1
        table = self.sink_tables.get(group)
        have = {} if table is None else {n: s.position for n, s in table.subs.items()}
        ops, capped = [], False
        for name, source_position in sorted(rows.items()):
            position = min(source_position, cap)  # the cap
            capped |= source_position > cap
            self.stats["sub_positions_capped"] += source_position > cap
            if position >= 0 and have.get(name) != position:
                ops.append(OpRequest(Op.RESET, name, "", position))
        cp.capped_at = end if capped else None
        if not ops:
            return
        self.seq += 1
        assert lead.core is not None
        batch = make_entry((LINK_NODE, group, self.seq), ops, self.loop.now // 1000,
                           lead.core.visible_end + 1)
        if lead.host.propose(group, self.sink.next_request_id(), batch, Acks.QUORUM):
            self.stats["sub_positions_proposed"] += len(ops)

    # -- the tables, fed in committed log order --------------------------------------------
    @staticmethod
    def _apply(tables: dict[int, SubscriptionTable], group: int, b: Batch) -> Applied | None:
        table = tables.get(group)
        if table is None:
            table = tables[group] = SubscriptionTable(b.base_offset)
        table.skip_to(b.base_offset)
        return table.apply(b)

    def on_source_batch(self, group: int, b: Batch) -> None:
        self._apply(self.source_tables, group, b)

    def on_sink_batch(self, replica: "GroupReplica", b: Batch, visible_last: int) -> None:
        """One committed sink batch, after every visible batch before it was checked
        (`visible_last`: the mirror's committed visible end at this point of the log)."""
        applied = self._apply(self.sink_tables, replica.group, b)
        if applied is None or not applied.src or applied.src[0] != LINK_NODE:
            return
        decoded = decode_entry(b.payload)
        assert decoded is not None
        group, where = replica.group, f"sink node {replica.node_id} partition {replica.group}"
        source = self.source_tables.get(group)
        for op, outcome in zip(decoded[1], applied.outcomes):
            assert op is not None
            if not outcome.ok:
                self.sink.fail(group, "mirrored subscription: copied at min(source, mirror "
                               "end + 1)", f"{where}: the reset of {op.name!r} to "
                               f"{op.position} at log {b.base_offset} was refused "
                               f"({outcome.code.name}: {outcome.message}); the mirror's "
                               f"committed visible end there is {visible_last}")
                continue
            self.stats["sub_positions_set"] += 1
            if op.position > visible_last + 1:
                self.sink.fail(group, "mirrored subscription: never ahead of the mirror",
                               f"{where}: {op.name!r} set to {op.position} at log "
                               f"{b.base_offset}, the mirror's committed visible end there "
                               f"is {visible_last}")
            src_sub = None if source is None else source.get(op.name)
            if src_sub is None or op.position > src_sub.position:
                self.sink.fail(group, "mirrored subscription: never ahead of the source",
                               f"{where}: {op.name!r} set to {op.position} at log "
                               f"{b.base_offset}, the source's committed position is "
                               f"{None if src_sub is None else src_sub.position}")

    # -- at the end ------------------------------------------------------------------------
    def in_step(self) -> bool:
        """Every mirrored position equals its source's (the mirrors caught up)."""
        for g in self.source.groups:
            if g in self.link.promoted:
                continue  # the link stopped for it: positions stay where they were
            src = self.source_tables.get(g)
            rows = {} if src is None else {n: s.position for n, s in src.subs.items()}
            sink = self.sink_tables.get(g)
            have = {} if sink is None else {n: s.position for n, s in sink.subs.items()}
            if rows != have:
                return False
        return True

    def describe(self) -> str:
        out = []
        for g in self.source.groups:
            src, sink = self.source_tables.get(g), self.sink_tables.get(g)
            out.append(f"g{g}: source {None if src is None else {n: s.position for n, s in src.subs.items()}}"
                       f" mirror {None if sink is None else {n: s.position for n, s in sink.subs.items()}}")
        return "; ".join(out)
