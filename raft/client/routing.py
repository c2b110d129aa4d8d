"""Where the client sends a request: the leader of what the request is about.

Each request has a *route*: the partition it reads or writes (topic, partition), the controller
(topic admin requests, answered by the controller's leader), or the cluster at large (status,
membership: today's single-leader routing). The router keeps the leader last seen per route and
picks the next address to try:

1. the route's known leader (from a success, or a NOT_LEADER hint);
2. for a partition, the addresses the metadata cache knows: its leader, then its replicas in
   replica order (the first replica is the preferred leader), so a request does not wander
   over nodes that do not hold the partition; for the controller, its leader's address;
3. otherwise the servers the client was given, in a shuffled rotation (today's behaviour, and
   what a cluster without topics gets).

The router never sends anything; raft/client/client.py asks it where to go and tells it what
it learned. Pure bookkeeping, so it is tested without a cluster.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from raft.client.metadata import DEFAULT_TOPIC, MetadataCache
from raft.protocol.requests import type_of

CLUSTER = "cluster"  # status, membership, leadership: the route every request had before topics
CONTROLLER = "controller"  # topic admin requests
ADMIN_TYPES = frozenset({"topic_create", "topic_delete", "topic_alter"})
DEFAULT_PARTITION = (DEFAULT_TOPIC, 0)

Route = str | tuple[str, int]


def route_of(request: Any) -> Route:
    """The route of a typed request (raft.protocol): a partition for the log requests (their
    `topic` and `partition`), the controller for topic admin, else the cluster."""
    if type_of(request) in ADMIN_TYPES:
        return CONTROLLER
    topic = getattr(request, "topic", None)
    if isinstance(topic, str):
        # A staged load names the topic's partition `topic_partition` (its `partition` is
        # Spark's); every other request names it `partition`.
        partition = getattr(request, "topic_partition", None)
        if partition is None:
            partition = getattr(request, "partition", 0)
        return (topic, int(partition or 0))
    return CLUSTER


def is_partition(route: Route) -> bool:
    return isinstance(route, tuple)


class Router:
    """Leaders per route and the rotation of addresses to try (see the module docstring)."""

    def __init__(self, servers: Sequence[str], rng: random.Random,
                 metadata: MetadataCache) -> None:
        self.servers = list(servers)
        self._rng = rng
        self.metadata = metadata
        self._leaders: dict[Route, str] = {}
        self._rotations: dict[Route, list[str]] = {}

    def leader(self, route: Route) -> str | None:
        return self._leaders.get(route)

    def target(self, route: Route) -> str:
        """The next address to try for `route`."""
        known = self._leaders.get(route)
        if known:
            return known
        rotation = self._rotations.get(route)
        if not rotation:
            rotation = self._rotations[route] = self._candidates(route)
        return rotation.pop(0)

    def _candidates(self, route: Route) -> list[str]:
        meta = self.metadata.current
        if meta is not None and is_partition(route):
            assert isinstance(route, tuple)
            addrs = meta.addresses_of(*route)
            if addrs:
                return addrs
        if meta is not None and route == CONTROLLER and meta.controller_address:
            rest = [s for s in self._shuffled() if s != meta.controller_address]
            return [meta.controller_address, *rest]
        return self._shuffled()

    def _shuffled(self) -> list[str]:
        out = list(self.servers)
        self._rng.shuffle(out)
        return out

    def succeeded(self, route: Route, address: str) -> None:
        """`address` answered a leader's request for `route`: it leads it."""
        self._leaders[route] = address
        self._rotations.pop(route, None)

    def redirected(self, route: Route, leader_id: int | None, address: str | None) -> None:
        """NOT_LEADER for `route`, naming its leader (or not: None)."""
        if address:
            self._leaders[route] = address
            if is_partition(route):
                assert isinstance(route, tuple)
                self.metadata.learned_leader(route[0], route[1], leader_id, address)
        else:
            self._leaders.pop(route, None)

    def forget_route(self, route: Route, address: str | None = None) -> None:
        """The route's leader may be gone (a timeout, SHUTTING_DOWN): look for it again. With
        `address`, only if that is the one recorded."""
        if address is None or self._leaders.get(route) == address:
            self._leaders.pop(route, None)

    def forget_address(self, address: str) -> None:
        """The connection to `address` failed: it leads nothing we know of any more."""
        for route in [r for r, a in self._leaders.items() if a == address]:
            del self._leaders[route]

    def metadata_changed(self) -> None:
        """A fresh metadata answer: the partitions' leaders and rotations come from it now
        (the cluster-wide route keeps its leader until a request says otherwise)."""
        self._rotations.clear()
        for route in [r for r in self._leaders if is_partition(r) or r == CONTROLLER]:
            del self._leaders[route]


__all__ = ["ADMIN_TYPES", "CLUSTER", "CONTROLLER", "DEFAULT_PARTITION", "Route", "Router",
           "is_partition", "route_of"]
