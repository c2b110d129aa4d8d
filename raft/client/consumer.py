"""`Consumer`: read a subscription's records, committing the position as you go (at least once).

    async with Client(servers) as client:
        async with Consumer(client, subscription="orders", auto_commit_ms=1000) as consumer:
            async for record in consumer:
                handle(record)          # done with it once you ask for the next one

The first read opens the subscription (creating it at `start` on first use: "start", "end" or
an offset) and reads from its committed position; the position lives in the cluster, replicated
with the log, so a consumer that restarts, on any node, after any fail-over, resumes there.

What is committed, and when:
- a record counts as processed once the iterator is asked for the next one (or the consumer is
  closed, or `commit()` is called: that marks everything handed out so far as processed);
- with `auto_commit_ms`, the processed position is committed at most that often, from inside
  the iterator (no background task); `auto_commit_ms=0` leaves every commit to `commit()`;
- closing the consumer commits what was processed and gives up the lease.
After a crash, the next consumer re-reads at most what was processed since the last commit
(at least once; make processing idempotent, or dedup on the output side, for effectively once).

`exclusive=True` takes the single-active-consumer lease: a second consumer of the same
subscription gets `SubscriptionLeased` until this one closes, or its lease (`lease_ms`) runs out
without a renewal. Commits renew it, and so does waiting for new records (every lease_ms / 3);
processing a single record must take less than lease_ms.

Consumers that share a client commit together: their commits leave in one request
(raft/client/commits.py), each still acknowledged at quorum before its `commit()` returns, each
with its own error. Give the consumers of one process one client.

A committed batch that cannot be decoded as records (written by a faulty client, or before
nodes validated payloads) stops nothing but itself: by default the iterator raises
`UndecodableBatchError` (its offsets, the reason, what to do) once the records before it were
handed out, and iterating again reads on after it, which then counts as processed:

    while True:
        try:
            async for record in consumer:
                handle(record)
            break
        except UndecodableBatchError as e:
            log.error("%s", e)      # names the offsets; re-produce them from their source

or pass `on_undecodable=fn` to be called with each such batch (raft.client.UndecodableBatch)
and read on without an exception.

When retention has removed records the subscription had not read (its position is below the
log start), the subscription's reset policy decides (Kafka's auto.offset.reset): `none` (the
default) raises `SubscriptionPositionRemoved`, whose message names the commands that move it on;
`earliest` resets it to the log start and `latest` to the end, and reads on. The reset is the
cluster's (conditional on the position this consumer saw, so two consumers do not skip twice)
and counts what it skipped in the subscription's `skipped_offsets`; `on_reset` is called with
{"name", "from", "to", "skipped_offsets", "policy", "start_offset"}. `auto_reset=` stores the
policy with the subscription when it opens; None uses the one stored.

A subscription belongs to one topic partition (`topic=`, `partition=`; default the default
topic's partition 0): it reads and commits that partition's offsets, through its leader. To read
every partition of a topic without a subscription, use raft.client.TopicConsumer.

`BlockingConsumer` is the same for code without a trio loop (from `BlockingClient.consumer`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Literal

import trio

from raft.client.errors import (OffsetOutOfRangeError, RaftlogError,
                                SubscriptionPositionRemoved, UndecodableBatchError)
from raft.client.reader_lifecycle import ReaderLifecycle
from raft.client.results import FetchedRecord, UndecodableBatch
from raft.client.subscription_calls import Where

DEFAULT_LEASE_MS = 30_000
# After a fail-over the new leader's high watermark can briefly trail a position committed
# through the old one: a fetch past it is retried for this long before it is an error.
CATCH_UP_GRACE_S = 30.0
AUTO_RESET_POLICIES = ("none", "earliest", "latest")
MAX_RESETS_PER_FILL = 8  # retention racing a reset: give up (with the error) after this many


def default_consumer_id() -> str:
    """host:pid:random: names this consumer in `raftlog subscriptions` (last committer, lease
    holder)."""
    host = "".join(c for c in socket.gethostname() if 33 <= ord(c) < 127)[:64] or "host"
    return f"{host}:{os.getpid()}:{os.urandom(3).hex()}"


class Consumer(ReaderLifecycle):
    def __init__(self, client: Any, subscription: str, *, auto_commit_ms: int = 1000,
                 start: Where = "start", exclusive: bool = False,
                 lease_ms: int = DEFAULT_LEASE_MS, consumer_id: str | None = None,
                 max_bytes: int = 1 << 20, max_wait: float = 1.0, follow: bool = True,
                 on_undecodable: Literal["raise"] | Callable[[UndecodableBatch], None]
                 = "raise", auto_reset: str | None = None,
                 on_reset: Callable[[dict[str, Any]], None] | None = None,
                 topic: str | None = None, partition: int = 0) -> None:
        if auto_commit_ms < 0 or lease_ms < 1 or max_bytes < 1 or max_wait < 0:
            raise ValueError("auto_commit_ms >= 0, lease_ms >= 1, max_bytes >= 1, "
                             "max_wait >= 0")
        self.client = client
        self.subscription = subscription
        self.where: dict[str, Any] = {"topic": topic, "partition": partition}
        self.auto_commit_ms = auto_commit_ms
        self.start = start
        self.lease_ms = lease_ms if exclusive else 0
        self.consumer_id = consumer_id or default_consumer_id()
        self.max_bytes = max_bytes
        self.follow = follow
        if on_undecodable != "raise" and not callable(on_undecodable):
            raise ValueError('on_undecodable is "raise" or a function taking an '
                             'UndecodableBatch')
        self.on_undecodable = on_undecodable
        if auto_reset is not None and auto_reset not in AUTO_RESET_POLICIES:
            raise ValueError(f"auto_reset is one of {', '.join(AUTO_RESET_POLICIES)} (or None: "
                             f"the subscription's own policy), got {auto_reset!r}")
        self.auto_reset = auto_reset
        self.policy = auto_reset or "none"  # in force: the subscription's, once opened
        self.on_reset = on_reset
        # With a lease, waiting for records must renew it in time.
        self.max_wait = min(max_wait, lease_ms / 3000) if exclusive else max_wait
        self._opened = False
        self._closed = False
        # Records, and undecodable batches in their place among them.
        self._buffer: deque[FetchedRecord | UndecodableBatch] = deque()
        self._fetch_from = -1  # next offset to fetch
        self._handed = -1  # position once everything handed out is processed
        self._processed = -1  # position of what is known processed
        self._committed = -1  # position last committed
        self._last_commit = 0.0  # trio time of the last commit (or open)
        self.commits = 0

    # -- state ---------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """The position processed so far (what the next commit would commit)."""
        return self._processed

    @property
    def committed(self) -> int:
        return self._committed

    @property
    def buffered(self) -> int:
        """Records (and undecodable batches) fetched and not handed out yet."""
        return len(self._buffer)

    def mark_processed(self) -> None:
        """Everything handed out so far is processed (what asking for the next record says;
        raft/client/topic_subscription.py reads several of these in turns)."""
        self._processed = self._handed if not self._buffer else self._buffer_position()

    async def open(self) -> dict[str, Any]:
        """Open the subscription (creating it on first use) and read from its position."""
        sub = await self.client.subscription_open(self.subscription, consumer=self.consumer_id,
                                                  start=self.start, lease_ms=self.lease_ms,
                                                  auto_reset=self.auto_reset, **self.where)
        self.policy = sub.get("auto_reset") or self.auto_reset or "none"
        self._moved_to(int(sub["position"]))
        self._buffer.clear()
        self._opened = True
        self._last_commit = trio.current_time()
        return sub

    # -- iterating -----------------------------------------------------------------------------
    async def __anext__(self) -> FetchedRecord:
        if self._closed:
            raise StopAsyncIteration
        if not self._opened:
            await self.open()
        # The record handed out last time is processed now.
        self._processed = self._handed if not self._buffer else self._buffer_position()
        await self._maybe_auto_commit()
        while True:
            while not self._buffer:
                if not await self._fill():
                    self._processed = self._handed
                    raise StopAsyncIteration
                await self._maybe_auto_commit()
            item = self._buffer.popleft()
            if isinstance(item, FetchedRecord):
                self._handed = self._fetch_from if not self._buffer else item.offset + 1
                return item
            # An undecodable batch: once reported, it is passed like a processed record.
            self._handed = self._fetch_from if not self._buffer else item.last_offset + 1
            if self.on_undecodable == "raise":
                raise UndecodableBatchError(item.message, details={
                    "first_offset": item.first_offset, "last_offset": item.last_offset,
                    "reason": item.reason})
            self.on_undecodable(item)
            self._processed = self._handed

    def _buffer_position(self) -> int:
        """Everything before the next buffered record was handed out and processed (an
        undecodable batch may start before the position read from: never count back)."""
        return max(self._buffer[0].offset, self._handed)

    async def _fill(self) -> bool:
        """Fetch the next records into the buffer; False at the high watermark without
        `follow`."""
        waited_since = trio.current_time()
        resets = 0
        while True:
            try:
                res = await self.client.fetch(self._fetch_from, max_bytes=self.max_bytes,
                                              max_wait=self.max_wait if self.follow else 0.0,
                                              **self.where)
            except OffsetOutOfRangeError as e:
                start = e.start_offset
                if start is not None and self._fetch_from < start:
                    resets += 1
                    await self._passed_by_retention(start, e, final=resets
                                                    > MAX_RESETS_PER_FILL)
                    continue
                hw = e.high_watermark
                if hw is not None and self._fetch_from > hw + 1 \
                        and trio.current_time() - waited_since < CATCH_UP_GRACE_S:
                    # A new leader not yet caught up with the position: wait for it.
                    await trio.sleep(0.05)
                    continue
                raise
            records: list[FetchedRecord | UndecodableBatch] = [
                r for r in res.records if r.offset >= self._fetch_from]
            bad = [b for b in res.undecodable if b.last_offset >= self._fetch_from]
            if bad:
                records = sorted(records + bad, key=lambda r: r.offset)
            moved = res.next_offset > self._fetch_from
            self._fetch_from = max(self._fetch_from, res.next_offset)
            if records:
                self._buffer.extend(records)
                return True
            if moved:
                # Only control entries were passed: nothing to hand out, but the position may
                # move past them.
                self._handed = self._processed = self._fetch_from
            if not self.follow:
                if not moved:
                    return False
                continue
            await self._maybe_auto_commit()

    def _moved_to(self, position: int) -> None:
        self._fetch_from = self._handed = self._processed = self._committed = position

    async def _passed_by_retention(self, start: int, error: OffsetOutOfRangeError, *,
                                   final: bool) -> None:
        """Retention removed offsets below `start` before this subscription read them: apply
        the reset policy (reset through the cluster, conditional on the committed position we
        know), or raise the error that names the fix."""
        name, pos = self.subscription, self._fetch_from
        if final:
            raise SubscriptionPositionRemoved(
                f"subscription {name}: retention removed the log below offset {start} again "
                f"after {MAX_RESETS_PER_FILL} resets (policy {self.policy}); it deletes faster "
                f"than this consumer reads: raise --retention-bytes/--retention-ms, or run the "
                f"nodes with --retention-respect-subscriptions",
                code=error.code, details={**error.details, "position": pos, "name": name,
                                          "start_offset": start})
        if self.policy == "none":
            raise SubscriptionPositionRemoved(
                f"subscription {name} is at position {pos}, but retention removed the log "
                f"below offset {start} before it was read (its reset policy is "
                f"{self.policy}). To skip the {start - pos} removed offsets and read on from "
                f"the log start, run `raftlog consume --subscription {name} --auto-reset "
                f"earliest` (or --auto-reset latest to start at the end; either is stored as "
                f"the subscription's policy), or move it with `raftlog subscriptions reset "
                f"{name} --to start`. To keep records until subscriptions read them, run the "
                f"nodes with --retention-respect-subscriptions",
                code=error.code, details={**error.details, "position": pos, "name": name,
                                          "start_offset": start})
        before = self._committed
        sub = await self.client.subscription_reset(
            name, "start" if self.policy == "earliest" else "end",
            consumer=self.consumer_id, expect=before, **self.where)
        self._moved_to(int(sub["position"]))
        self._last_commit = trio.current_time()
        if self.on_reset is not None:
            self.on_reset({"name": name, "from": pos, "to": self._fetch_from,
                           "skipped_offsets": max(0, self._fetch_from - pos),
                           "policy": self.policy, "start_offset": start})

    # -- committing ---------------------------------------------------------------------------
    async def _maybe_auto_commit(self) -> None:
        since_ms = (trio.current_time() - self._last_commit) * 1000
        if self.lease_ms and since_ms >= self.lease_ms / 3:
            # Renew the lease (with what is processed when auto-committing, else as it was).
            await self._commit(self._processed if self.auto_commit_ms else self._committed,
                               force=True)
        elif self.auto_commit_ms and self._processed > self._committed \
                and since_ms >= self.auto_commit_ms:
            await self._commit(self._processed, force=False)

    async def commit(self, position: int | None = None) -> dict[str, Any] | None:
        """Mark everything handed out so far as processed and commit it (or commit `position`,
        which must not be below the committed one). Returns the subscription as committed, or
        None if there was nothing new."""
        if not self._opened:
            await self.open()
        if position is None:
            self._processed = self._handed
            position = self._processed
        else:
            self._processed = max(self._processed, position)
        return await self._commit(position, force=False)

    async def _commit(self, position: int, *, force: bool) -> dict[str, Any] | None:
        if position <= self._committed and not force:
            return None
        sub = await self.client.subscription_commit(self.subscription, position,
                                                    consumer=self.consumer_id,
                                                    lease_ms=self.lease_ms, **self.where)
        self._committed = max(self._committed, position)
        self._last_commit = trio.current_time()
        self.commits += 1
        return sub

    async def aclose(self) -> None:
        """Commit what was processed (the record handed out last counts as processed: you
        are closing after it) and give up the lease."""
        if not self._closing():
            return
        self._processed = self._handed
        try:
            await self._commit(self._processed, force=False)
        finally:
            if self.lease_ms:
                await self.client.subscription_release(self.subscription, self.consumer_id,
                                                       **self.where)

    async def _close_after_error(self) -> None:
        """Processing failed (or was interrupted): commit only what finished before the record
        in hand, which the next consumer reads again; give up the lease."""
        if not self._closing():
            return
        # Best effort: the error being raised matters more than these; a commit that fails
        # only means a longer re-read (at least once either way).
        with contextlib.suppress(RaftlogError):
            await self._commit(self._processed, force=False)
        if self.lease_ms:
            with contextlib.suppress(RaftlogError):
                await self.client.subscription_release(self.subscription, self.consumer_id,
                                                       **self.where)


class BlockingConsumer:
    """`Consumer` for code without a trio loop: `for record in consumer:`; `commit()`,
    `close()`. Made by `BlockingClient.consumer(...)`; each step runs on the client's loop."""

    def __init__(self, blocking_client: Any, consumer: Consumer) -> None:
        self._bc = blocking_client
        self.consumer = consumer

    def __iter__(self) -> Iterator[FetchedRecord]:
        return self

    def __next__(self) -> FetchedRecord:
        async def step() -> FetchedRecord | None:
            try:
                return await self.consumer.__anext__()
            except StopAsyncIteration:
                return None

        record = self._bc._call(step)
        if record is None:
            raise StopIteration
        return record

    def open(self) -> dict[str, Any]:
        return self._bc._call(self.consumer.open)

    def commit(self, position: int | None = None) -> dict[str, Any] | None:
        return self._bc._call(self.consumer.commit, position)

    @property
    def position(self) -> int:
        return self.consumer.position

    def close(self) -> None:
        self._bc._call(self.consumer.aclose)

    def __enter__(self) -> "BlockingConsumer":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._bc._call(self.consumer._close_after_error)


__all__ = ["BlockingConsumer", "Consumer", "default_consumer_id"]
