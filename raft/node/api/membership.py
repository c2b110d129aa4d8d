"""`add_node` / `remove_node`: one configuration change through the log."""

from __future__ import annotations

from raft.node.api.context import ApiContext
from raft.node.config import ConfigError, format_address, parse_address
from raft.protocol.replies import OkReply, Reply
from raft.protocol.requests import AddNode, RemoveNode
from raft.core.types import ErrorCode, Role


async def change_membership(ctx: ApiContext, req: AddNode | RemoveNode) -> Reply:
    """add_node / remove_node: one configuration change through the log. Answered when the
    entry commits (add: the node is a learner now, promoted to voter automatically once it
    has caught up)."""
    core = ctx.group.core
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if core.role != Role.LEADER:
        return ctx.error(ErrorCode.NOT_LEADER)
    if isinstance(req, AddNode):
        try:
            host, port = parse_address(req.address, what="address")
        except ConfigError as e:
            return ctx.error(ErrorCode.BAD_REQUEST, str(e))
        address = format_address(host, port)

        def propose(request_id: int) -> None:
            core.propose_config(request_id, add_learner=req.node_id, address=address)
    else:
        def propose(request_id: int) -> None:
            core.propose_config(request_id, remove=req.node_id)
    _, answer = await ctx.group.call_core(propose, ctx.config.default_timeout_ms / 1000)
    if answer is None:
        return ctx.error(ErrorCode.SHUTTING_DOWN if ctx.closing
                         else ErrorCode.TIMEOUT,
                         "the configuration change did not commit in time; check "
                         "`raftlog status` and retry")
    if answer.error != ErrorCode.OK:
        return ctx.error(answer.error, answer.message or None,
                         leader_id=answer.leader_id)
    cfg = ctx.group.core.config
    return OkReply({"offset": answer.base_offset, "voters": list(cfg.voters),
                    "learners": list(cfg.learners)})


HANDLERS = {
    AddNode.T: change_membership,
    RemoveNode.T: change_membership,
}
