"""`Producer`: idempotent batching on top of a `Client`, and the choice of partition.

Idempotence: a producer has a random 63-bit id and numbers its batches per partition; a retry
after a timeout, a dropped connection or a leader change resends the same (producer id,
partition, sequence), so the partition's group writes the batch once and answers the retry
with the original offsets. Each partition's group keeps its own producer table, so sequences
are per (producer, partition).

Which partition a record goes to (docs/PARTITIONING.md; raft.protocol.partitioner):
- `partition=` on the call, else the producer's `partition`, when given;
- else, for a keyed record, Kafka's default partitioner: toPositive(murmur2(key)) % the
  topic's partition count, so every record of a key goes to one partition, in the order
  produced (one batch in flight per partition, retries keep their sequence);
- else (no key) the producer's sticky partition: keyless records fill one batch for one
  partition, then the next batch goes to another (KIP-480), drawn from a seeded RNG.
A Producer without `topic` and `partition` writes to the default topic's partition 0, as
before topics, and needs no metadata (a cluster that predates topics serves it).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from raft.client.client import Client, as_record
from raft.client.errors import RaftlogError, RequestTimeout
from raft.client.metadata import DEFAULT_TOPIC
from raft.protocol.partitioner import StickyPartitioner
from storage.records import Record


@dataclass(slots=True)
class Delivery:
    """One record handed to `Producer.submit`: `await delivery.wait()` returns its offset once
    its batch is acknowledged, or raises the batch's typed error. `partition` is where it
    goes (chosen when it was submitted)."""

    record: Record
    size: int
    done: trio.Event = field(default_factory=trio.Event)
    offset: int = -1
    error: BaseException | None = None
    partition: int = 0

    async def wait(self) -> int:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.offset


@dataclass(slots=True, eq=False)
class _Lane:
    """One partition's buffer, sequence numbers and sender task: one batch in flight at a
    time, so a partition's records (a key's records) are written in the order submitted."""

    partition: int
    buffer: list[Delivery] = field(default_factory=list)
    buffered: int = 0
    wake: trio.Event = field(default_factory=trio.Event)
    sequence: int = 0


class Producer:
    """Idempotent, batching producer. Use inside a nursery-owning context:

        async with Client(servers) as c, Producer(c, acks="quorum") as p:
            offset = await p.send(b"value")            # batched with concurrent sends
            offsets = await p.send_many(lines)        # one call, thousands of records

        async with Producer(c, topic="orders") as p:  # keyed: one partition per key
            d = p.submit(b"paid", key=b"order-17")
            offset = await d.wait(); print(d.partition, offset)

    Records wait at most `linger` seconds (or until `batch_bytes` accumulate) before they go
    out as one batch per partition. Each batch gets its partition's next sequence number;
    retries reuse it. `topic` (a name) needs the cluster's metadata: entering the producer
    fetches it, and raises UnknownTopicError naming the topics that exist. `seed` fixes the
    sticky partition choices (tests, replays)."""

    def __init__(self, client: Client, *, acks: str = "quorum", linger: float = 0.005,
                 batch_bytes: int = 1 << 20, timeout: float | None = None,
                 producer_id: int | None = None, topic: str | None = None,
                 partition: int | None = None, seed: int | None = None) -> None:
        if acks not in ("quorum", "leader", "none"):
            raise ValueError(f"acks={acks!r}: choose quorum, leader or none")
        if batch_bytes < 1 or linger < 0:
            raise ValueError("batch_bytes must be >= 1 and linger >= 0")
        if partition is not None and partition < 0:
            raise ValueError(f"a partition is 0 or more, got {partition}")
        self.client = client
        self.acks = acks
        self.linger = linger
        self.batch_bytes = batch_bytes
        self.timeout = client.timeout if timeout is None else timeout
        self.producer_id = producer_id or random.SystemRandom().randrange(1, 2**63)
        # None with no partition: the default topic's partition 0, no metadata (as before
        # topics); otherwise the topic (the default one if only a partition is given).
        self.topic = topic
        self.partition = partition
        self._rng = random.Random(seed) if seed is not None else random.Random()
        self._partitioner: StickyPartitioner | None = None
        self._sticky_bytes = 0  # keyless bytes given to the sticky partition since it moved
        self._lanes: dict[int, _Lane] = {}
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None
        self._closed = False
        self.records_sent = 0
        self.batches_sent = 0
        self.duplicates = 0

    @property
    def uses_topics(self) -> bool:
        return self.topic is not None or self.partition is not None

    @property
    def topic_name(self) -> str:
        return self.topic if self.topic is not None else DEFAULT_TOPIC

    @property
    def partitions(self) -> int:
        """The partition count keys are hashed over (1 for a producer without a topic)."""
        return self._partitioner.partitions if self._partitioner is not None else 1

    async def __aenter__(self) -> "Producer":
        if self.uses_topics:
            info = await self.client.topic(self.topic_name)
            if self.partition is not None:
                (await self.client.metadata.get(self.topic_name)).partition(
                    self.topic_name, self.partition)  # UnknownTopicError naming the range
            self._partitioner = StickyPartitioner(info.partition_count, rng=self._rng)
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        """A clean exit sends what is still buffered; an exit by exception (including a
        typed RaftlogError from the body) stops at once and lets that exception propagate as
        it is, never wrapped in an ExceptionGroup."""
        self._closed = True
        for lane in self._lanes.values():
            lane.wake.set()
        assert self._nursery is not None
        if exc is not None:
            self._nursery.cancel_scope.cancel()
        try:
            await self._nursery_cm.__aexit__(None, None, None)
        except BaseExceptionGroup as group:  # a sender itself failed
            leaves = _leaves(group)
            if exc is None:
                raise leaves[0] if len(leaves) == 1 else group from None
        finally:
            self._fail_unsent(exc)
        return False

    def _fail_unsent(self, exc: BaseException | None) -> None:
        """Whatever never got a batch (the producer stopped early) fails its waiters."""
        err = RaftlogError(f"the producer stopped before sending this record"
                           f"{f' ({type(exc).__name__})' if exc is not None else ''}; it was "
                           f"not written", code="CANCELLED")
        for lane in self._lanes.values():
            for p in lane.buffer:
                if not p.done.is_set():
                    p.error = err
                    p.done.set()
            lane.buffer.clear()
            lane.buffered = 0

    # -- choosing partitions ---------------------------------------------------------------
    def partition_for(self, record: Record, partition: int | None = None) -> int:
        """Where `record` goes (see the module docstring). For a keyless record this is the
        current sticky partition."""
        if partition is not None:
            if partition < 0 or (self.uses_topics and partition >= self.partitions):
                raise ValueError(f"topic {self.topic_name!r} has partitions 0.."
                                 f"{self.partitions - 1}, not {partition}")
            return partition
        if self.partition is not None:
            return self.partition
        if self._partitioner is None:
            return 0
        self._follow_growth()
        return self._partitioner.partition(record.key)

    def _follow_growth(self) -> None:
        """The topic grew (the client's metadata says so): hash over the new count. Keys move
        then, as in Kafka: per-key order holds within each count."""
        assert self._partitioner is not None
        meta = self.client.metadata.current
        info = meta.topics.get(self.topic_name) if meta is not None else None
        if info is not None and info.partition_count > self._partitioner.partitions:
            self._partitioner.resize(info.partition_count)

    def _placed(self, rec: Record, partition: int | None) -> Delivery:
        if self._closed or self._nursery is None:
            raise RuntimeError("use the Producer inside `async with`")
        p = Delivery(rec, record_size(rec))
        sticky = rec.key is None and partition is None and self.partition is None \
            and self._partitioner is not None
        if sticky and self._sticky_bytes and self._sticky_bytes + p.size > self.batch_bytes:
            self._move_sticky()  # the sticky partition's batch is full: the next one elsewhere
        p.partition = where = self.partition_for(rec, partition)
        if sticky:
            self._sticky_bytes += p.size
        lane = self._lanes.get(where)
        if lane is None:
            lane = self._lanes[where] = _Lane(where)
            self._nursery.start_soon(self._sender, lane)
        lane.buffer.append(p)
        lane.buffered += p.size
        if lane.buffered >= self.batch_bytes:
            lane.wake.set()
        return p

    def _move_sticky(self) -> None:
        if self._partitioner is not None:
            self._partitioner.next_batch()
        self._sticky_bytes = 0

    # -- sending -----------------------------------------------------------------------------
    def submit(self, record: bytes | str | Record, *, key: bytes | str | None = None,
               partition: int | None = None) -> Delivery:
        """Queue one record without waiting; its Delivery says when (and where: `partition`)
        it landed. `key` sets the record's key (a Record may carry its own). For streams
        whose records arrive one at a time (the CLI's `produce`): each is sent as soon as
        the previous batch of its partition is answered, or `linger` expires, or
        `batch_bytes` accumulate, whichever is first."""
        p = self._placed(_with_key(record, key), partition)
        self._lanes[p.partition].wake.set()
        return p

    async def send(self, record: bytes | str | Record, *, key: bytes | str | None = None,
                   partition: int | None = None) -> int:
        """Queue one record; returns its offset once its batch is acknowledged."""
        (d,) = await self.deliver_many([_with_key(record, key)], partition=partition)
        return d.offset

    async def send_many(self, records: Iterable[bytes | str | Record], *,
                        partition: int | None = None) -> list[int]:
        """Send records (batched per partition); their offsets, in the order given. With a
        topic of several partitions, offsets are per partition: `deliver_many` says which."""
        return [d.offset for d in await self.deliver_many(records, partition=partition)]

    async def deliver_many(self, records: Iterable[bytes | str | Record], *,
                           partition: int | None = None) -> list[Delivery]:
        """Send records and return their Deliveries once all are acknowledged (each with its
        `partition` and `offset`); raises the first error among them."""
        pending = [self._placed(as_record(r), partition) for r in records]
        for lane in self._lanes.values():
            if lane.buffer:
                lane.wake.set()
        for p in pending:
            await p.done.wait()
        errors = [p.error for p in pending if p.error is not None]
        if errors:
            raise errors[0]
        return pending

    async def _sender(self, lane: _Lane) -> None:
        while True:
            await lane.wake.wait()
            lane.wake = trio.Event()
            if lane.buffer and lane.buffered < self.batch_bytes and not self._closed \
                    and self.linger > 0:
                with trio.move_on_after(self.linger):
                    while lane.buffered < self.batch_bytes and not self._closed:
                        await lane.wake.wait()
                        lane.wake = trio.Event()
            while lane.buffer:
                batch, size = [], 0
                while lane.buffer and (not batch or size + lane.buffer[0].size
                                       <= self.batch_bytes):
                    p = lane.buffer.pop(0)
                    batch.append(p)
                    size += p.size
                lane.buffered -= size
                if self._partitioner is not None and lane.partition == self._partitioner.sticky \
                        and any(p.record.key is None for p in batch):
                    self._move_sticky()  # this batch is on its way: the next one goes elsewhere
                await self._send_batch(lane, batch)
            if self._closed:
                return

    async def _send_batch(self, lane: _Lane, batch: list[Delivery]) -> None:
        if self.uses_topics and self.client.metadata.stale:
            await self.client.refresh_metadata()  # every max_age: a grown topic is noticed
        seq = lane.sequence
        lane.sequence += 1
        try:
            res = await self.client.produce([p.record for p in batch], acks=self.acks,
                                            timeout=self.timeout, producer_id=self.producer_id,
                                            sequence=seq, topic=self.topic,
                                            partition=lane.partition)
        except RaftlogError as e:
            for p in batch:
                p.error = e
                p.done.set()
            return
        except BaseException:  # stopped (cancelled) with the request out: outcome unknown
            err = RequestTimeout("the producer stopped while this batch was in flight; it may "
                                 "or may not be in the log")
            for p in batch:
                p.error = err
                p.done.set()
            raise
        self.batches_sent += 1
        self.records_sent += len(batch)
        self.duplicates += res.duplicate
        for i, p in enumerate(batch):
            p.offset = res.base_offset + i
            p.done.set()


def _with_key(record: bytes | str | Record, key: bytes | str | None) -> Record:
    rec = as_record(record)
    if key is None:
        return rec
    return Record(rec.value, key.encode() if isinstance(key, str) else bytes(key), rec.headers)


def record_size(rec: Record) -> int:
    """A record's share of a batch, as batch_bytes counts it (payload plus a little framing)."""
    return (len(rec.value) + len(rec.key or b"") + 8
            + sum(len(k) + len(v) + 4 for k, v in rec.headers or ()))


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


__all__ = ["Delivery", "Producer"]
