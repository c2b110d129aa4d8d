"""The staged-load requests (`load_begin`, `load_stage`, ...): typed by
raft.protocol.load_requests and answered by the group's raft.node.load_service.LoadService
(a bad field is a BAD_REQUEST reply there, after its leader check, not a hang-up). Which types
exist is the service's to say (`handles`), so this family resolves per request type instead of
listing names, and it is absent when the build has no load service."""

from __future__ import annotations

from raft.node.api.context import ApiContext
from raft.protocol.load_requests import LoadRequest
from raft.protocol.replies import Reply
from raft.core.types import ErrorCode

# Staged batches are hidden by log offset and published as plain records at their log offsets;
# a translated group shows only MIRRORED batches at visible offsets (docs/REPLICATION.md).
MIRROR_LOADS = ("Spark loads into a mirror topic (or one promoted from a mirror) are not "
                "supported yet; load into a plain topic (docs/REPLICATION.md)")


async def execute(ctx: ApiContext, req: LoadRequest) -> Reply:
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if ctx.group.translated:
        return ctx.error(ErrorCode.BAD_REQUEST, MIRROR_LOADS)
    return await ctx.group.loads.handle(ctx, req)


def handles(ctx: ApiContext, t: str) -> bool:
    loads = ctx.group.loads
    return loads is not None and loads.handles(t)
