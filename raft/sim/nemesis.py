"""Seeded faults: partitions (also one-way), crashes (the unflushed tail is lost), leader kills,
pauses, loss and duplication bursts, and disk faults (a flush, metadata save or truncation that
fails with an I/O error or a full disk: MemoryLog.fail_next). Every fault heals within a bounded
time, and everything heals at the end of the fault window so liveness can be checked."""

from __future__ import annotations

import random
from dataclasses import dataclass

from raft.sim.world import World
from storage.api import DiskFull, StorageIOError

KINDS = ("partition", "one_way", "crash", "crash_leader", "pause", "loss", "duplicate")
MEMBERSHIP = "member"
DISK = "disk"
# Which storage operations a disk fault hits, and how often each is drawn.
DISK_FAULT_OPS = ("flush", "flush", "save_meta", "truncate_suffix", "reset")


@dataclass
class Nemesis:
    sim: World
    rng: random.Random
    mean_gap_us: int = 150_000
    kinds: tuple[str, ...] = KINDS
    log: list[str] | None = None

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
        elif kind == "duplicate":
            sim.network.faults.duplicate = 0.2
            self._note("duplicate 0.2")
            sim.loop.after(heal_in, lambda: setattr(sim.network.faults, "duplicate", 0.0))

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
