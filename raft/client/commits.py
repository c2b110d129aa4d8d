"""Commit coalescing: the consumers that share a `Client` send their commits together.

A consumer process with hundreds of subscriptions, each committing every 100 ms, would cost the
leader one request per commit: a frame to decode, a task, a reply to encode and send, each. The
leader's accumulator already puts many commits in one log entry; this puts many in one request
(`sub_commit_many`, docs/PROTOCOL.md), the way Kafka's OffsetCommit carries many partitions.

How: a commit joins the client's open *round*. The first commit of a round drives it: it waits
`linger_ms` (or until the round holds `max_items`), then for the round before it to be answered
(one multi-commit request in flight per client, so rounds leave in order and the commits that
arrive meanwhile are the next round's), and sends
the round as one request. Each commit is answered with its own item's result: the subscription
as committed, or its own typed error (one refused commit does not fail the others). No
background task: rounds are driven by the callers themselves.

What a caller sees is what a lone `sub_commit` gives: the call returns once the commit is
acknowledged at quorum, typed errors are raised, retriable ones (NOT_LEADER, TIMEOUT,
BACKPRESSURE, ...) are retried with backoff until the caller's timeout. A driver whose caller is
cancelled abandons its round; the other commits of that round join the next one (a commit sent
twice is harmless: committing the position a subscription already has is accepted).

A node without `sub_commit_many` (an older version; it answers BAD_REQUEST "unknown request
type") gets the round's commits one `sub_commit` each, from then on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import trio

from raft.client.errors import (BadRequestError, RaftlogError, RequestTimeout,
                                error_from_reply)
from raft.protocol.errors import may_retry
from raft.protocol.subscription_requests import (MAX_COMMIT_ITEMS, CommitItem, SubCommitMany,
                                                 SubRequest)

# Long enough for the consumers of one process, woken by the same tick or the same fetch
# answers, to meet in one round; short next to the quorum write every commit waits for anyway.
DEFAULT_COMMIT_LINGER_MS = 5.0
# The node's limit per sub_commit_many is the protocol's MAX_COMMIT_ITEMS (imported above).


@dataclass(slots=True)
class _Item:
    """One caller's commit: its wire item, and what came back for it."""

    commit: CommitItem
    deadline: float
    answered: bool = False
    own: bool = False  # the error is the item's own verdict (not the whole request's)
    subscription: dict[str, Any] | None = None
    error: RaftlogError | None = None


@dataclass(slots=True)
class _Round:
    """Commits that leave together in one request (all of one topic partition's log)."""

    where: dict[str, Any] = field(default_factory=dict)  # topic/partition fields ({}: default)
    items: list[_Item] = field(default_factory=list)
    closed: bool = False  # no more joiners (full, or being sent)
    full: trio.Event = field(default_factory=trio.Event)
    finished: trio.Event = field(default_factory=trio.Event)


