"""`metadata` (any node, from the controller metadata it applied) and the topic admin requests
`topic_create`, `topic_alter`, `topic_delete` (the controller's leader: it places the replicas,
proposes the command and answers once the entry committed and was applied here, with the
verdict its own apply reached). Other nodes answer NOT_LEADER naming the controller's leader.
"""

from __future__ import annotations

from typing import Any

import trio

from raft.controller.commands import (Command, DeleteTopic, MoveReplicas, SetTopicSettings,
                                     TopicSettings)
from raft.controller.state import DEFAULT_TOPIC
from raft.controller.placement import PlacementError, plan_create_topic, plan_grow_topic
from raft.controller.state import ApplyResult, NodeStatus, Refusal, topic_name_error
from raft.node.api.context import ApiContext
from raft.node.topics import metadata_map, topic_map, unknown_topic
from raft.protocol.replies import OkReply, Reply
from raft.protocol.topic_requests import (Metadata, TopicAlter, TopicCreate, TopicDelete,
                                          TopicMove)
from raft.core.types import ErrorCode, Role

_REFUSAL_CODES = {
    Refusal.TOPIC_EXISTS: ErrorCode.TOPIC_EXISTS,
    Refusal.UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC,
    Refusal.UNKNOWN_PARTITION: ErrorCode.UNKNOWN_TOPIC,
}


async def metadata(ctx: ApiContext, req: Metadata) -> Reply:
    cluster = ctx.cluster
    out = metadata_map(cluster.metadata, req.topics, cluster.leader_of, cluster.leader_of(0))
    identity = getattr(ctx.group, "identity", None)
    if identity is not None and identity.cluster_id:
        out["cluster_id"] = identity.cluster_id  # what a link records as its source's id
    return OkReply(out)


async def _not_controller(ctx: ApiContext, timeout_ms: int | None) -> Reply | None:
    """NOT_LEADER unless this node leads the controller; a leader whose bootstrap has not
    applied yet (a cluster just started) waits for it, within the request's timeout."""
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if ctx.group.core.role != Role.LEADER:
        leader = ctx.group.core.leader_id
        return ctx.error(ErrorCode.NOT_LEADER,
                         f"topic requests go to the controller's leader (node {leader}); this "
                         f"node does not lead the controller" if leader is not None else
                         "the controller has no leader right now; retry shortly")
    controller = ctx.cluster.controller
    with trio.move_on_after((timeout_ms or ctx.config.default_timeout_ms) / 1000):
        # The default topic is the bootstrap's last command: every founder is registered by then.
        while DEFAULT_TOPIC not in controller.metadata.topics and not ctx.closing:
            await controller.wait_applied(controller.applied + 1)
    if DEFAULT_TOPIC not in controller.metadata.topics:
        return ctx.error(ErrorCode.TIMEOUT, "the controller has not applied its bootstrap "
                                            "yet (the cluster is starting); retry shortly")
    return None


def _refused(ctx: ApiContext, result: ApplyResult) -> Reply:
    assert result.refusal is not None
    code = _REFUSAL_CODES.get(result.refusal, ErrorCode.BAD_REQUEST)
    extra: dict[str, Any] = {"refusal": result.refusal.value}
    if code is ErrorCode.UNKNOWN_TOPIC:
        extra["topics"] = sorted(ctx.cluster.metadata.topics)
    return ctx.error(code, result.reason, **extra)


async def _propose(ctx: ApiContext, command: Command, timeout_ms: int) -> Reply | None:
    """Propose `command`; None when it was applied ok, else the reply to answer."""
    done = await ctx.cluster.controller.propose(command, timeout_ms / 1000)
    if done.error is not None:
        return ctx.error(done.error, done.message or None)
    assert done.result is not None
    return None if done.result.ok else _refused(ctx, done.result)


def _topic_reply(ctx: ApiContext, name: str) -> Reply:
    cluster = ctx.cluster
    topic = cluster.metadata.topics.get(name)
    if topic is None:  # deleted again meanwhile
        return unknown_topic(cluster.metadata, name)
    return OkReply({"topic": topic_map(topic, cluster.leader_of)})


