"""The simulated network: per-message delay (so reordering), loss, duplication, and
partitions, including one-way ones. All randomness comes from the simulation's seeded RNG."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from raft.core import messages as m
from raft.sim.loop import EventLoop


@dataclass(slots=True)
class NetworkFaults:
    min_delay_us: int = 200
    max_delay_us: int = 3_000
    loss: float = 0.0
    duplicate: float = 0.0
    # Occasionally a message takes much longer (a slow path): reorders it behind later ones.
    slow: float = 0.02
    slow_delay_us: int = 40_000


class Network:
    def __init__(self, loop: EventLoop, rng: random.Random,
                 deliver: Callable[[m.Message], None]) -> None:
        self.loop = loop
        self.rng = rng
        self.deliver = deliver
        self.faults = NetworkFaults()
        self.blocked: set[tuple[int, int]] = set()  # (src, dst) pairs that drop messages
        self.sent = 0
        self.dropped = 0

    def partition(self, groups: list[list[int]]) -> None:
        """Nodes in different groups cannot talk (both directions)."""
        self.blocked.clear()
        for i, a in enumerate(groups):
            for b in groups[i + 1:]:
                for x in a:
                    for y in b:
                        self.blocked.update({(x, y), (y, x)})

    def block_one_way(self, src: int, dst: int) -> None:
        self.blocked.add((src, dst))

    def heal(self) -> None:
        self.blocked.clear()

    def send(self, msg: m.Message) -> None:
        self.sent += 1
        f = self.faults
        if (msg.src, msg.dst) in self.blocked or self.rng.random() < f.loss:
            self.dropped += 1
            return
        copies = 2 if self.rng.random() < f.duplicate else 1
        for _ in range(copies):
            delay = self.rng.randint(f.min_delay_us, f.max_delay_us)
            if self.rng.random() < f.slow:
                delay += self.rng.randint(0, f.slow_delay_us)
            self.loop.after(delay, lambda msg=msg: self._arrive(msg))

    def _arrive(self, msg: m.Message) -> None:
        # A partition that starts while a message is in flight drops it too.
        if (msg.src, msg.dst) in self.blocked:
            self.dropped += 1
            return
        self.deliver(msg)
