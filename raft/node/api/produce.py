"""`produce`: append one batch through the leader and answer once `acks` is satisfied."""

from __future__ import annotations

import time
from typing import Any

from raft.protocol.fields import get_bytes, get_int, get_str
from raft.protocol.replies import ok_reply
from raft.node.api.context import ApiContext, Request
from raft.node.errors import ERROR_ADVICE
from raft.types import Acks, ErrorCode
from storage.batch import Batch


def parse(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
    w = "produce"
    config = ctx.config
    return {
        "acks": Acks(get_str(frame, "acks", default="quorum",
                                  choices=[a.value for a in Acks], where=w)),
        "timeout_ms": get_int(frame, "timeout_ms", default=config.default_timeout_ms,
                                   minimum=1, maximum=config.max_timeout_ms, where=w),
        "payload": get_bytes(frame, "payload", where=w),
        "count": get_int(frame, "count", minimum=1, maximum=2**31 - 1, where=w),
        "producer_id": get_int(frame, "producer_id", default=0, minimum=0,
                                    maximum=2**63 - 1, where=w),
        "sequence": get_int(frame, "sequence", default=-1, minimum=-1,
                                 maximum=2**63 - 1, where=w),
        "timestamp_ms": get_int(frame, "timestamp_ms", default=int(time.time() * 1000),
                                     minimum=-(2**63), maximum=2**63 - 1, where=w),
    }


async def execute(ctx: ApiContext, req: dict[str, Any], rid: int) -> dict[str, Any]:
    if ctx.closing:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN)
    if ctx.group.disk_full and ctx.group.is_leader():
        return ctx.error(rid, ErrorCode.DISK_FULL)
    if req["producer_id"] and req["sequence"] < 0:
        return ctx.error(rid, ErrorCode.BAD_REQUEST,
                         "an idempotent produce (producer_id != 0) needs sequence >= 0")
    ctx.group.catchup.note_produce(len(req["payload"]), req["count"])
    batch = Batch.create(req["payload"], req["count"], timestamp_ms=req["timestamp_ms"],
                         producer_id=req["producer_id"],
                         sequence=req["sequence"] if req["producer_id"] else -1)
    try:
        answer = await ctx.group.propose_and_wait(batch, req["acks"], req["timeout_ms"] / 1000)
    except ValueError as e:  # the core refused the batch's shape
        return ctx.error(rid, ErrorCode.BAD_REQUEST, str(e))
    if answer.error == ErrorCode.SHUTTING_DOWN and answer.request_id != -1:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN,
                         "this node is shutting down; the write may or may not commit: "
                         "retry on another node (idempotent producers make the retry "
                         "safe)")
    if answer.error == ErrorCode.TIMEOUT:
        return ctx.error(rid, ErrorCode.TIMEOUT,
                         f"no answer within {req['timeout_ms']} ms; "
                         + ERROR_ADVICE[ErrorCode.TIMEOUT])
    if answer.error == ErrorCode.OK:
        return ok_reply(rid, base_offset=answer.base_offset,
                             last_offset=answer.last_offset, duplicate=answer.duplicate)
    message = getattr(answer, "message", "") or None
    if answer.error == ErrorCode.NOT_LEADER:
        return ctx.error(rid, ErrorCode.NOT_LEADER, message, leader_id=answer.leader_id)
    return ctx.error(rid, answer.error, message)


REQUESTS = {"produce": Request(parse, execute)}
