"""The staged-load requests (`load_begin`, `load_stage`, ...): routed to the group's
raft.node.load_service.LoadService, which checks their fields and answers them itself (a bad
field is a BAD_REQUEST reply there, not a hang-up). Which types exist is the service's to say
(`handles`), so this family resolves per request type instead of listing names, and it is
absent when the build has no load service."""

from __future__ import annotations

from raft.node.api.context import ApiContext
from raft.protocol.replies import FrameReply, Reply
from raft.protocol.requests import LoadRequest
from raft.types import ErrorCode


async def execute(ctx: ApiContext, req: LoadRequest) -> Reply:
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    return FrameReply(await ctx.group.loads.handle(ctx, req.fields))


def handles(ctx: ApiContext, t: str) -> bool:
    loads = ctx.group.loads
    return loads is not None and loads.handles(t)
