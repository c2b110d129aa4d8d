"""Subscriptions: named consumer positions committed through the log (raft/subscriptions.py).

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

Field types are checked in `parse` (a wrong type hangs up, as for every request); a name of the
wrong shape, a position out of range or an unknown subscription are typed error replies (for
`sub_commit_many`, typed error results of the item).
"""

from __future__ import annotations

import time
from typing import Any

from raft.protocol.fields import get_int, get_str
from raft.protocol.framing import WireError
from raft.protocol.replies import ok_reply
from raft.node.api.context import ApiContext, Request
from raft.node.api.fetch import visible_hw
from raft.subscriptions import MAX_LEASE_MS, Op, OpRequest, Outcome, consumer_error, name_error
from raft.types import ErrorCode

LIST_DEFAULT_LIMIT = 1000
LIST_MAX_LIMIT = 10_000
# Items per sub_commit_many: half the accumulator's operations per entry (2048), so one request
# never needs more than one entry's room, and a reply stays far below the frame limit (a
# subscription map is a few hundred bytes).
MAX_COMMIT_ITEMS = 1000


# -- parsing -------------------------------------------------------------------------------------
def _name(frame: dict[str, Any], where: str) -> str:
    return get_str(frame, "name", where=where)


def _where(frame: dict[str, Any], key: str, where: str, default: Any) -> Any:
    """A position given as "start", "end" or an offset (int)."""
    value = frame.get(key, default)
    if isinstance(value, str) and value in ("start", "end"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    raise WireError(f'{where} field "{key}" must be "start", "end" or an offset >= 0, '
                         f'got {value!r}')


def _timeout(ctx: ApiContext, frame: dict[str, Any], where: str) -> int:
    return get_int(frame, "timeout_ms", default=ctx.config.default_timeout_ms, minimum=1,
                        maximum=ctx.config.max_timeout_ms, where=where)


def _parser(op: Op | None, *, consumer: bool = False, position: bool = False,
            lease: bool = False, initial: str | None = None):  # noqa: ANN202
    where = f"sub_{op.value}" if op is not None else "sub_get"

    def parse(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
        req: dict[str, Any] = {"op": op, "name": _name(frame, where),
                               "timeout_ms": _timeout(ctx, frame, where)}
        req["consumer"] = get_str(frame, "consumer", default="", where=where) \
            if consumer else ""
        if position:
            req["position"] = get_int(frame, "position", minimum=0, maximum=2**63 - 1,
                                           where=where)
        if initial is not None:
            # `from` (first use) defaults to the log start; a reset's `to` is required.
            req["initial"] = _where(frame, initial, where, "start" if initial == "from" else None)
        req["lease_ms"] = get_int(frame, "lease_ms", default=0, minimum=0,
                                       maximum=MAX_LEASE_MS, where=where) if lease else 0
        return req

    return parse


def parse_list(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
    w = "sub_list"
    return {"prefix": get_str(frame, "prefix", default="", where=w),
            "after": get_str(frame, "after", default="", where=w),
            "limit": get_int(frame, "limit", default=LIST_DEFAULT_LIMIT, minimum=1,
                                  maximum=LIST_MAX_LIMIT, where=w),
            "timeout_ms": _timeout(ctx, frame, w)}


def parse_commit_many(ctx: ApiContext, frame: dict[str, Any], rid: int) -> dict[str, Any]:
    """`commits`: a list of maps {name, position, consumer (""), lease_ms (0)}, each checked as
    a sub_commit's fields. A count outside 1..MAX_COMMIT_ITEMS is answered BAD_REQUEST by
    execute (the connection stays usable), without looking at the items."""
    w = "sub_commit_many"
    items = frame.get("commits")
    if not isinstance(items, list):
        raise WireError(f'{w} field "commits" must be a list of maps {{"name", "position", '
                             f'"consumer", "lease_ms"}}, got {type(items).__name__}')
    req: dict[str, Any] = {"timeout_ms": _timeout(ctx, frame, w), "count": len(items),
                           "items": None}
    if not 1 <= len(items) <= MAX_COMMIT_ITEMS:
        return req
    parsed = []
    for i, item in enumerate(items):
        where = f"{w} commits[{i}]"
        if not isinstance(item, dict):
            raise WireError(f"{where} must be a map, got {type(item).__name__}")
        parsed.append({
            "name": _name(item, where),
            "position": get_int(item, "position", minimum=0, maximum=2**63 - 1,
                                     where=where),
            "consumer": get_str(item, "consumer", default="", where=where),
            "lease_ms": get_int(item, "lease_ms", default=0, minimum=0,
                                     maximum=MAX_LEASE_MS, where=where)})
    req["items"] = parsed
    return req


# -- executing -----------------------------------------------------------------------------------
def _refuse(ctx: ApiContext, rid: int, req: dict[str, Any]) -> dict[str, Any] | None:
    if ctx.closing:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN)
    if ctx.group.subs is None:
        return ctx.error(rid, ErrorCode.BAD_REQUEST, "this node has no subscription service")
    why = name_error(req["name"]) if "name" in req else None
    if why is not None:
        return ctx.error(rid, ErrorCode.INVALID_SUBSCRIPTION_NAME, why, name=req["name"])
    why = consumer_error(req.get("consumer", ""))
    if why is not None:
        return ctx.error(rid, ErrorCode.BAD_REQUEST, why)
    return None


def _reply(ctx: ApiContext, rid: int, outcome: Outcome, **fields: Any) -> dict[str, Any]:
    if outcome.ok:
        return ok_reply(rid, subscription=outcome.sub, **fields)
    extra: dict[str, Any] = {}
    if outcome.sub is not None:
        extra = {"subscription": outcome.sub, "position": outcome.sub["position"],
                 "lease_holder": outcome.sub.get("lease_holder"),
                 "lease_until_ms": outcome.sub.get("lease_until_ms")}
    return ctx.error(rid, outcome.code, outcome.message or None, **extra)


def _resolve(ctx: ApiContext, rid: int, where: Any,
             what: str) -> tuple[int | None, dict[str, Any] | None]:
    """"start"/"end"/offset -> an offset in [log start, high watermark + 1], or an error."""
    hw = visible_hw(ctx.group)
    start = ctx.group.log.start_offset
    if where == "start":
        return start, None
    if where == "end":
        return hw + 1, None
    if where > hw + 1:
        return None, ctx.error(rid, ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                               f"{what} {where} is past high watermark + 1 ({hw + 1})",
                               high_watermark=hw, start_offset=start)
    if where < start:
        return None, ctx.error(rid, ErrorCode.OFFSET_OUT_OF_RANGE,
                               f"{what} {where} is below the log start {start} (removed by "
                               f"retention); use {start} or 'start'",
                               high_watermark=hw, start_offset=start)
    return where, None


async def execute_op(ctx: ApiContext, req: dict[str, Any], rid: int) -> dict[str, Any]:
    refused = _refuse(ctx, rid, req)
    if refused is not None:
        return refused
    op: Op = req["op"]
    if not ctx.group.is_leader():
        return ctx.not_leader_reply(rid)
    position, arg = -1, req["lease_ms"]
    if op == Op.COMMIT:
        position = req["position"]
        hw = visible_hw(ctx.group)
        if position > hw + 1:
            return ctx.error(rid, ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                             f"position {position} is past high watermark + 1 ({hw + 1}): "
                             f"commit the offset after the last record processed",
                             high_watermark=hw)
    elif op in (Op.OPEN, Op.RESET, Op.PIN):
        position, error = _resolve(ctx, rid, req["initial"],
                                   "reset position" if op == Op.RESET else "initial position")
        if error is not None:
            return error
        if op == Op.PIN:
            # The pin's end is the high watermark now; the initial position applies only if
            # the subscription does not exist yet.
            position, arg = visible_hw(ctx.group) + 1, position
    elif op == Op.DELETE:
        arg = -1  # unconditional (expiry's deletes are the service's own)
    outcome = await ctx.group.subs.submit(OpRequest(op, req["name"], req["consumer"], position,
                                                    arg), req["timeout_ms"] / 1000)
    if op == Op.DELETE and outcome.ok:
        return ok_reply(rid, deleted=True)
    return _reply(ctx, rid, outcome)


async def execute_commit_many(ctx: ApiContext, req: dict[str, Any],
                              rid: int) -> dict[str, Any]:
    """One result per item, in order: {"ok": true, "subscription": ...} or {"ok": false,
    "error": {...}} with the same codes and fields as sub_commit's error replies. Checks that
    concern the whole request (the item count, leadership, shutdown) answer the request."""
    if req["items"] is None:
        return ctx.error(rid, ErrorCode.BAD_REQUEST,
                         f"sub_commit_many carries 1 to {MAX_COMMIT_ITEMS} commits, got "
                         f"{req['count']}: split them into several requests",
                         max_items=MAX_COMMIT_ITEMS, count=req["count"])
    if ctx.closing:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN)
    if ctx.group.subs is None:
        return ctx.error(rid, ErrorCode.BAD_REQUEST, "this node has no subscription service")
    if not ctx.group.is_leader():
        return ctx.not_leader_reply(rid)
    hw = visible_hw(ctx.group)
    results: list[dict[str, Any] | None] = [None] * len(req["items"])
    ops: list[OpRequest] = []
    slots: list[int] = []
    for i, item in enumerate(req["items"]):
        refused = _refuse(ctx, rid, item)
        if refused is None and item["position"] > hw + 1:
            refused = ctx.error(rid, ErrorCode.POSITION_PAST_HIGH_WATERMARK,
                                f"position {item['position']} is past high watermark + 1 "
                                f"({hw + 1}): commit the offset after the last record "
                                f"processed", high_watermark=hw)
        if refused is not None:
            results[i] = _result(refused)
            continue
        ops.append(OpRequest(Op.COMMIT, item["name"], item["consumer"], item["position"],
                             item["lease_ms"]))
        slots.append(i)
    if ops:
        outcomes = await ctx.group.subs.submit_many(ops, req["timeout_ms"] / 1000)
        for i, outcome in zip(slots, outcomes, strict=True):
            results[i] = _result(_reply(ctx, rid, outcome))
    return ok_reply(rid, results=results)


def _result(reply: dict[str, Any]) -> dict[str, Any]:
    """One item's result from the reply a lone sub_commit would have had."""
    if reply.get("ok"):
        return {"ok": True, "subscription": reply["subscription"]}
    return {"ok": False, "error": reply["error"]}


async def execute_get(ctx: ApiContext, req: dict[str, Any], rid: int) -> dict[str, Any]:
    refused = _refuse(ctx, rid, req)
    if refused is not None:
        return refused
    subs = ctx.group.subs
    outcome = await subs.sync(req["timeout_ms"] / 1000)
    if not outcome.ok:
        return _reply(ctx, rid, outcome)
    sub = subs.table.describe(req["name"])
    if sub is None:
        return ctx.error(rid, ErrorCode.UNKNOWN_SUBSCRIPTION,
                         f"no subscription named {req['name']!r}; a consumer creates it on "
                         f"first use (or `raftlog subscriptions reset NAME --to start`)",
                         name=req["name"])
    hw = visible_hw(ctx.group)
    return ok_reply(rid, subscription=subs.view(sub, hw, _now_ms()), high_watermark=hw)


async def execute_list(ctx: ApiContext, req: dict[str, Any], rid: int) -> dict[str, Any]:
    if ctx.closing:
        return ctx.error(rid, ErrorCode.SHUTTING_DOWN)
    subs = ctx.group.subs
    if subs is None:
        return ctx.error(rid, ErrorCode.BAD_REQUEST, "this node has no subscription service")
    outcome = await subs.sync(req["timeout_ms"] / 1000)
    if not outcome.ok:
        return _reply(ctx, rid, outcome)
    hw = visible_hw(ctx.group)
    now = _now_ms()
    names = sorted(n for n in subs.table.subs
                   if n.startswith(req["prefix"]) and n > req["after"])
    page = names[:req["limit"]]
    return ok_reply(rid, high_watermark=hw, start_offset=ctx.group.log.start_offset,
                         more=len(names) > len(page), total=len(subs.table.subs),
                         service=subs.status(),
                         subscriptions=[subs.view(subs.table.describe(n), hw, now)
                                        for n in page])


def _now_ms() -> int:
    return int(time.time() * 1000)


REQUESTS = {
    "sub_open": Request(_parser(Op.OPEN, consumer=True, lease=True, initial="from"),
                        execute_op),
    "sub_commit": Request(_parser(Op.COMMIT, consumer=True, position=True, lease=True),
                          execute_op),
    "sub_commit_many": Request(parse_commit_many, execute_commit_many),
    "sub_reset": Request(_parser(Op.RESET, consumer=True, initial="to"), execute_op),
    "sub_pin": Request(_parser(Op.PIN, consumer=True, initial="from"), execute_op),
    "sub_release": Request(_parser(Op.RELEASE, consumer=True), execute_op),
    "sub_delete": Request(_parser(Op.DELETE), execute_op),
    "sub_get": Request(_parser(None), execute_get),
    "sub_list": Request(parse_list, execute_list),
}
