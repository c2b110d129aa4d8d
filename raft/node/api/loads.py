"""The staged-load requests (`load_begin`, `load_stage`, ...): routed to the group's
raft.node.load_service.LoadService, which parses and answers them itself. Which types exist is
the service's to say (`handles`), so this family resolves per request type instead of listing
names, and it is absent when the build has no load service."""

from __future__ import annotations

from typing import Any

from raft.node.api.context import ApiContext, Request
from raft.types import ErrorCode


def parse(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
    return frame  # the load service reads its own fields


async def execute(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
    if ctx.closing:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN)
    return await ctx.group.loads.handle(ctx, frame)


LOAD_REQUEST = Request(parse, execute)


def resolve(ctx: ApiContext, t: str) -> Request | None:
    loads = ctx.group.loads
    if loads is not None and loads.handles(t):
        return LOAD_REQUEST
    return None
