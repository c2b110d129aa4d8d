"""The link requests (issue 30, raft/protocol/link_requests.py): the admin ones are the
controller leader's (it places the mirror topics' replicas, proposes the command and answers
with the verdict its own apply reached), `link_list` and `link_status` any node's.
"""

from __future__ import annotations

import time
from typing import Any

from raft.controller.commands import Command
from raft.controller.link_commands import (CreateLink, DeleteLink, LinkEvent, MirrorTopic,
                                           PauseLink, PromoteTopic, ResumeLink)
from raft.controller.links import link_name_error
from raft.controller.placement import PlacementError, plan_create_topic
from raft.controller.state import topic_name_error
from raft.core.types import ErrorCode
from raft.node.api.context import ApiContext
from raft.node.api.topics import _not_controller, _propose, _topic_reply
from raft.protocol.link_requests import (LinkAlter, LinkCreate, LinkEventRequest, LinkList,
                                         LinkStatus, TopicPromote)
from raft.protocol.replies import OkReply, Reply

_OPS: dict[str, Any] = {"pause": PauseLink, "resume": ResumeLink, "delete": DeleteLink}


def _timeout(ctx: ApiContext, timeout_ms: int | None) -> int:
    return timeout_ms or ctx.config.default_timeout_ms


def _link_reply(ctx: ApiContext, name: str) -> Reply:
    link = ctx.cluster.metadata.links.get(name)
    return OkReply({"link": link.describe() if link is not None else {"name": name}})


async def link_create(ctx: ApiContext, req: LinkCreate) -> Reply:
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    why = link_name_error(req.name)
    if why is not None:
        return ctx.error(ErrorCode.BAD_REQUEST, why)
    meta = ctx.cluster.metadata
    if req.name in meta.links:
        return ctx.error(ErrorCode.BAD_REQUEST, f"link {req.name!r} exists; `raftlog link "
                                                f"describe {req.name}` shows it, `raftlog "
                                                f"link delete {req.name}` removes it",
                         refusal="link_exists")
    mirrors = []
    for source, name, partitions in req.mirrors:
        why = topic_name_error(name)
        if why is not None:
            return ctx.error(ErrorCode.BAD_REQUEST, f"mirror of {source!r}: {why}")
        try:
            planned = plan_create_topic(meta, name, partitions, req.replicas)
        except PlacementError as e:
            return ctx.error(ErrorCode.BAD_REQUEST, f"mirror topic {name!r}: {e}")
        mirrors.append(MirrorTopic(source, name, planned.replicas))
    command = CreateLink(req.name, tuple(req.source_servers), req.source_cluster_id,
                         tuple(mirrors), req.tls_ca_pem, req.token, int(time.time() * 1000))
    refused = await _propose(ctx, command, _timeout(ctx, req.timeout_ms))
    return refused if refused is not None else _link_reply(ctx, req.name)


async def link_alter(ctx: ApiContext, req: LinkAlter) -> Reply:
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    command: Command = _OPS[req.op](req.name)
    refused = await _propose(ctx, command, _timeout(ctx, req.timeout_ms))
    return refused if refused is not None else _link_reply(ctx, req.name)


async def topic_promote(ctx: ApiContext, req: TopicPromote) -> Reply:
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    refused = await _propose(ctx, PromoteTopic(req.name), _timeout(ctx, req.timeout_ms))
    return refused if refused is not None else _topic_reply(ctx, req.name)


async def link_event(ctx: ApiContext, req: LinkEventRequest) -> Reply:
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    refused = await _propose(ctx, LinkEvent(req.link, req.topic, req.partition, req.gap_from,
                                            req.gap_to), _timeout(ctx, req.timeout_ms))
    return refused if refused is not None else OkReply({})


async def link_list(ctx: ApiContext, req: LinkList) -> Reply:
    meta = ctx.cluster.metadata
    identity = getattr(ctx.group, "identity", None)
    mirrors = [{"topic": t.name, "link": t.origin.link, "source_topic": t.origin.source_topic,
                "mirror_active": t.mirror_active, "partitions": len(t.partitions)}
               for t in sorted(meta.topics.values(), key=lambda t: t.name)
               if t.origin is not None]
    return OkReply({"links": [link.describe() for _, link in sorted(meta.links.items())],
                    "mirrors": mirrors,
                    "cluster_id": identity.cluster_id if identity is not None else None})


async def link_status(ctx: ApiContext, req: LinkStatus) -> Reply:
    runtime = getattr(ctx.cluster, "links", None)
    partitions = runtime.status() if runtime is not None else []
    return OkReply({"node_id": ctx.config.node_id, "partitions": partitions})


HANDLERS = {
    LinkCreate.T: link_create,
    LinkAlter.T: link_alter,
    TopicPromote.T: topic_promote,
    LinkEventRequest.T: link_event,
    LinkList.T: link_list,
    LinkStatus.T: link_status,
}
