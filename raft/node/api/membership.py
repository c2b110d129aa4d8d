"""`add_node` / `remove_node`: one configuration change through the log."""

from __future__ import annotations

from typing import Any

from raft.protocol.fields import get_int, get_str
from raft.protocol.replies import ok_reply
from raft.node.api.context import ApiContext, Request
from raft.node.config import ConfigError, format_address, parse_address
from raft.types import ErrorCode, Role


def parse_add_node(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
    address = get_str(frame, "address", where="add_node")
    return {"op": "add", "node_id": get_int(frame, "node_id", minimum=1,
                                                 where="add_node"),
            "address": address}


def parse_remove_node(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
    return {"op": "remove", "node_id": get_int(frame, "node_id", minimum=1,
                                                    where="remove_node")}


async def change_membership(ctx: ApiContext, req: dict[str, Any], rid: int) -> dict[str, Any]:
    """add_node / remove_node: one configuration change through the log. Answered when the
    entry commits (add: the node is a learner now, promoted to voter automatically once it
    has caught up)."""
    core = ctx.group.core
    if ctx.closing:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN)
    if not hasattr(core, "propose_config"):
        return ctx.error(rid, ErrorCode.BAD_REQUEST,
                         "this core does not support membership changes")
    if core.role != Role.LEADER:
        return ctx.error(rid, ErrorCode.NOT_LEADER)
    if req["op"] == "add":
        try:
            host, port = parse_address(req["address"], what="address")
        except ConfigError as e:
            return ctx.error(rid, ErrorCode.BAD_REQUEST, str(e))
        address = format_address(host, port)

        def propose(request_id: int) -> None:
            core.propose_config(request_id, add_learner=req["node_id"], address=address)
    else:
        def propose(request_id: int) -> None:
            core.propose_config(request_id, remove=req["node_id"])
    _, answer = await ctx.group.call_core(propose, ctx.config.default_timeout_ms / 1000)
    if answer is None:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN if ctx.closing
                         else ErrorCode.TIMEOUT,
                         "the configuration change did not commit in time; check "
                         "`raftlog status` and retry")
    if answer.error != ErrorCode.OK:
        return ctx.error(rid, answer.error, answer.message or None,
                         leader_id=answer.leader_id)
    cfg = ctx.group.core.config
    return ok_reply(rid, offset=answer.base_offset, voters=list(cfg.voters),
                         learners=list(cfg.learners))


REQUESTS = {
    "add_node": Request(parse_add_node, change_membership),
    "remove_node": Request(parse_remove_node, change_membership),
}
