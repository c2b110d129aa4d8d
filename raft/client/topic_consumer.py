"""`TopicConsumer`: read one partition of a topic, or every partition, each in order.

    async with Client(servers) as client:
        async for record in TopicConsumer(client, "orders"):          # every partition
            print(record.partition, record.offset, record.value)
        async for record in TopicConsumer(client, "orders", partitions=[3], follow=False):
            ...

Offsets are per partition: records come with their `partition`, and within a partition in
offset order (so a key's records, which one partition holds, come in the order produced).
Across partitions there is no order; the consumer takes turns, so a busy partition does not
starve the others. Nothing is committed: for a position kept by the cluster use `Consumer`
with a subscription.

Where to start: `start="start"` (each partition's log start), `"end"` (only new records), an
offset for every partition, or a {partition: offset} map. With `follow` (the default) it waits
for new records (one long poll per partition at once, the first to answer wins), and picks up
partitions added to the topic (read from their start) as the client's metadata learns of them;
without `follow` it stops once every partition was read to its high watermark.

Without `topic` it reads the default topic's partition 0 as `raftlog consume` always has, with
no metadata (a cluster that predates topics serves it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import trio

from raft.client.errors import OffsetOutOfRangeError, UndecodableBatchError
from raft.client.metadata import DEFAULT_TOPIC
from raft.client.results import FetchedRecord, FetchResult, UndecodableBatch

Start = int | Literal["start", "end"] | dict[int, int]


class TopicConsumer:
    def __init__(self, client: Any, topic: str | None = None, *,
                 partitions: list[int] | None = None, start: Start = "start",
                 follow: bool = True, max_bytes: int = 1 << 20, max_wait: float = 1.0,
                 on_undecodable: Literal["raise"] | Callable[[UndecodableBatch], None]
                 = "raise") -> None:
        if max_bytes < 1 or max_wait < 0:
            raise ValueError("max_bytes >= 1 and max_wait >= 0")
        self.client = client
        self.topic = topic
        self.fixed = partitions is not None
        self.partitions = sorted(set(partitions)) if partitions is not None else []
        self.start = start
        self.follow = follow
        self.max_bytes = max_bytes
        self.max_wait = max_wait
        self.on_undecodable = on_undecodable
        self.positions: dict[int, int] = {}  # partition -> next offset to read
        self._done: set[int] = set()  # without follow: partitions read to their high watermark
        self._buffer: deque[FetchedRecord | UndecodableBatch] = deque()
        self._opened = False
        self._turn = 0

    @property
    def topic_name(self) -> str:
        return self.topic if self.topic is not None else DEFAULT_TOPIC

    def _where(self, partition: int) -> dict[str, Any]:
        return {"topic": self.topic, "partition": partition}

    async def open(self) -> dict[int, int]:
        """Find the partitions and where each starts; the positions."""
        if not self.fixed:
            if self.topic is None:
                self.partitions = [0]
            else:
                info = await self.client.topic(self.topic_name)
                self.partitions = list(range(info.partition_count))
        elif self.topic is not None:
            meta = await self.client.metadata.get(self.topic_name)
            for p in self.partitions:
                meta.partition(self.topic_name, p)  # UnknownTopicError naming the range
        for p in self.partitions:
            self.positions[p] = await self._first(p)
        self._opened = True
        return dict(self.positions)

    async def _first(self, partition: int, start: Start | None = None) -> int:
        where = self.start if start is None else start
        if isinstance(where, dict):
            where = where.get(partition, "start")
        if isinstance(where, int):
            return where
        lo, hw = await self._bounds(partition)
        return lo if where == "start" else hw + 1

    async def _bounds(self, partition: int) -> tuple[int, int]:
        """(log start, high watermark) of a partition."""
        try:
            res = await self.client.fetch(0, max_bytes=1, **self._where(partition))
            return res.start_offset, res.high_watermark
        except OffsetOutOfRangeError as e:
            lo = e.start_offset if e.start_offset is not None else 0
            return lo, e.high_watermark if e.high_watermark is not None else lo - 1

    def _grown(self) -> list[int]:
        """Partitions the client's metadata knows of that this consumer does not read yet."""
        if self.fixed or self.topic is None:
            return []
        meta = self.client.metadata.current
        info = meta.topics.get(self.topic_name) if meta is not None else None
        if info is None:
            return []
        return [p for p in range(info.partition_count) if p not in self.positions]

    def __aiter__(self) -> AsyncIterator[FetchedRecord]:
        return self

    async def __anext__(self) -> FetchedRecord:
        if not self._opened:
            await self.open()
        while not self._buffer:
            if not await self._fill():
                raise StopAsyncIteration
        item = self._buffer.popleft()
        if isinstance(item, FetchedRecord):
            return item
        if self.on_undecodable == "raise":
            raise UndecodableBatchError(item.message, details={
                "first_offset": item.first_offset, "last_offset": item.last_offset,
                "reason": item.reason})
        self.on_undecodable(item)
        return await self.__anext__()

    async def _fill(self) -> bool:
        """One turn over the partitions: fetch without waiting, one partition after another
        from where the last turn stopped, until one has records; if none has and `follow`,
        long-poll all at once. False when there is nothing more to read (without follow)."""
        for p in self._grown():
            self.partitions.append(p)
            self.positions[p] = await self._first(p, "start")
        live = [p for p in self.partitions if p not in self._done]
        if not live:
            return False
        for i in range(len(live)):
            p = live[(self._turn + i) % len(live)]
            res = await self.client.fetch(self.positions[p], max_bytes=self.max_bytes,
                                          **self._where(p))
            if self._take(p, res):
                self._turn = (self._turn + i + 1) % max(1, len(live))
                return True
            if not self.follow and res.next_offset <= self.positions[p]:
                self._done.add(p)  # at its high watermark
        if not self.follow:
            return bool([p for p in self.partitions if p not in self._done])
        return await self._long_poll(live)

    async def _long_poll(self, live: list[int]) -> bool:
        got: list[tuple[int, FetchResult]] = []
        async with trio.open_nursery() as nursery:
            async def one(p: int) -> None:
                res = await self.client.fetch(self.positions[p], max_bytes=self.max_bytes,
                                              max_wait=self.max_wait, **self._where(p))
                got.append((p, res))
                if res.records or res.undecodable:
                    nursery.cancel_scope.cancel()  # reads are safe to abandon
            for p in live:
                nursery.start_soon(one, p)
        for p, res in got:
            self._take(p, res)
        return True

    def _take(self, partition: int, res: FetchResult) -> bool:
        pos = self.positions[partition]
        items: list[FetchedRecord | UndecodableBatch] = [
            r for r in res.records if r.offset >= pos]
        items += [b for b in res.undecodable if b.last_offset >= pos]
        items.sort(key=lambda r: r.offset)
        self.positions[partition] = max(pos, res.next_offset)
        self._buffer.extend(items)
        return bool(items)


__all__ = ["TopicConsumer"]