class CommitCoalescer:
    """Gathers a client's commits into `sub_commit_many` requests. `call` is Client.call."""

    def __init__(self, call: Any, *, linger_ms: float = DEFAULT_COMMIT_LINGER_MS,
                 max_items: int = MAX_COMMIT_ITEMS, rng: random.Random | None = None) -> None:
        if linger_ms < 0 or not 1 <= max_items <= MAX_COMMIT_ITEMS:
            raise ValueError(f"commit_linger_ms must be >= 0 and max_commit_items 1 to "
                             f"{MAX_COMMIT_ITEMS}, got {linger_ms} and {max_items}")
        self._call = call
        self._rng = rng or random.Random()
        self.linger_s = linger_ms / 1000
        self.max_items = max_items
        # Per topic partition (a request carries one partition's commits): the open round, and
        # one round in flight (a FIFO lock, so rounds leave in order).
        self._open: dict[tuple[Any, ...], _Round] = {}
        self._sending: dict[tuple[Any, ...], trio.Lock] = {}
        self._many = True  # the cluster knows sub_commit_many
        # What it did (tests, the bench): requests sent and the commits they carried.
        self.requests = 0
        self.commits = 0

    async def commit(self, name: str, position: int, *, consumer: str = "", lease_ms: int = 0,
                     timeout: float, where: dict[str, Any] | None = None) -> dict[str, Any]:
        """Commit `position` on `name` with the other commits waiting; the subscription as
        committed. Raises the item's typed error; retries retriable ones until `timeout` (s)."""
        budget = timeout
        deadline = trio.current_time() + budget
        commit = CommitItem(name, position, consumer, lease_ms)
        backoff = 0.01
        last: RaftlogError | None = None
        with trio.move_on_after(budget):
            while True:
                item = _Item(commit, deadline)
                await self._submit(item, where or {})
                if not item.answered:
                    continue  # its round was abandoned (the driver's caller was cancelled)
                if item.error is None:
                    assert item.subscription is not None
                    return item.subscription
                if not may_retry(item.error.code, idempotent=True) or not item.own:
                    raise item.error  # Client.call already retried the request's own errors
                last = item.error
                # Retry backoff with jitter, as Client.call does for a lone request.
                await trio.sleep(backoff * (0.5 + self._rng.random()))
                backoff = min(backoff * 2, 0.5)
        if last is not None:
            raise type(last)(f"{last.message} (gave up after {budget:.1f} s)", code=last.code,
                             details=last.details)
        raise RequestTimeout(f"the commit of {name!r} at {position} was not acknowledged within "
                             f"{budget:.1f} s; it may still apply: commit again (the same "
                             f"position is harmless)")

    # -- rounds --------------------------------------------------------------------------------
    async def _submit(self, item: _Item, where: dict[str, Any]) -> None:
        """Join the open round of its partition (or open one and drive it); return once the
        round is over."""
        key = tuple(sorted(where.items()))
        rnd = self._open.get(key)
        drive = rnd is None
        if rnd is None:
            rnd = self._open[key] = _Round(dict(where))
        rnd.items.append(item)
        if len(rnd.items) >= self.max_items:
            self._close(rnd)
            rnd.full.set()
        if drive:
            await self._drive(rnd)
            return
        try:
            await rnd.finished.wait()
        finally:
            if not rnd.closed and not item.answered:
                rnd.items.remove(item)  # our caller gave up before the round left: drop it

    def _close(self, rnd: _Round) -> None:
        rnd.closed = True
        key = tuple(sorted(rnd.where.items()))
        if self._open.get(key) is rnd:
            del self._open[key]

    async def _drive(self, rnd: _Round) -> None:
        try:
            with trio.move_on_after(self.linger_s):
                await rnd.full.wait()
            key = tuple(sorted(rnd.where.items()))
            async with self._sending.setdefault(key, trio.Lock()):
                self._close(rnd)
                await self._send(rnd.items, rnd.where)
        finally:
            # Whatever happened, the round is over: its unanswered commits join another one.
            self._close(rnd)
            rnd.finished.set()

    async def _send(self, items: list[_Item], where: dict[str, Any]) -> None:
        if not items:
            return
        budget = max(0.001, max(it.deadline for it in items) - trio.current_time())
        timeout_ms = max(1, min(120_000, int(budget * 1000)))
        if self._many:
            try:
                reply = await self._call(SubCommitMany([it.commit for it in items], len(items),
                                                       timeout_ms, **where), timeout=budget)
            except BadRequestError as e:
                if "unknown request type" not in e.message:
                    _fail(items, e)
                    return
                self._many = False  # an older node: one sub_commit per commit from now on
            except RaftlogError as e:
                _fail(items, e)  # Client.call already retried what was retriable
                return
            else:
                self.requests += 1
                self.commits += len(items)
                results = reply.get("results")
                if not isinstance(results, list) or len(results) != len(items):
                    _fail(items, RaftlogError(
                        f"sub_commit_many answered {len(results or [])} results for "
                        f"{len(items)} commits; upgrade the client or the cluster",
                        code="INTERNAL"))
                    return
                for item, result in zip(items, results):
                    _settle(item, result)
                return
        for item in items:
            try:
                c = item.commit
                reply = await self._call(SubRequest("sub_commit", c.name, timeout_ms, c.consumer,
                                                    position=c.position, lease_ms=c.lease_ms,
                                                    **where), timeout=budget)
            except RaftlogError as e:
                _fail([item], e)
            else:
                self.requests += 1
                self.commits += 1
                _settle(item, {"ok": True, "subscription": reply["subscription"]})


def _settle(item: _Item, result: dict[str, Any]) -> None:
    item.answered = True
    if result.get("ok"):
        item.subscription = result["subscription"]
    else:
        item.own = True  # its own verdict: a retriable one is retried for this item alone
        item.error = error_from_reply(result.get("error") or {})


def _fail(items: list[_Item], e: RaftlogError) -> None:
    """The whole request failed: every commit in it gets its own copy of the error."""
    for item in items:
        item.answered = True
        item.error = type(e)(e.message, code=e.code, details=e.details)


__all__ = ["DEFAULT_COMMIT_LINGER_MS", "MAX_COMMIT_ITEMS", "CommitCoalescer"]
