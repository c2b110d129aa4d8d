"""`status` (the node's view of the group, its peers and links, followers' catch-up) and
`transfer_leader` (hand leadership to a peer and wait until it moved)."""

from __future__ import annotations

import dataclasses
from typing import Any

import trio

from raft.node.api.context import ApiContext
from raft.protocol.replies import OkReply, Reply
from raft.protocol.requests import Status, TransferLeader
from raft.core.ready import Status as CoreStatus
from raft.core.types import ErrorCode, Role


def status_to_wire(status: CoreStatus) -> dict[str, Any]:
    """raft.core.ready.Status -> plain msgpack map (role as its string value)."""
    out = dataclasses.asdict(status)
    out["role"] = status.role.value
    return out


async def status(ctx: ApiContext, _req: Status) -> Reply:
    return OkReply({"status": status_map(ctx)})


def status_map(ctx: ApiContext) -> dict[str, Any]:
    """The node's status as `status` answers it (and as /metrics exports it)."""
    core, peers = ctx.group.core, ctx.peers
    st = status_to_wire(core.status())
    ctx.group.catchup.recovery_view(st.get("followers") or [])
    st["addresses"] = {str(k): v for k, v in sorted(core.config.addresses.items())}
    st["address"] = peers.address
    # String keys: msgpack maps with int keys trip strict decoders and are not JSON.
    st["peers"] = {str(k): v for k, v in sorted(
        {**peers.peer_addresses, peers.node_id: peers.address}.items())}
    st["leader_addr"] = peers.address_of(core.leader_id)
    st["links"] = peers.link_status()
    # Which cluster this node's data belongs to, and peers refused at connect (another
    # cluster's, or this node not a member): raft/node/identity.py.
    st.update(ctx.group.identity.status())
    if ctx.groups is not None:  # the node's groups: how many are quiesced, how many awake
        st["groups"] = ctx.groups()
    if ctx.loop_lag is not None:  # the node's, whatever the group
        st["loop_lag"] = ctx.loop_lag.snapshot().to_dict()
    if ctx.group.retention is not None:
        # Log start, bytes retained, what holds retention back and what a valve skipped.
        st["retention"] = ctx.group.retention.report()
    # Disk loss and corruption (docs/DISK-LOSS.md): what the open repaired, the scrubber.
    st["open_findings"] = list(ctx.group.log.open_findings)
    st["scrub"] = ctx.group.scrubber.status()
    if ctx.group.subs is not None:
        # Subscriptions (docs/SUBSCRIPTIONS.md): how many, how far the table applied the log.
        st["subscriptions"] = ctx.group.subs.status()
    if ctx.cluster is not None:
        # Issue 26: a line per group this node runs (`partitions`) and the controller's state.
        st.update(ctx.cluster.status())
    return st


async def transfer_leader(ctx: ApiContext, req: TransferLeader) -> Reply:
    group, peer_addresses = ctx.group, ctx.peers.peer_addresses
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if group.core.role != Role.LEADER:
        return ctx.error(ErrorCode.NOT_LEADER)
    to = req.to
    if to is not None and to not in peer_addresses:
        return ctx.error(ErrorCode.BAD_REQUEST,
                         f"node {to} is not a peer; pick one of "
                         f"{sorted(peer_addresses)}")
    try:
        group.core.transfer_leadership(to)
    except ValueError as e:
        return ctx.error(ErrorCode.BAD_REQUEST, str(e))
    group.kick()
    with trio.move_on_after(req.timeout_ms / 1000):
        while group.core.role == Role.LEADER and not ctx.closing:
            await group.wait_state_change()
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if group.core.role == Role.LEADER:
        return ctx.error(ErrorCode.TIMEOUT,
                         f"leadership did not move within {req.timeout_ms} ms; the "
                         f"target may be lagging: retry later")
    return OkReply({"leader_id": group.core.leader_id,
                    "leader_addr": ctx.peers.address_of(group.core.leader_id)})


HANDLERS = {
    Status.T: status,
    TransferLeader.T: transfer_leader,
}
