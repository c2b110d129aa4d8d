"""The controller's first entries: the founders and the default topic.

A new cluster's controller log starts with one RegisterNode per founder and the default topic
(one partition, every founder a replica, the lowest id its preferred leader): today's commands,
which name no topic, keep working on it (issue 26 item 9). The runtime proposes these once,
as the controller group's first leader (the cluster id work already knows which node founds the
cluster); every node that applies them gets the same state.
"""

from __future__ import annotations

from collections.abc import Mapping

from raft.controller.commands import Command, CreateTopic, RegisterNode, TopicSettings
from raft.controller.state import DEFAULT_TOPIC, ClusterMetadata


def bootstrap_commands(founders: Mapping[int, str],
                       settings: TopicSettings = TopicSettings(),
                       shards: int = 1) -> list[Command]:
    """The commands that found a cluster of `founders` ({node id: address}), each running
    `shards` shard processes (every node of a cluster runs the same number: docs/SHARDS.md).
    The default topic's partition is on shard 0, with the controller."""
    if not founders:
        raise ValueError("a cluster needs at least one founding node")
    ids = sorted(founders)
    commands: list[Command] = [RegisterNode(n, founders[n], shards) for n in ids]
    commands.append(CreateTopic(DEFAULT_TOPIC, (tuple(ids),), settings))
    return commands


def bootstrap(founders: Mapping[int, str], first_offset: int = 0,
              settings: TopicSettings = TopicSettings()) -> ClusterMetadata:
    """The metadata after the bootstrap commands applied at offsets first_offset, ... (for
    the simulation and tests; a node applies them from its log like any other entry)."""
    meta = ClusterMetadata()
    for i, command in enumerate(bootstrap_commands(founders, settings)):
        result = meta.apply(first_offset + i, command)
        if not result.ok:
            raise ValueError(f"bootstrap refused: {result.reason}")
    return meta
