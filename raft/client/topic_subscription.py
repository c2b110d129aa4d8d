"""`TopicSubscription`: one member of a subscription over every partition of a topic.

    async with Client(servers) as client:
        async with TopicSubscription(client, "orders", "etl", member_id="w1") as sub:
            async for record in sub:
                handle(record.partition, record.offset, record.value)

Several members of subscription `etl` of topic `orders` share its partitions (Kafka's consumer
groups): each partition is leased to one member at a time, every member holds its share, and
partitions move when members join, leave (close) or stop renewing. Each partition is read in
order from its own committed position, which lives in that partition's log, and committed per
partition; a record counts as processed once the next one is asked for (as for `Consumer`).
docs/SUBSCRIPTIONS.md "Subscriptions over a topic" has the protocol.

Rounds. Every `heartbeat_ms` (default lease_ms / 3) the member asks every partition, at once,
to count it as a member (WATCH) or also to lease the partition to it (TAKE: the ones it holds
and keeps, and free ones while below its quota); the answers name each partition's holder and
members, from which raft/core/subscription_members.py plans the next round: extras above the
quota are committed and released, free partitions taken. Rounds run inside the iterator (no
background task), before a record is handed out, so processing one record must take less than
`lease_ms` minus a round; `rebalance()` runs one at once (between records: the records handed
out so far count as processed).

Each held partition is read by a `Consumer` with this member's id and lease: commits renew the
lease, and a commit refused because the lease ended (this member paused too long and another
took the partition) drops the partition here (`lost`, `on_revoked(partition, "lost")`); its new
holder reads again from the last committed position (at least once). A released partition gets
`on_revoked(partition, "released")`, a new one `on_assigned(partition)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

import trio

from raft.client.consumer import DEFAULT_LEASE_MS, Consumer, default_consumer_id
from raft.client.errors import RaftlogError, SubscriptionLeased
from raft.client.metadata import DEFAULT_TOPIC
from raft.client.reader_lifecycle import ReaderLifecycle
from raft.client.results import FetchedRecord, UndecodableBatch
from raft.client.subscription_calls import Where
from raft.core import subscription_members
from raft.core.subscription_members import PartitionView, Plan


class TopicSubscription(ReaderLifecycle):
    def __init__(self, client: Any, topic: str | None, subscription: str, *,
                 member_id: str | None = None, lease_ms: int = DEFAULT_LEASE_MS,
                 heartbeat_ms: int | None = None, auto_commit_ms: int = 1000,
                 start: Where = "start", follow: bool = True, max_bytes: int = 1 << 20,
                 max_wait: float = 1.0,
                 on_undecodable: Literal["raise"] | Callable[[UndecodableBatch], None]
                 = "raise", auto_reset: str | None = None,
                 on_reset: Callable[[dict[str, Any]], None] | None = None,
                 on_assigned: Callable[[int], None] | None = None,
                 on_revoked: Callable[[int, str], None] | None = None) -> None:
        heartbeat_ms = heartbeat_ms if heartbeat_ms is not None else max(1, lease_ms // 3)
        if lease_ms < 1 or not 0 < heartbeat_ms < lease_ms or auto_commit_ms < 0:
            raise ValueError("lease_ms >= 1, 0 < heartbeat_ms < lease_ms, auto_commit_ms >= 0")
        self.client = client
        self.topic = topic
        self.subscription = subscription
        self.member_id = member_id or default_consumer_id()
        self.lease_ms = lease_ms
        self.heartbeat_ms = heartbeat_ms
        self.auto_commit_ms = auto_commit_ms
        self.start = start
        self.follow = follow
        self.max_wait = min(max_wait, heartbeat_ms / 1000)
        self._consumer_args: dict[str, Any] = {
            "max_bytes": max_bytes, "on_undecodable": on_undecodable,
            "auto_reset": auto_reset, "on_reset": on_reset}
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.partitions: list[int] = []
        self.views: dict[int, PartitionView] = {}
        self.readers: dict[int, Consumer] = {}  # the partitions this member holds
        self.last_plan: Plan | None = None
        self.lost: list[int] = []  # partitions taken away (lease ended), in order
        self.failures: dict[int, RaftlogError] = {}  # partitions the last round did not reach
        self.rounds = 0
        self._opened = False
        self._closed = False
        self._next_round = 0.0
        self._last_commit = 0.0
        self._current: int | None = None  # the partition read last
        self._turn = 0

    @property
    def assigned(self) -> list[int]:
        """The partitions this member holds now."""
        return sorted(self.readers)

    @property
    def topic_name(self) -> str:
        return self.topic if self.topic is not None else DEFAULT_TOPIC

    def _where(self, partition: int) -> dict[str, Any]:
        return {"topic": self.topic, "partition": partition}

    # -- rounds --------------------------------------------------------------------------------
    async def open(self) -> list[int]:
        """Join: one round to see who is there, one to take a share. The partitions held."""
        if self.topic is None:
            self.partitions = [0]
        else:
            self.partitions = list(range((await self.client.topic(self.topic_name))
                                         .partition_count))
        self._opened = True
        self._last_commit = trio.current_time()
        await self._round(watch_only=True)
        await self._round()
        return self.assigned

    async def rebalance(self) -> list[int]:
        """One round now (call between records); the partitions held after it."""
        if not self._opened:
            return await self.open()
        self._mark_processed()
        await self._round()
        return self.assigned

    def _grown(self) -> None:
        """Partitions added to the topic, as the client's metadata learned of them."""
        meta = getattr(self.client.metadata, "current", None) if self.topic else None
        info = meta.topics.get(self.topic_name) if meta is not None else None
        if info is not None and info.partition_count > len(self.partitions):
            self.partitions = list(range(info.partition_count))

    async def _round(self, *, watch_only: bool = False) -> None:
        self._grown()
        # Through the module, so tests/raft/test_mutants.py's mutant of the planner reaches it.
        step = subscription_members.plan(self.member_id, self.views, self.partitions)
        self.last_plan = step
        for p in step.release:
            await self._release(p)
        wanted = set() if watch_only else set(step.wanted)
        answers: dict[int, dict[str, Any]] = {}
        failed: dict[int, RaftlogError] = {}

        async def ask(p: int) -> None:
            try:
                answers[p] = await self.client.subscription_open(
                    self.subscription, consumer=self.member_id, start=self.start,
                    lease_ms=self.lease_ms, member="take" if p in wanted else "watch",
                    auto_reset=self._consumer_args["auto_reset"], **self._where(p))
            except RaftlogError as e:  # the client retried what was retriable in its timeout
                failed[p] = e

        async with trio.open_nursery() as nursery:
            for p in self.partitions:
                nursery.start_soon(ask, p)
        if failed and not answers:
            raise failed[min(failed)]  # nothing answered: the member cannot go on blind
        # A partition that did not answer this round (its leader moving, say) keeps what the
        # last round saw; a lease it did not renew is fenced by its log if it runs out.
        self.failures = failed
        self.rounds += 1
        self._next_round = trio.current_time() + self.heartbeat_ms / 1000
        self.views = {**{p: v for p, v in self.views.items() if p in failed},
                      **{p: PartitionView(a.get("lease_holder"), tuple(a.get("members") or ()))
                         for p, a in answers.items()}}
        for p, view in sorted(self.views.items()):
            if view.holder == self.member_id and p not in self.readers:
                await self._assign(p)
            elif view.holder != self.member_id and p in self.readers:
                self._lose(p)

    async def _assign(self, p: int) -> None:
        reader = Consumer(self.client, self.subscription, auto_commit_ms=0, start=self.start,
                          exclusive=True, lease_ms=self.lease_ms, consumer_id=self.member_id,
                          follow=False, topic=self.topic, partition=p, **self._consumer_args)
        try:
            await reader.open()
        except SubscriptionLeased:
            return  # the lease ended between the round and the open: not ours after all
        self.readers[p] = reader
        if self.on_assigned is not None:
            self.on_assigned(p)

    async def _release(self, p: int) -> None:
        """Commit what was processed, then give the partition up (in that order: a commit
        after the release could take the lease again)."""
        reader = self.readers.pop(p, None)
        if reader is None:
            return
        try:
            await reader.aclose()
        except SubscriptionLeased:
            self._lost(p)
            return
        if self.on_revoked is not None:
            self.on_revoked(p, "released")

    def _lose(self, p: int) -> None:
        """The partition's lease is someone else's now: drop it without committing (the commit
        would be refused; the new holder reads again from the committed position)."""
        self.readers.pop(p, None)
        self._lost(p)

    def _lost(self, p: int) -> None:
        self.lost.append(p)
        if self._current == p:
            self._current = None
        if self.on_revoked is not None:
            self.on_revoked(p, "lost")

    # -- reading -------------------------------------------------------------------------------
    async def __anext__(self) -> FetchedRecord:
        if self._closed:
            raise StopAsyncIteration
        if not self._opened:
            await self.open()
        self._mark_processed()
        while True:
            if trio.current_time() >= self._next_round:
                await self._round()
            await self._maybe_auto_commit()
            record = await self._next_record()
            if record is not None:
                return record
            if not self.follow:
                raise StopAsyncIteration
            await self._wait_for_records()

    def _mark_processed(self) -> None:
        if self._current is not None and self._current in self.readers:
            self.readers[self._current].mark_processed()

    async def _next_record(self) -> FetchedRecord | None:
        """The next record of a held partition: the one read last while it has records
        fetched, then the others in turn. None when every held partition is at its high
        watermark."""
        order = self.assigned
        if self._current in self.readers and self.readers[self._current].buffered:
            order = [self._current]
        else:
            at = self._turn % max(1, len(order))
            order = order[at:] + order[:at]
            self._turn += 1
        for p in order:
            reader = self.readers.get(p)
            if reader is None:
                continue
            try:
                record = await reader.__anext__()
            except StopAsyncIteration:
                continue
            except SubscriptionLeased:
                self._lose(p)
                continue
            self._current = p
            return record
        return None

    async def _wait_for_records(self) -> None:
        """Every held partition is read to its high watermark: long-poll them all until one
        has news or a round is due (then the next pass fetches again)."""
        left = self._next_round - trio.current_time()
        if left <= 0:
            return
        with trio.move_on_after(left):
            async with trio.open_nursery() as nursery:
                async def poll(p: int, at: int) -> None:
                    res = await self.client.fetch(at, max_bytes=1, max_wait=self.max_wait,
                                                  **self._where(p))
                    if res.records or res.undecodable or res.next_offset > at:
                        nursery.cancel_scope.cancel()
                for p, reader in self.readers.items():
                    nursery.start_soon(poll, p, reader.position)
                if not self.readers:
                    await trio.sleep(left)  # nothing held: wait for the next round

    # -- committing ----------------------------------------------------------------------------
    async def _maybe_auto_commit(self) -> None:
        if self.auto_commit_ms and \
                (trio.current_time() - self._last_commit) * 1000 >= self.auto_commit_ms:
            await self._commit_all(mark=False)

    async def commit(self) -> dict[int, int]:
        """Commit every held partition's processed position (everything handed out so far
        counts as processed); {partition: committed position}. A partition whose lease ended
        is dropped (`lost`), not raised."""
        if not self._opened:
            await self.open()
        return await self._commit_all(mark=True)

    async def _commit_all(self, *, mark: bool) -> dict[int, int]:
        self._last_commit = trio.current_time()
        refused: list[int] = []

        async def one(p: int, reader: Consumer) -> None:
            try:
                if mark:
                    await reader.commit()
                elif reader.position > reader.committed:
                    await reader.commit(reader.position)
            except SubscriptionLeased:
                refused.append(p)

        async with trio.open_nursery() as nursery:
            for p, reader in list(self.readers.items()):
                nursery.start_soon(one, p, reader)
        for p in refused:
            self._lose(p)
        return {p: r.committed for p, r in sorted(self.readers.items())}

    async def aclose(self) -> None:
        """Commit what was processed (the record handed out last counts), release every held
        partition, and leave: the others take them over at their next round."""
        if not self._closing():
            return
        self._mark_processed()
        for p in list(self.readers):
            await self._release(p)
        await self._leave()

    async def _leave(self) -> None:
        async with trio.open_nursery() as nursery:
            for p in self.partitions:
                nursery.start_soon(self._leave_one, p)

    async def _leave_one(self, p: int) -> None:
        with contextlib.suppress(RaftlogError):  # best effort: the membership expires anyway
            await self.client.subscription_release(self.subscription, self.member_id,
                                                   leave=True, **self._where(p))

    async def _close_after_error(self) -> None:
        """Processing failed: commit only what finished before the record in hand, release,
        leave (best effort; the leases expire otherwise)."""
        if not self._closing():
            return
        with contextlib.suppress(RaftlogError):
            await self._commit_all(mark=False)
        for p, reader in list(self.readers.items()):
            self.readers.pop(p)
            with contextlib.suppress(RaftlogError):
                await self.client.subscription_release(self.subscription, self.member_id,
                                                       **self._where(p))
        await self._leave()


__all__ = ["TopicSubscription"]
