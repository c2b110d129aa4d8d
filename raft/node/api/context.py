"""What a client request handler sees of the node, and the shape of a handler.

A handler takes the typed request (raft.protocol parsed it) and returns a typed reply
(raft.protocol.replies); the request id is the connection's business. Handlers get an
`ApiContext`, not the node: the Raft group the request is for (the node keeps one context per
group it runs and routes each request by its `group` field), the node's settings, the address book (where this node and its peers listen, link status) and the error
helper that fills in the leader's address. The context is also the `LoadHost` that
raft.node.load_service expects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from raft.node.config import NodeConfig
from raft.node.errors import advised_error
from raft.node.group import RaftGroup
from raft.node.looplag import LoopLag
from raft.protocol.replies import ErrorReply, Reply
from raft.protocol.requests import Limits
from raft.core.ready import ProduceAnswer
from raft.core.types import Acks, ErrorCode
from storage.batch import Batch


class AddressBook(Protocol):
    """Where the nodes are (raft.node.transport.PeerTransport)."""

    node_id: int
    address: str | None  # this node's bound address
    peer_addresses: dict[int, str]

    def address_of(self, node_id: int | None) -> str | None: ...

    def link_status(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class ApiContext:
    config: NodeConfig
    group: RaftGroup
    peers: AddressBook
    # The node's event-loop lag monitor (one trio loop per node, whatever its groups).
    loop_lag: LoopLag | None = None
    # The node's topics (raft.node.topic_runtime.TopicRuntime: the controller's metadata,
    # routing, per-partition status); None for a context made without a node.
    cluster: Any = None
    # The node's groups for `status`: how many run, how many are quiesced and how many the
    # ticker visits (raft.node.registry.GroupRegistry.status).
    groups: Callable[[], dict[str, Any]] | None = None
    # What bounds a request's fields on this node (raft.protocol parses with it).
    limits: Limits = field(init=False)

    def __post_init__(self) -> None:
        config = self.config
        self.limits = Limits(config.default_timeout_ms, config.max_timeout_ms,
                             config.max_frame_bytes, config.max_fetch_wait_ms)

    @property
    def closing(self) -> bool:
        return self.group.closing

    def error(self, code: ErrorCode, message: str | None = None, **extra: Any) -> ErrorReply:
        """An error reply; NOT_LEADER ones name the leader (id and address) when known."""
        core = self.group.core
        if code == ErrorCode.NOT_LEADER and "leader_id" not in extra and core is not None:
            extra["leader_id"] = core.leader_id
        if code == ErrorCode.NOT_LEADER:
            extra.setdefault("leader_addr", self.peers.address_of(extra.get("leader_id")))
        return advised_error(code, message, **extra)

    # -- LoadHost (raft.node.load_service) ---------------------------------------------------------
    def is_leader(self) -> bool:
        return self.group.is_leader()

    def commit_index(self) -> int:
        return self.group.core.commit_index

    def refuse_not_leader(self) -> ErrorReply:
        """SHUTTING_DOWN while stopping, else NOT_LEADER naming the leader."""
        return self.error(ErrorCode.SHUTTING_DOWN if self.closing else ErrorCode.NOT_LEADER)

    async def propose_and_wait(self, batch: Batch, acks: Acks, timeout_s: float) -> ProduceAnswer:
        return await self.group.propose_and_wait(batch, acks, timeout_s)


# A request type's handler: the typed request in, the typed reply out.
Handler = Callable[[ApiContext, Any], Awaitable[Reply]]
