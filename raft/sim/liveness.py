"""Node-level liveness in the simulation: one failure detector per ordered node pair, fed by
the simulated network, driving the cores' peer_down / peer_up inputs (raft/core/quiesce.py).

What the runtime is to do with one peer link per node pair, modelled here: every node sends a
small liveness ping to every other node each `ping_us` (in the runtime the node-level heartbeat
on the shared peer link: one per node pair, however many groups), and anything heard from a
peer counts (a ping or any Raft message). An observer that has heard nothing from a peer for
`down_us` reports it down to its core; the first thing heard from it again reports it up.
Pings travel the same simulated network as Raft messages, so partitions (one-way ones too),
loss bursts, crashes and pauses in the nemesis show as peers going down. A node that is down
or paused neither pings nor listens; a node that starts (or resumes) begins with every peer
presumed up, as a fresh process would, and finds out again within `down_us`.

Pings are counted apart from Raft messages (`pings`), so the quiet-phase check can require
that quiesced groups send no Raft messages at all while the node-level detector keeps running.

A peer that restarted faster than `down_us` never looks silent, yet everything its groups were
doing is gone; with many groups per node a restarted process may not even run a group again
until it has caught up with the controller (or, its disk lost, been re-added), so its quiet
followers would wait for a leader that never speaks. With `restart_is_down` each ping carries
the sender's process epoch (in the runtime: the boot id in the peer handshake,
raft/node/liveness.py `peer_booted`), and
an observer that hears a newer epoch than it knew reports the peer down and at once up again:
the quiet followers wake, start their election timers and ping their leader, and elect another
if it does not answer (raft/core/quiesce.py). Off by default: the single-group profiles' runs
stay exactly as they were.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raft.sim.loop import EventLoop
    from raft.sim.network import Network
    from raft.sim.node import SimNode


@dataclass
class NodeLiveness:
    loop: "EventLoop"
    network: "Network"
    nodes: dict[int, "SimNode"]
    rng: random.Random
    ping_us: int = 20_000
    down_us: int = 100_000
    last_heard: dict[tuple[int, int], int] = field(default_factory=dict)  # (observer, peer)
    down: set[tuple[int, int]] = field(default_factory=set)  # (observer, peer) reported down
    stalled: set[int] = field(default_factory=set)  # observers down or paused at the last round
    pings: int = 0
    reported_down: int = 0
    reported_up: int = 0
    restart_is_down: bool = False
    epochs: dict[tuple[int, int], int] = field(default_factory=dict)  # (observer, peer) -> epoch
    restarts_seen: int = 0

    def start(self) -> None:
        for i in self.nodes:
            self.on_start(i)
        self.loop.after(self.ping_us, self._round)

    def on_start(self, observer: int) -> None:
        """A (re)started process: it presumes every peer up until it hears otherwise."""
        now = self.loop.now
        for peer in self.nodes:
            if peer != observer:
                self.last_heard[(observer, peer)] = now
                self.down.discard((observer, peer))
                self.epochs.pop((observer, peer), None)
        self.stalled.discard(observer)

    def heard(self, observer: int, peer: int, epoch: int | None = None) -> None:
        node = self.nodes[observer]
        if not node.up or node.paused:
            return
        self.last_heard[(observer, peer)] = self.loop.now
        if epoch is not None and self.restart_is_down:
            known = self.epochs.get((observer, peer))
            if known is None or epoch > known:
                self.epochs[(observer, peer)] = epoch
            if known is not None and epoch > known and (observer, peer) not in self.down:
                self.restarts_seen += 1  # restarted unseen: report it down, then up below
                self.down.add((observer, peer))
                self.reported_down += 1
                node.peer_down(peer)
                if not node.up or node.paused:
                    return
        if (observer, peer) in self.down:
            self.down.discard((observer, peer))
            self.reported_up += 1
            node.peer_up(peer)

    def _round(self) -> None:
        self.loop.after(self.ping_us, self._round)
        now = self.loop.now
        for i, node in self.nodes.items():
            if not node.up or node.paused:
                self.stalled.add(i)
                continue
            if i in self.stalled:
                # Resumed (a restart went through on_start already): it catches up on what
                # it was sent meanwhile, so nobody looks silent yet; its core keeps what it
                # was told, and hears peer_up as peers are heard from again.
                self.stalled.discard(i)
                for peer in self.nodes:
                    if peer != i:
                        self.last_heard[(i, peer)] = now
            for peer in self.nodes:
                if peer != i:
                    self._ping(i, peer)
        for i, node in self.nodes.items():
            if not node.up or node.paused:
                continue
            for peer in self.nodes:
                if peer == i or (i, peer) in self.down:
                    continue
                if now - self.last_heard[(i, peer)] > self.down_us:
                    self.down.add((i, peer))
                    self.reported_down += 1
                    node.peer_down(peer)

    def _ping(self, src: int, dst: int) -> None:
        self.pings += 1
        net = self.network
        if (src, dst) in net.blocked or self.rng.random() < net.faults.loss:
            return
        delay = self.rng.randint(net.faults.min_delay_us, net.faults.max_delay_us)
        epoch = self.nodes[src].epoch

        def arrive() -> None:
            if (src, dst) not in net.blocked:
                self.heard(dst, src, epoch)

        self.loop.after(delay, arrive)

    def reported_down_by(self, observer: int) -> list[int]:
        return sorted(p for (o, p) in self.down if o == observer)
