"""Subscriptions: named consumer positions committed through the log (raft/core/subscription_table.py).
In a translated group (a mirror partition) every position, bound and lag is in visible offsets.

`sub_open`, `sub_commit`, `sub_reset`, `sub_pin`, `sub_release` and `sub_delete` become one
operation each in the leader's accumulator (raft/node/subscription_service.py) and are answered
when the entry carrying them commits, with the verdict the table reached applying it. `sub_get`
and `sub_list` read the table after a barrier through the log, so a new leader never shows a
position older than one it acknowledged. All are served by the leader (NOT_LEADER elsewhere).

`sub_commit_many` carries many subscriptions' commits in one frame (Kafka's OffsetCommit with
many partitions): a client whose consumers share it sends their commits together
(raft/client/commits.py), so the leader decodes, schedules and answers one request instead of
one per commit. Each item is its own operation in the accumulator and gets its own verdict: one
refused item does not fail the others. At most MAX_COMMIT_ITEMS items per request.

Field types are checked by the protocol (raft/protocol/subscription_requests.py: a wrong type
hangs up, as for every request); a name of the wrong shape, a position out of range or an
unknown subscription are typed error replies here (for `sub_commit_many`, typed error results
of the item).
"""

from __future__ import annotations

import time
from typing import Any

import trio

from raft.node.api.context import ApiContext
from raft.node.api.fetch import visible_hw, visible_start
from raft.protocol.replies import ErrorReply, OkReply, Reply
from raft.protocol.subscription_requests import (MAX_COMMIT_ITEMS, SUB_TYPES, SubCommitMany,
                                                 SubList, SubRequest)
from raft.core.subscription_table import Op, OpRequest, Outcome, consumer_error, name_error
from raft.core.types import ErrorCode
from storage.api import OffsetOutOfRange

# How long a commit past the high watermark waits for it to move (a leader just elected learns
# what is committed with the first entry of its term); then it is refused.
HW_WAIT_S = 2.0

# The operation each single-subscription request type asks of the table (sub_get: none).
_OPS: dict[str, Op | None] = {"sub_open": Op.OPEN, "sub_commit": Op.COMMIT,
                              "sub_reset": Op.RESET, "sub_pin": Op.PIN,
                              "sub_release": Op.RELEASE, "sub_delete": Op.DELETE,
                              "sub_get": None}


# -- executing -----------------------------------------------------------------------------------
def _refuse(ctx: ApiContext, name: str, consumer: str) -> ErrorReply | None:
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if ctx.group.subs is None:
        return ctx.error(ErrorCode.BAD_REQUEST, "this node has no subscription service")
    why = name_error(name)
    if why is not None:
        return ctx.error(ErrorCode.INVALID_SUBSCRIPTION_NAME, why, name=name)
    why = consumer_error(consumer)
    if why is not None:
        return ctx.error(ErrorCode.BAD_REQUEST, why)
    return None


def _reply(ctx: ApiContext, outcome: Outcome) -> Reply:
    if outcome.ok:
        return OkReply({"subscription": outcome.sub})
    extra: dict[str, Any] = {}
    if outcome.sub is not None:
        extra = {"subscription": outcome.sub, "position": outcome.sub["position"],
                 "lease_holder": outcome.sub.get("lease_holder"),
                 "lease_until_ms": outcome.sub.get("lease_until_ms")}
    return ctx.error(outcome.code, outcome.message or None, **extra)


async def _hw_reaching(ctx: ApiContext, want: int, timeout_s: float) -> int:
    """The visible high watermark, once it reaches `want` or `timeout_s` (capped at
    HW_WAIT_S) has passed. Why wait: a consumer commits what it read from the last leader, and a
    leader just elected (every node restarted, say) knows nothing committed until an entry of
    its own term commits, nor do its indexes until they caught up: refusing then would fail a
    consumer for a position that is about to be below the watermark (a fetch long-polls the
    same way)."""
    group = ctx.group
    with trio.move_on_after(min(timeout_s, HW_WAIT_S)):
        while True:
            if group.loads is not None:
                await group.loads.catch_up(group.core.high_watermark)
            hw = visible_hw(group)
            if hw >= want or not group.is_leader() or _committed_in_term(group):
                return hw  # (a leader that committed in its term knows the watermark)
            await group.wait_hw_change()
    return visible_hw(group)


def _committed_in_term(group: Any) -> bool:
    core = group.core
    try:
        return core.log.term_at(core.commit_index) == core.term
    except OffsetOutOfRange:
        return False


def _resolve(ctx: ApiContext, where: Any, what: str) -> tuple[int | None, ErrorReply | None]:
    """"start"/"end"/offset -> an offset in [log start, high watermark + 1], or an error."""
    hw = visible_hw(ctx.group)
    start = visible_start(ctx.group)
    if where == "start":
        return start, None
    if where == "end":
        return hw + 1, None
    if where > hw + 1:
        return None, ctx.error(ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                               f"{what} {where} is past high watermark + 1 ({hw + 1})",
                               high_watermark=hw, start_offset=start)
    if where < start:
        return None, ctx.error(ErrorCode.OFFSET_OUT_OF_RANGE,
                               f"{what} {where} is below the log start {start} (removed by "
                               f"retention); use {start} or 'start'",
                               high_watermark=hw, start_offset=start)
    return where, None


