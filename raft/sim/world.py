"""What the nemesis and the workload need of a running simulation, as a Protocol: the event
loop, the network, the nodes, the checkers and who leads. raft/sim/runner.py's Simulation
provides it and builds both; naming the Protocol here, below all three, keeps them from
importing each other."""

from __future__ import annotations

from typing import Protocol

from raft.sim.checkers import Checkers
from raft.sim.loop import EventLoop
from raft.sim.network import Network
from raft.sim.node import SimNode


class World(Protocol):
    loop: EventLoop
    network: Network
    nodes: dict[int, SimNode]
    checkers: Checkers

    def leaders(self) -> list[int]:
        """The ids of the nodes that currently believe they lead."""
        ...

    def voters(self) -> list[int]:
        """The voters of the configuration in force on the leader (the bootstrap ones when
        there is no single leader)."""
        ...

    def note_new_identity(self, node_id: int, incarnation: int) -> None:
        """`node_id` lost its disk and comes back as `incarnation` (for the checkers)."""
        ...
