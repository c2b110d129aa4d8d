"""`produce`: append one batch through the leader and answer once `acks` is satisfied.

`execute` runs in a task of its own and waits; `start` (the client request loop's path for a
plain connection, issue 28) proposes and hands the reply to a callback when the answer comes.
Both check the request the same way (`admit`) and word the answer the same way (`reply_for`).
"""

from __future__ import annotations

import logging
from typing import Callable

from raft.node.api.context import ApiContext
from raft.node.errors import ERROR_ADVICE
from raft.node.mirror_reads import answer_offsets
from raft.node.topic_settings import record_over
from raft.protocol.replies import ErrorReply, ProduceOk, Reply
from raft.protocol.requests import Produce
from raft.core.ready import ProduceAnswer
from raft.core.types import ErrorCode
from storage.batch import Batch
from storage.records import MalformedRecords, check_records

log = logging.getLogger("raftlog.node")


async def execute(ctx: ApiContext, req: Produce) -> Reply:
    admitted = admit(ctx, req)
    if not isinstance(admitted, Batch):
        return admitted
    try:
        answer = await ctx.group.propose_and_wait(admitted, req.acks, req.timeout_ms / 1000)
    except ValueError as e:  # the core refused the batch's shape
        return ctx.error(ErrorCode.BAD_REQUEST, str(e))
    return reply_for(ctx, req, answer)


def start(ctx: ApiContext, req: Produce, done: Callable[[Reply], None]) -> None:
    """`execute` without a task: `done` gets the reply, now (a refusal) or from the group's
    Ready loop, timer or shutdown (raft.node.propose_then). It is called once and must not
    raise; a failure to word the reply answers INTERNAL, never reaching the Ready loop."""
    admitted = admit(ctx, req)
    if not isinstance(admitted, Batch):
        return done(admitted)

    def answered(answer: ProduceAnswer) -> None:
        try:
            reply = reply_for(ctx, req, answer)
        except Exception as e:
            log.exception("request_failed produce answer=%s", answer)
            reply = ErrorReply(ErrorCode.INTERNAL, f"internal error: {type(e).__name__}: {e}")
        done(reply)

    try:
        ctx.group.propose_then(admitted, req.acks, req.timeout_ms / 1000, answered)
    except ValueError as e:  # the core refused the batch's shape
        done(ctx.error(ErrorCode.BAD_REQUEST, str(e)))


def admit(ctx: ApiContext, req: Produce) -> Reply | Batch:
    """The batch to propose, or the refusal to answer instead."""
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if ctx.group.disk_full and ctx.group.is_leader():
        return ctx.error(ErrorCode.DISK_FULL)
    if ctx.group.write_refusal is not None:  # a mirror a link still feeds (docs/REPLICATION.md)
        return ctx.error(ErrorCode.MIRROR_READ_ONLY, ctx.group.write_refusal)
    if req.producer_id and req.sequence < 0:
        return ctx.error(ErrorCode.BAD_REQUEST,
                         "an idempotent produce (producer_id != 0) needs sequence >= 0")
    try:  # the one record rule (storage/records.py): nothing malformed reaches the log
        check_records(req.payload, req.count)
    except MalformedRecords as e:
        return ctx.error(ErrorCode.BAD_REQUEST, str(e))
    # The topic's record size limit now (raft.node.topic_settings: an alter applies at once).
    settings = ctx.group.settings_of() if ctx.group.settings_of is not None else None
    limit = None if settings is None else settings.max_record_bytes
    if limit is not None:
        over = record_over(req.payload, limit)
        topic = settings.topic or req.topic
        if over is not None:
            return ctx.error(ErrorCode.TOO_LARGE,
                             f"record {over[0]} of the batch takes {over[1]} bytes; topic "
                             f"{topic!r} accepts records of at most {limit} bytes "
                             f"(max_record_bytes); split the value, or raise the limit with "
                             f"`raftlog topic alter {topic} --max-record-bytes N`",
                             max_record_bytes=limit, topic=topic)
    ctx.group.catchup.note_produce(len(req.payload), req.count)
    return Batch.create(req.payload, req.count, timestamp_ms=req.timestamp_ms,
                         producer_id=req.producer_id,
                         sequence=req.sequence if req.producer_id else -1)


def reply_for(ctx: ApiContext, req: Produce, answer: ProduceAnswer) -> Reply:
    """The reply to a produce the core answered (or that timed out, or met a shutdown)."""
    if answer.error == ErrorCode.SHUTTING_DOWN and answer.request_id != -1:
        return ctx.error(ErrorCode.SHUTTING_DOWN,
                         "this node is shutting down; the write may or may not commit: "
                         "retry on another node (idempotent producers make the retry "
                         "safe)")
    if answer.error == ErrorCode.TIMEOUT:
        return ctx.error(ErrorCode.TIMEOUT,
                         f"no answer within {req.timeout_ms} ms; "
                         + ERROR_ADVICE[ErrorCode.TIMEOUT])
    if answer.error == ErrorCode.OK:
        if ctx.group.translated:  # the leader placed it as MIRRORED: its visible offsets
            return ProduceOk(*answer_offsets(ctx.group, answer.base_offset,
                                             answer.last_offset), answer.duplicate)
        return ProduceOk(answer.base_offset, answer.last_offset, answer.duplicate)
    message = answer.message or None
    if answer.error == ErrorCode.NOT_LEADER:
        return ctx.error(ErrorCode.NOT_LEADER, message, leader_id=answer.leader_id)
    return ctx.error(answer.error, message)


HANDLERS = {Produce.T: execute}
