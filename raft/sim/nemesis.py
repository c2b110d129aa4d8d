"""Seeded faults: partitions (also one-way), crashes (the unflushed tail is lost), leader kills,
pauses, loss and duplication bursts, disk faults (a flush, metadata save or truncation that
fails with an I/O error or a full disk: MemoryLog.fail_next), and disk loss: between a crash and
its restart, a node's flushed log and/or metadata is wiped, truncated, holed or has bits flipped
(MemoryLog.wipe, lose_batches, lose_batch, lose_meta, flip_bits, flip_header), on fewer than a
majority of the voters at once (a node counts as damaged until it is a caught-up voter in good
standing again). Every fault heals within a bounded time, and everything heals at the end of
the fault window so liveness can be checked."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raft.sim.world import World
from storage.api import DiskFull, StorageIOError

KINDS = ("partition", "one_way", "crash", "crash_leader", "pause", "loss", "duplicate")
MEMBERSHIP = "member"
DISK = "disk"
DISK_LOSS = "disk_loss"
# What a disk loss does to the stopped node's storage, and how often each is drawn.
DISK_LOSS_KINDS = ("wipe", "wipe", "wipe_meta", "wipe_log", "truncate", "hole", "flip", "flip",
                   "flip_header", "flip+truncate")
# Which storage operations a disk fault hits, and how often each is drawn.
DISK_FAULT_OPS = ("flush", "flush", "save_meta", "truncate_suffix", "reset")


@dataclass
class Nemesis:
    sim: World
    rng: random.Random
    mean_gap_us: int = 150_000
    kinds: tuple[str, ...] = KINDS
    log: list[str] | None = None
    # Nodes whose disk was damaged and that are not whole again yet, with the (term, offset) of
    # the last entry they held flushed then: whole again once their log is at least that up to
    # date (anything they held may have been committed), as voters in good standing.
    damaged: dict[int, tuple[int, int]] = field(default_factory=dict)
    disk_losses: int = 0

    def schedule(self, start_us: int, end_us: int) -> None:
        t = start_us
        while True:
            t += int(self.rng.expovariate(1 / self.mean_gap_us))
            if t >= end_us:
                break
            kind = self.rng.choice(self.kinds)
            self.sim.loop.at(t, lambda kind=kind: self._fault(kind, end_us))
        self.sim.loop.at(end_us, self.heal_all)

    def _note(self, text: str) -> None:
        if self.log is not None:
            self.log.append(f"{self.sim.loop.now:>10} us  {text}")

    def _fault(self, kind: str, end_us: int) -> None:
        sim, rng = self.sim, self.rng
        ids = sorted(sim.nodes)
        heal_in = rng.randint(20_000, 400_000)
        if kind == "partition":
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            groups = [sorted(ids[:cut]), sorted(ids[cut:])]
            sim.network.partition(groups)
            self._note(f"partition {groups}")
            sim.loop.after(heal_in, self._heal_network)
        elif kind == "one_way":
            a, b = rng.sample(ids, 2)
            sim.network.block_one_way(a, b)
            self._note(f"one-way block {a}->{b}")
            sim.loop.after(heal_in, self._heal_network)
        elif kind in ("crash", "crash_leader"):
            leaders = [i for i in ids if sim.nodes[i].is_leader]
            victim = leaders[0] if kind == "crash_leader" and leaders else rng.choice(ids)
            node = sim.nodes[victim]
            if node.up:
                node.crash()
                self._note(f"crash node {victim}")
                sim.loop.after(heal_in, lambda: self._restart(victim))
        elif kind == "pause":
            victim = rng.choice(ids)
            sim.nodes[victim].pause()
            self._note(f"pause node {victim}")
            sim.loop.after(heal_in, lambda: sim.nodes[victim].resume())
        elif kind == "loss":
            sim.network.faults.loss = rng.choice([0.05, 0.2, 0.5])
            self._note(f"loss {sim.network.faults.loss}")
            sim.loop.after(heal_in, lambda: setattr(sim.network.faults, "loss", 0.0))
        elif kind == MEMBERSHIP:
            self._membership()
        elif kind == DISK:
            victim = rng.choice(ids)
            node = sim.nodes[victim]
            op = rng.choice(DISK_FAULT_OPS)
            full = op in ("flush", "save_meta") and rng.random() < 0.5
            times = rng.randint(1, 3)
            node.log.fail_next(op, DiskFull if full else StorageIOError, times=times)
            self._note(f"disk fault node {victim}: {op} fails {times}x "
                       f"({'disk full' if full else 'I/O error'})")
            sim.loop.after(heal_in, node.log.clear_faults)
        elif kind == DISK_LOSS:
            self._disk_loss(heal_in)
        elif kind == "duplicate":
            sim.network.faults.duplicate = 0.2
            self._note("duplicate 0.2")
            sim.loop.after(heal_in, lambda: setattr(sim.network.faults, "duplicate", 0.0))

    def _disk_loss(self, heal_in: int) -> None:
        sim, rng = self.sim, self.rng
        if not sim.checkers.leaders:
            return  # nothing was ever saved: a wipe now is a node that never started
        voters = sim.voters()
        self.damaged = {i: c for i, c in self.damaged.items() if not self._whole(i, c, voters)}
        if len(self.damaged) + 1 > (len(voters) - 1) // 2:
            return  # never a majority at once: more could lose committed data for good
        pick = [i for i in voters if i not in self.damaged]
        if not pick:
            return
        victim = rng.choice(pick)
        node = sim.nodes[victim]
        node.crash()
        sim.checkers.note_disk_loss(node)
        what = rng.choice(DISK_LOSS_KINDS)
        log = node.log
        held = (log.last_term(), log.flushed_offset)
        lo, hi = log.start_offset, log.flushed_offset
        where = rng.randint(lo, hi) if hi >= lo else None
        new_identity = rng.getrandbits(62) + 1
        if what == "wipe":
            log.wipe(new_identity)
        elif what == "wipe_meta":
            log.lose_meta(new_identity)
        elif what == "wipe_log" and where is not None:
            log.lose_batches(lo - 1)
        elif what in ("truncate", "flip+truncate") and where is not None:
            log.lose_batches(where)
        elif what == "hole" and where is not None:
            log.lose_batch(where)
        elif what == "flip_header" and where is not None:
            log.flip_header(where)
        if what in ("flip", "flip+truncate") and where is not None:
            end = where if what == "flip+truncate" else hi  # what is still stored
            for _ in range(rng.randint(1, 3)):
                log.flip_bits(rng.randint(lo, end))
        log.crash()  # what the restart's open finds (the process is down meanwhile)
        if what in ("wipe", "wipe_meta"):
            sim.note_new_identity(victim, new_identity)
        self.damaged[victim] = held
        self.disk_losses += 1
        self._note(f"disk loss node {victim}: {what}"
                   + (f" at offset {where}" if where is not None else ""))
        sim.loop.after(heal_in, lambda: self._restart(victim))

    def _whole(self, node_id: int, held: tuple[int, int], voters: list[int]) -> bool:
        """Whole again: up, a voter in good standing, nothing damaged, its flushed log at least
        as up to date as what it held when its disk was damaged."""
        node = self.sim.nodes[node_id]
        core, log = node.core, node.log
        return (node.up and core is not None and node_id in voters
                and node_id in core.config.voters and core.may_vote()
                and not log.damaged()
                and (log.term_at(log.flushed_offset), log.flushed_offset) >= held)

    def _membership(self) -> None:
        """Add a node that is outside the configuration, or remove a member (keeping at least
        three voters). The leader refuses while another change is uncommitted; that is fine."""
        sim, rng = self.sim, self.rng
        leaders = sim.leaders()
        if len(leaders) != 1:
            return
        core = sim.nodes[leaders[0]].core
        assert core is not None
        cfg = core.config
        outside = [i for i in sorted(sim.nodes) if i not in cfg.members]
        rid = -1000 - sim.loop.events_run  # nobody waits for these answers
        if outside and (len(cfg.voters) <= 3 or rng.random() < 0.5):
            new = rng.choice(outside)
            core.propose_config(rid, add_learner=new, address=f"sim:{new}")
            self._note(f"add learner {new} (via leader {leaders[0]})")
        elif len(cfg.voters) > 3:
            gone = rng.choice(list(cfg.members))
            core.propose_config(rid, remove=gone)
            self._note(f"remove node {gone} (via leader {leaders[0]})")
        sim.nodes[leaders[0]].process()

    def _restart(self, node_id: int) -> None:
        node = self.sim.nodes[node_id]
        if not node.up:
            node.start()
            self._note(f"restart node {node_id}")

    def _heal_network(self) -> None:
        self.sim.network.heal()

    def heal_all(self) -> None:
        self._note("heal everything")
        self.sim.network.heal()
        self.sim.network.faults.loss = 0.0
        self.sim.network.faults.duplicate = 0.0
        for i, node in self.sim.nodes.items():
            node.log.clear_faults()
            if not node.up:
                node.start()
            node.resume()