async def execute_op(ctx: ApiContext, req: SubRequest) -> Reply:
    refused = _refuse(ctx, req.name, req.consumer)
    if refused is not None:
        return refused
    op = _OPS[req.t]
    assert op is not None
    if not ctx.group.is_leader():
        return ctx.refuse_not_leader()
    position, arg = -1, req.lease_ms
    if op == Op.COMMIT:
        assert req.position is not None
        position = req.position
        hw = await _hw_reaching(ctx, position - 1, req.timeout_ms / 1000)
        if not ctx.group.is_leader():
            return ctx.refuse_not_leader()
        if position > hw + 1:
            return ctx.error(ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                             f"position {position} is past high watermark + 1 ({hw + 1}): "
                             f"commit the offset after the last record processed",
                             high_watermark=hw)
    elif op in (Op.OPEN, Op.RESET, Op.PIN):
        position, error = _resolve(ctx, req.initial,
                                   "reset position" if op == Op.RESET else "initial position")
        if error is not None:
            return error
        if op == Op.PIN:
            # The pin's end is the high watermark now; the initial position applies only if
            # the subscription does not exist yet.
            position, arg = visible_hw(ctx.group) + 1, position
    elif op == Op.DELETE:
        arg = -1  # unconditional (expiry's deletes are the service's own)
    outcome = await ctx.group.subs.submit(
        OpRequest(op, req.name, req.consumer, position, arg,
                  req.auto_reset if op == Op.OPEN else "",
                  req.expect if op == Op.RESET else -1,
                  req.member if op in (Op.OPEN, Op.RELEASE) else ""),
        req.timeout_ms / 1000)
    if op == Op.DELETE and outcome.ok:
        return OkReply({"deleted": True})
    return _reply(ctx, outcome)


async def execute_commit_many(ctx: ApiContext, req: SubCommitMany) -> Reply:
    """One result per item, in order: {"ok": true, "subscription": ...} or {"ok": false,
    "error": {...}} with the same codes and fields as sub_commit's error replies. Checks that
    concern the whole request (the item count, leadership, shutdown) answer the request."""
    if req.items is None:
        return ctx.error(ErrorCode.BAD_REQUEST,
                         f"sub_commit_many carries 1 to {MAX_COMMIT_ITEMS} commits, got "
                         f"{req.count}: split them into several requests",
                         max_items=MAX_COMMIT_ITEMS, count=req.count)
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    if ctx.group.subs is None:
        return ctx.error(ErrorCode.BAD_REQUEST, "this node has no subscription service")
    if not ctx.group.is_leader():
        return ctx.refuse_not_leader()
    hw = await _hw_reaching(ctx, max(item.position for item in req.items) - 1,
                            req.timeout_ms / 1000)
    if not ctx.group.is_leader():
        return ctx.refuse_not_leader()
    results: list[dict[str, Any] | None] = [None] * len(req.items)
    ops: list[OpRequest] = []
    slots: list[int] = []
    for i, item in enumerate(req.items):
        refused = _refuse(ctx, item.name, item.consumer)
        if refused is None and item.position > hw + 1:
            refused = ctx.error(ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                                f"position {item.position} is past high watermark + 1 "
                                f"({hw + 1}): commit the offset after the last record "
                                f"processed", high_watermark=hw)
        if refused is not None:
            results[i] = _result(refused)
            continue
        ops.append(OpRequest(Op.COMMIT, item.name, item.consumer, item.position,
                             item.lease_ms))
        slots.append(i)
    if ops:
        outcomes = await ctx.group.subs.submit_many(ops, req.timeout_ms / 1000)
        for i, outcome in zip(slots, outcomes, strict=True):
            results[i] = _result(_reply(ctx, outcome))
    return OkReply({"results": results})


def _result(reply: Reply) -> dict[str, Any]:
    """One item's result from the reply a lone sub_commit would have had."""
    if isinstance(reply, ErrorReply):
        return {"ok": False, "error": reply.error()}
    assert isinstance(reply, OkReply)
    return {"ok": True, "subscription": reply.fields["subscription"]}


async def execute_get(ctx: ApiContext, req: SubRequest) -> Reply:
    refused = _refuse(ctx, req.name, req.consumer)
    if refused is not None:
        return refused
    subs = ctx.group.subs
    outcome = await subs.sync(req.timeout_ms / 1000)
    if not outcome.ok:
        return _reply(ctx, outcome)
    sub = subs.table.describe(req.name)
    if sub is None:
        return ctx.error(ErrorCode.UNKNOWN_SUBSCRIPTION,
                         f"no subscription named {req.name!r}; a consumer creates it on "
                         f"first use (or `raftlog subscriptions reset NAME --to start`)",
                         name=req.name)
    hw = visible_hw(ctx.group)
    return OkReply({"subscription": subs.view(sub, hw, _now_ms()), "high_watermark": hw})


async def execute_list(ctx: ApiContext, req: SubList) -> Reply:
    if ctx.closing:
        return ctx.error(ErrorCode.SHUTTING_DOWN)
    subs = ctx.group.subs
    if subs is None:
        return ctx.error(ErrorCode.BAD_REQUEST, "this node has no subscription service")
    outcome = await subs.sync(req.timeout_ms / 1000)
    if not outcome.ok:
        return _reply(ctx, outcome)
    hw = visible_hw(ctx.group)
    now = _now_ms()
    names = sorted(n for n in subs.table.subs
                   if n.startswith(req.prefix) and n > req.after)
    page = names[:req.limit]
    return OkReply({"high_watermark": hw, "start_offset": visible_start(ctx.group),
                    "more": len(names) > len(page), "total": len(subs.table.subs),
                    "service": subs.status(),
                    "subscriptions": [subs.view(subs.table.describe(n), hw, now)
                                      for n in page]})


def _now_ms() -> int:
    return int(time.time() * 1000)


HANDLERS = {
    **{t: execute_op for t in SUB_TYPES if _OPS[t] is not None},
    "sub_get": execute_get,
    SubCommitMany.T: execute_commit_many,
    SubList.T: execute_list,
}
