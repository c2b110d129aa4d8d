"""The link of the `link` profile: what the links runtime does on the sink (REPL-DESIGN.md), one
puller per mirror partition, over a link network with faults of its own.

A puller runs where the sink partition's leader runs, for one leadership (node, core, term):
it fetches the source partition's committed DATA from the source leader at the sink leader's
`visible_end + 1` (progress IS the mirror's log: no table of its own), and proposes each
fetched batch to that leader's core as a MIRRORED batch tagged with the source's visible base
(acks=leader, as `append_mirrored`). A new sink leader, a crash or a restart starts a new
puller, which resumes from its core's `visible_end` (a resync); a reply of a fetch sent under
another leadership is dropped (it could skip what the new leader lost). As the node's puller, it
fetches ahead: a reply's arrival sends the next fetch at that reply's end before its batches
are proposed, and a reply fetched ahead is proposed only if the one it continues was placed
whole (otherwise it could leave out what that one did not place: a gap the position rule
allows).

The link is at-least-once on purpose: a fetch unanswered within `fetch_timeout_us` is sent
again while the first may still be answered late, and the link network duplicates messages;
every reply that arrives while its leadership lasts is proposed. Handing the core the same
batches twice is then common, and the core's position rule (a MIRRORED proposal whose base is
not past `visible_end` is refused with MIRROR_POSITION) is what keeps the mirror exactly-once.

Bootstrap: a reply whose source log start is past the fetch position (the source's retention
deleted what the link had not mirrored) records the gap [position, start - 1] for the checker
(raft/sim/link_checker.py) and goes on from the source's start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raft.core.ready import ProduceAnswer
from raft.core.types import Acks, ErrorCode
from raft.sim.link_contract import (VisibleBatch, mirrored_proposal, position_refusal,
                                    visible_end)
from storage.api import StorageError
from storage.batch import BatchKind, CorruptBatch

if TYPE_CHECKING:
    from raft.sim.link_cluster import SimCluster
    from raft.sim.loop import EventLoop

LINK_FAULTS = ("link_cut", "link_cut", "link_partial", "link_loss", "link_duplicate",
               "link_slow")


@dataclass(slots=True)
class LinkFaults:
    min_delay_us: int = 300
    max_delay_us: int = 4_000
    loss: float = 0.0
    duplicate: float = 0.0
    slow: float = 0.02
    slow_delay_us: int = 60_000
    cut: bool = False
    blocked: frozenset[int] = frozenset()  # source nodes the link cannot reach


@dataclass(slots=True, frozen=True)
class Gap:
    """A bootstrap: the source deleted [first, last] before the link mirrored it."""

    group: int
    first: int
    last: int
    time_us: int


@dataclass(slots=True)
class Reply:
    batches: list[VisibleBatch]
    start: int  # the source log start when it was read
    leader_hint: int | None = None
    not_leader: bool = False


@dataclass
class Puller:
    group: int
    owner: tuple[int, ...] | None = None  # (sink node, id(core), term, link epoch)
    fetch_id: int = 0
    waiting: dict[int, int] = field(default_factory=dict)  # fetch id -> sent at (us)
    source_hint: int | None = None
    # Fetches sent ahead (fetch id -> whether the reply they continue was placed whole; None
    # while it is being proposed): as raft/node/links/puller.py, a reply fetched at the end of
    # the previous one, before that one was proposed.
    continues: dict[int, bool | None] = field(default_factory=dict)


@dataclass
class Link:
    loop: "EventLoop"
    source: "SimCluster"
    sink: "SimCluster"
    rng: random.Random
    trace_tail: list[str]
    poll_us: int = 5_000
    fetch_timeout_us: int = 40_000
    max_fetch_bytes: int = 2_048
    fetch_ahead: bool = True  # send the next fetch at a reply's end before proposing it
    mean_fault_gap_us: int = 250_000
    faults: LinkFaults = field(default_factory=LinkFaults)
    pullers: dict[int, Puller] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    proposals: dict[int, tuple[int, int]] = field(default_factory=dict)  # rid -> (group, base)
    proposing: int = 0  # the request id being proposed now
    refused_now: bool = False  # it was refused at once
    stopped: bool = False
    # `link pause` (every puller stops; a resume starts new ones: `epoch` is part of a
    # puller's ownership, so a reply fetched before the pause is stale) and `topic promote`
    # (the partition's puller stops for good): raft/sim/link_admin.py.
    paused: bool = False
    epoch: int = 0
    promoted: set[int] = field(default_factory=set)
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("fetches", "replies", "link_dropped", "proposed", "mirrored_acks",
         "position_refusals", "resyncs", "bootstraps", "stale_replies", "not_leader",
         "fetched_ahead", "ahead_dropped"), 0))

    def pause(self) -> None:
        self.paused, self.epoch = True, self.epoch + 1

    def resume(self) -> None:
        self.paused, self.epoch = False, self.epoch + 1

    def promote(self, group: int) -> None:
        self.promoted.add(group)

    def runs(self, group: int) -> bool:
        """Whether the partition's puller runs (not stopped, paused or promoted)."""
        return not (self.stopped or self.paused or group in self.promoted)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for g in self.sink.groups:
            self.pullers[g] = Puller(g)
            self.loop.after(self.rng.randint(0, self.poll_us), lambda g=g: self._round(g))

    def schedule_faults(self, start_us: int, end_us: int) -> None:
        t = start_us
        while True:
            t += int(self.rng.expovariate(1 / self.mean_fault_gap_us))
            if t >= end_us:
                break
            kind = self.rng.choice(LINK_FAULTS)
            self.loop.at(t, lambda kind=kind: self._fault(kind))
        self.loop.at(end_us, self.heal)

    def _fault(self, kind: str) -> None:
        f, heal_in = self.faults, self.rng.randint(20_000, 400_000)
        if kind == "link_cut":
            f.cut = True
            heal_in *= 2  # long enough, now and then, for the source to delete past it
        elif kind == "link_partial":
            ids = sorted(self.source.nodes)
            f.blocked = frozenset(self.rng.sample(ids, self.rng.randint(1, len(ids) - 1)))
            kind += f" {sorted(f.blocked)}"
        elif kind == "link_loss":
            f.loss = self.rng.choice([0.1, 0.3, 0.6])
        elif kind == "link_duplicate":
            f.duplicate = 0.3
        elif kind == "link_slow":
            f.slow = 0.5
        self.trace_tail.append(f"{self.loop.now:>10} us  {kind} for {heal_in} us")
        self.loop.after(heal_in, self.heal)

    def heal(self) -> None:
        self.faults = LinkFaults()

    # -- the link network ------------------------------------------------------------------
    def _carry(self, action, node: int) -> None:  # noqa: ANN001
        """A message between the sink and source node `node`, either way."""
        f = self.faults
        if f.cut or node in f.blocked or self.rng.random() < f.loss:
            self.stats["link_dropped"] += 1
            return
        for _ in range(2 if self.rng.random() < f.duplicate else 1):
            delay = self.rng.randint(f.min_delay_us, f.max_delay_us)
            if self.rng.random() < f.slow:
                delay += self.rng.randint(0, f.slow_delay_us)
            self.loop.after(delay, lambda: self._arrive(action, node))

    def _arrive(self, action, node: int) -> None:  # noqa: ANN001
        if self.faults.cut or node in self.faults.blocked:  # (a cut while on its way)
            self.stats["link_dropped"] += 1
            return
        action()

    # -- a puller ----------------------------------------------------------------------------
    def _leadership(self, group: int):  # noqa: ANN202
        """The sink leader's replica and its (node, core, term), or (None, None)."""
        lead = self.sink.leader_of(group)
        if lead is None or lead.core is None or not self.runs(group):
            return None, None
        return lead, (lead.node_id, id(lead.core), lead.core.term, self.epoch)

    def _round(self, group: int) -> None:
        if self.stopped:
            return
        self.loop.after(self.poll_us, lambda: self._round(group))
        p = self.pullers[group]
        lead, owner = self._leadership(group)
        if owner != p.owner:
            if p.owner is not None or owner is not None:
                self.stats["resyncs"] += owner is not None
            p.owner, p.waiting, p.continues = owner, {}, {}
        if lead is None:
            return
        now = self.loop.now
        p.waiting = {f: t for f, t in p.waiting.items() if now - t < self.fetch_timeout_us}
        if not p.waiting:
            self._fetch(p, lead)

    def _fetch(self, p: Puller, lead, position: int | None = None) -> int:  # noqa: ANN001
        if position is None:
            position = visible_end(lead.core) + 1
        p.fetch_id += 1
        fid, owner, group = p.fetch_id, p.owner, p.group
        p.waiting[fid] = self.loop.now
        target = p.source_hint if p.source_hint in self.source.nodes and \
            self.rng.random() < 0.9 else self.rng.choice(sorted(self.source.nodes))
        self.stats["fetches"] += 1

        def at_source() -> None:
            reply = self._serve(target, group, position)
            if reply is not None:
                self._carry(lambda: self._on_reply(group, owner, fid, position, reply), target)

        self._carry(at_source, target)
        return fid

    def _serve(self, node_id: int, group: int, position: int) -> Reply | None:
        """The source node's fetch handler: committed DATA from `position` (or from its log
        start, when retention deleted past it), up to a byte budget."""
        node = self.source.nodes[node_id]
        if not node.up or node.paused:
            return None
        rep = node.replicas.get(group)
        if rep is None or not rep.up or rep.core is None:
            return None
        if not rep.is_leader:
            return Reply([], -1, leader_hint=rep.core.leader_id, not_leader=True)
        log = rep.log
        commit = min(rep.core.commit_index, log.dirty_offset)
        start = log.start_offset
        out: list[VisibleBatch] = []
        used, off = 0, max(position, start)
        try:
            while off <= commit and used < self.max_fetch_bytes:
                batches = log.read(off, self.max_fetch_bytes)
                for b in batches:
                    if b.last_offset > commit:
                        return Reply(out, start)
                    if b.kind == BatchKind.DATA and b.base_offset >= position:
                        out.append(VisibleBatch(b.base_offset, b.count, b.timestamp_ms,
                                                b.payload))
                        used += b.size
                off = batches[-1].last_offset + 1
        except (CorruptBatch, StorageError):
            pass  # a damaged batch is not served: the link asks again
        return Reply(out, start)

    def _on_reply(self, group: int, owner: tuple[int, ...] | None, fid: int,
                  position: int, reply: Reply) -> None:
        p = self.pullers[group]
        self.stats["replies"] += 1
        lead, now_owner = self._leadership(group)
        if lead is None or now_owner != owner or owner != p.owner:
            self.stats["stale_replies"] += 1
            return  # fetched for another leadership (or none now): its puller is gone
        p.waiting.pop(fid, None)
        if reply.not_leader:
            self.stats["not_leader"] += 1
            p.source_hint = reply.leader_hint
            return
        if fid in p.continues and not p.continues[fid]:
            # Fetched ahead at the end of a reply that was not placed whole: appending it
            # could leave out what that one did not place. The next round resyncs.
            self.stats["ahead_dropped"] += 1
            return
        end = visible_end(lead.core)
        if reply.start > position and end == position - 1:
            gap = Gap(group, position, reply.start - 1, self.loop.now)
            self.gaps.append(gap)
            self.stats["bootstraps"] += 1
            self.trace_tail.append(f"{self.loop.now:>10} us  link bootstrap g{group}: source "
                                   f"start {reply.start} past position {position}")
        ahead = None
        if self.fetch_ahead and reply.batches and not any(f in p.continues for f in p.waiting):
            last = reply.batches[-1]
            ahead = self._fetch(p, lead, last.base_offset + last.count)
            p.continues[ahead] = None
            self.stats["fetched_ahead"] += 1
        whole = self._propose_all(group, lead, reply)
        if ahead is not None:
            p.continues[ahead] = whole
        if whole and reply.batches and not p.waiting:
            self._fetch(p, lead)  # more may be there: go on at once

    def _propose_all(self, group: int, lead, reply: Reply) -> bool:  # noqa: ANN001
        """Propose a reply's batches in order, stopping at the first not placed (as
        append_mirrored); whether all were placed."""
        for vb in reply.batches:
            rid = self.sink.next_request_id()
            self.proposals[rid] = (group, vb.base_offset)
            self.stats["proposed"] += 1
            self.proposing, self.refused_now = rid, False
            if not lead.host.propose(group, rid, mirrored_proposal(vb), Acks.LEADER):
                self.proposals.pop(rid, None)
                return False
            if self.sink.leader_of(group) is not lead:
                return False  # the proposal stopped the node or its leadership
            if self.refused_now:
                return False  # stop at the first refusal, resync next fetch
        return True

    def on_answer(self, group: int, node_id: int, a: ProduceAnswer) -> None:
        if self.proposals.pop(a.request_id, None) is None:
            return
        if a.error == ErrorCode.OK:
            self.stats["mirrored_acks"] += 1
            return
        if a.request_id == self.proposing:
            self.refused_now = True  # answered with the append: the proposing loop stops
        if position_refusal(a) is not None:
            self.stats["position_refusals"] += 1
            self.stats["resyncs"] += 1  # the next fetch goes from the core's visible end
