"""A node's peer links and where every node is: what all of a node's Raft groups share.

- one `PeerLink` per peer (outgoing connection, bounded queues, reconnect with backoff), for the
  messages of all of the node's groups; the node opens and closes them from the union of what
  its groups' configurations name (`sync_members`), and each group queues its messages through
  its own raft.node.outbox.GroupOutbox (`link`);
- the address book: this node's bound address and the peers' addresses (from --peers, from the
  tests' `set_peer_address`, and learned from the configurations in the logs);
- the node-pair failure detector (raft.node.liveness.NodeLiveness, `liveness`), watching the
  peers the links go to; each link pings when it has written nothing for the detector's ping
  interval, so an idle node pair still hears from each other.

The recovery throttle (NodeConfig.recovery_rate) is not here: the core applies it in ticks
(RaftConfig.recovery_rate_bytes_per_tick), so a throttled chunk is never sent rather than queued
here, where later heartbeats overtook it and made the follower look like it had lost it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Mapping
from typing import Any

import trio

from raft.core.messages import Message
from raft.node.config import NodeConfig
from raft.node.identity import ClusterIdentity
from raft.node.liveness import NodeLiveness
from raft.node.peer import PeerLink
from raft.node.tls import NodeTLS
from raft.protocol.raft_frames import BatchEncodings

log = logging.getLogger("raftlog.node")


class PeerTransport:
    def __init__(self, config: NodeConfig, rng: random.Random,
                 tls: Callable[[], NodeTLS | None] = lambda: None) -> None:
        self.node_id = config.node_id
        self._tls = tls  # the node's current TLS material (None: plaintext links)
        self._config = config
        # Shared with the core: each link's own generator is drawn from it when the link opens.
        self._rng = rng
        self.address: str | None = None  # this node's bound address, once it listens
        self.peer_addresses: dict[int, str] = {k: v for k, v in config.peers.items()
                                               if k != self.node_id}
        self.links: dict[int, PeerLink] = {}
        self._encodings = BatchEncodings()  # one encoding per batch for all followers
        self._link_nursery: trio.Nursery | None = None
        self._link_scopes: dict[int, trio.CancelScope] = {}
        # The node's cluster id, which every link's hello carries (raft/node/identity.py).
        self.identity = ClusterIdentity(config.node_id)
        ping_s, down_s = config.liveness_timeouts()
        # One failure detector for the node, watching the peers we keep links to.
        self.liveness = NodeLiveness(config.node_id, ping_s=ping_s, down_s=down_s,
                                     peers=lambda: self.links.keys())

    # -- the address book --------------------------------------------------------------------------
    def set_peer_address(self, peer_id: int, address: str) -> None:
        self.peer_addresses[peer_id] = address
        if peer_id in self.links:
            self.links[peer_id].set_address(address)

    def address_of(self, node_id: int | None) -> str | None:
        if node_id is None:
            return None
        if node_id == self.node_id:
            return self.address
        return self.peer_addresses.get(node_id)

    def link_status(self) -> dict[str, Any]:
        """Per link: its queues and counters, and the detector's view of the peer (`up`)."""
        view = self.liveness.status()
        out = {}
        for k, link in sorted(self.links.items()):
            st = link.status()
            st.update(view.get(str(k), {"up": self.liveness.is_up(k), "silent_s": None}))
            out[str(k)] = st
        return out

    # -- links -------------------------------------------------------------------------------------
    def link(self, node_id: int) -> PeerLink | None:
        """The open link to `node_id` (None: not a peer now)."""
        return self.links.get(node_id)

    def heard_from(self, peer_id: int) -> None:
        """`peer_id` reached us (a handshake or a frame on its link to us): our own link to it
        redials now if it waits out a backoff (raft.node.peer `heard_from_peer`)."""
        link = self.links.get(peer_id)
        if link is not None:
            link.heard_from_peer()

    def start(self, nursery: trio.Nursery, members: Collection[int],
              addresses: Mapping[int, str]) -> None:
        """Run links in `nursery` from now on: one to every peer known now (from --peers, and
        `members` at `addresses`: see sync_members)."""
        self._link_nursery = nursery
        nursery.start_soon(self.liveness.run)
        self.sync_members(members, addresses)
        for peer_id, address in sorted(self.peer_addresses.items()):
            self._open_link(peer_id, address)

    def _open_link(self, peer_id: int, address: str) -> None:
        if peer_id in self.links or self._link_nursery is None or peer_id == self.node_id:
            return
        config = self._config
        link = PeerLink(
            self.node_id, peer_id, address,
            max_frame_bytes=config.max_frame_bytes,
            queue_messages=config.peer_queue_messages,
            queue_bytes=config.peer_queue_bytes,
            backoff_min_s=config.reconnect_min_ms / 1000,
            backoff_max_s=config.reconnect_max_ms / 1000,
            rng=random.Random(self._rng.getrandbits(64)), encodings=self._encodings,
            tls=self._tls, identity=self.identity, ping_s=self.liveness.ping_s,
            boot=self.liveness.boot_id, on_boot=self.liveness.peer_booted,
            on_refused=self.liveness.refused)
        self.links[peer_id] = link
        scope = trio.CancelScope()
        self._link_scopes[peer_id] = scope

        async def run_link() -> None:
            with scope:
                await link.run()

        self._link_nursery.start_soon(run_link)

    def sync_members(self, members: Collection[int], addresses: Mapping[int, str]) -> None:
        """Keep a link to every node in `members` and none to others (a --peers node keeps
        its link): the node calls this with the union of the members of its groups'
        configurations, and the addresses those carry for members added at run time."""
        for node_id, address in addresses.items():
            if node_id != self.node_id and address:
                self.peer_addresses[node_id] = address
                if node_id in self.links:
                    self.links[node_id].set_address(address)
        if self._link_nursery is None:
            return
        members = set(members)
        for node_id in sorted(members):
            address = self.peer_addresses.get(node_id)
            if address and node_id != self.node_id:
                self._open_link(node_id, address)
        for node_id in list(self.links):
            if node_id not in members and node_id not in self._config.peers:
                self._link_scopes.pop(node_id).cancel()
                del self.links[node_id]
                self.peer_addresses.pop(node_id, None)
