"""`produce`: append one batch through the leader and answer once `acks` is satisfied."""

from __future__ import annotations

from raft.node.api.context import ApiContext
from raft.node.errors import ERROR_ADVICE
from raft.node.mirror_reads import answer_offsets
from raft.node.topic_settings import record_over
from raft.protocol.replies import ProduceOk, Reply
from raft.protocol.requests import Produce
from raft.core.types import ErrorCode
from storage.batch import Batch
from storage.records import MalformedRecords, check_records


async def execute(ctx: ApiContext, req: Produce) -> Reply:
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
    batch = Batch.create(req.payload, req.count, timestamp_ms=req.timestamp_ms,
                         producer_id=req.producer_id,
                         sequence=req.sequence if req.producer_id else -1)
    try:
        answer = await ctx.group.propose_and_wait(batch, req.acks, req.timeout_ms / 1000)
    except ValueError as e:  # the core refused the batch's shape
        return ctx.error(ErrorCode.BAD_REQUEST, str(e))
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