async def topic_create(ctx: ApiContext, req: TopicCreate) -> Reply:
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    why = topic_name_error(req.name)
    if why is not None:
        return ctx.error(ErrorCode.BAD_REQUEST, why)
    meta = ctx.cluster.metadata
    if req.name in meta.topics:
        return ctx.error(ErrorCode.TOPIC_EXISTS,
                         f"topic {req.name!r} exists; alter it, or delete it first",
                         topic=topic_map(meta.topics[req.name], ctx.cluster.leader_of))
    try:
        command = plan_create_topic(meta, req.name, req.partitions, req.replicas,
                                    TopicSettings(**req.settings()))
    except PlacementError as e:
        return ctx.error(ErrorCode.BAD_REQUEST, str(e))
    refused = await _propose(ctx, command, req.timeout_ms or ctx.config.default_timeout_ms)
    return refused if refused is not None else _topic_reply(ctx, req.name)


async def topic_alter(ctx: ApiContext, req: TopicAlter) -> Reply:
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    meta = ctx.cluster.metadata
    topic = meta.topics.get(req.name)
    if topic is None:
        return unknown_topic(meta, req.name)
    timeout_ms = req.timeout_ms or ctx.config.default_timeout_ms
    if req.partitions is not None and req.partitions != len(topic.partitions):
        try:
            command: Command = plan_grow_topic(meta, req.name, req.partitions)
        except PlacementError as e:
            return ctx.error(ErrorCode.BAD_REQUEST, str(e))
        refused = await _propose(ctx, command, timeout_ms)
        if refused is not None:
            return refused
    if req.settings():
        refused = await _propose(ctx, SetTopicSettings(req.name,
                                                       TopicSettings(**req.settings())),
                                 timeout_ms)
        if refused is not None:
            return refused
    return _topic_reply(ctx, req.name)


async def topic_delete(ctx: ApiContext, req: TopicDelete) -> Reply:
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    refused = await _propose(ctx, DeleteTopic(req.name),
                             req.timeout_ms or ctx.config.default_timeout_ms)
    return refused if refused is not None else OkReply({})


async def topic_move(ctx: ApiContext, req: TopicMove) -> Reply:
    """Propose MoveReplicas: validated here first so the answer names what to fix (the state
    machine checks again, the same way on every node). The partition's leader carries the move
    out afterwards (raft.node.replica_moves); `status` on its nodes shows the progress."""
    refusal = await _not_controller(ctx, req.timeout_ms)
    if refusal is not None:
        return refusal
    meta = ctx.cluster.metadata
    topic = meta.topics.get(req.name)
    if topic is None:
        return unknown_topic(meta, req.name)
    if req.name == DEFAULT_TOPIC:
        return ctx.error(ErrorCode.BAD_REQUEST,
                         f"the topic {DEFAULT_TOPIC!r} keeps a replica on every member node; "
                         f"change members with add-node / remove-node")
    if not 0 <= req.partition < len(topic.partitions):
        return ctx.error(ErrorCode.UNKNOWN_TOPIC,
                         f"topic {req.name!r} has partitions 0..{len(topic.partitions) - 1}, "
                         f"not {req.partition}", partitions=len(topic.partitions))
    p = topic.partitions[req.partition]
    where = f"topic {req.name!r} partition {req.partition}"
    if len(set(req.replicas)) != len(req.replicas):
        return ctx.error(ErrorCode.BAD_REQUEST,
                         f"{where}: replicas {req.replicas} name a node twice; give distinct "
                         f"node ids")
    if len(req.replicas) != len(p.replicas):
        return ctx.error(ErrorCode.BAD_REQUEST,
                         f"{where} has {len(p.replicas)} replicas and a move keeps the count "
                         f"(changing the replication factor is not built yet); give "
                         f"{len(p.replicas)} node ids")
    for n in req.replicas:
        info = meta.nodes.get(n)
        if info is None:
            return ctx.error(ErrorCode.BAD_REQUEST,
                             f"{where}: node {n} is not registered (registered: "
                             f"{sorted(meta.nodes)}); add it to the cluster first")
        if info.status is not NodeStatus.ACTIVE and n not in p.replicas:
            return ctx.error(ErrorCode.BAD_REQUEST,
                             f"{where}: node {n} is decommissioned; place replicas on active "
                             f"nodes ({meta.active_nodes()})")
    previous = list(p.replicas)
    refused = await _propose(ctx, MoveReplicas(req.name, req.partition, tuple(req.replicas)),
                             req.timeout_ms or ctx.config.default_timeout_ms)
    if refused is not None:
        return refused
    reply = _topic_reply(ctx, req.name)
    if isinstance(reply, OkReply):
        reply.fields["previous"] = previous
    return reply


HANDLERS = {
    Metadata.T: metadata,
    TopicCreate.T: topic_create,
    TopicAlter.T: topic_alter,
    TopicDelete.T: topic_delete,
    TopicMove.T: topic_move,
}
