"""`Producer`: idempotent batching on top of a `Client`. It has a random 63-bit id and numbers
its batches; a retry after a timeout, a dropped connection or a leader change resends the same
(producer id, sequence), so the cluster writes the batch once and answers the retry with the
original offsets."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from raft.client.client import Client, as_record
from raft.client.errors import RaftlogError, RequestTimeout
from storage.records import Record


@dataclass(slots=True)
class Delivery:
    """One record handed to `Producer.submit`: `await delivery.wait()` returns its offset once
    its batch is acknowledged, or raises the batch's typed error."""

    record: Record
    size: int
    done: trio.Event = field(default_factory=trio.Event)
    offset: int = -1
    error: BaseException | None = None

    async def wait(self) -> int:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.offset


class Producer:
    """Idempotent, batching producer. Use inside a nursery-owning context:

        async with Client(servers) as c, Producer(c, acks="quorum") as p:
            offset = await p.send(b"value")            # batched with concurrent sends
            offsets = await p.send_many(lines)        # one call, thousands of records

    Records wait at most `linger` seconds (or until `batch_bytes` accumulate) before they go
    out as one batch. Each batch gets the next sequence number; retries reuse it."""

    def __init__(self, client: Client, *, acks: str = "quorum", linger: float = 0.005,
                 batch_bytes: int = 1 << 20, timeout: float | None = None,
                 producer_id: int | None = None) -> None:
        if acks not in ("quorum", "leader", "none"):
            raise ValueError(f"acks={acks!r}: choose quorum, leader or none")
        if batch_bytes < 1 or linger < 0:
            raise ValueError("batch_bytes must be >= 1 and linger >= 0")
        self.client = client
        self.acks = acks
        self.linger = linger
        self.batch_bytes = batch_bytes
        self.timeout = client.timeout if timeout is None else timeout
        self.producer_id = producer_id or random.SystemRandom().randrange(1, 2**63)
        self._sequence = 0
        self._buffer: list[Delivery] = []
        self._buffered = 0
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None
        self._closed = False
        self.records_sent = 0
        self.batches_sent = 0
        self.duplicates = 0

    async def __aenter__(self) -> "Producer":
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._sender)
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        """A clean exit sends what is still buffered; an exit by exception (including a
        typed RaftlogError from the body) stops at once and lets that exception propagate as
        it is, never wrapped in an ExceptionGroup."""
        self._closed = True
        self._wake.set()
        assert self._nursery is not None
        if exc is not None:
            self._nursery.cancel_scope.cancel()
        try:
            await self._nursery_cm.__aexit__(None, None, None)
        except BaseExceptionGroup as group:  # the sender itself failed
            leaves = _leaves(group)
            if exc is None:
                raise leaves[0] if len(leaves) == 1 else group from None
        finally:
            self._fail_unsent(exc)
        return False

    def _fail_unsent(self, exc: BaseException | None) -> None:
        """Whatever never got a batch (the producer stopped early) fails its waiters."""
        if not self._buffer:
            return
        err = RaftlogError(f"the producer stopped before sending this record"
                           f"{f' ({type(exc).__name__})' if exc is not None else ''}; it was "
                           f"not written", code="CANCELLED")
        for p in self._buffer:
            if not p.done.is_set():
                p.error = err
                p.done.set()
        self._buffer.clear()
        self._buffered = 0

    def submit(self, record: bytes | str | Record) -> Delivery:
        """Queue one record without waiting; its Delivery says when (and where) it landed.
        For streams whose records arrive one at a time (the CLI's `produce`): each is sent
        as soon as the previous batch is answered, or `linger` expires, or `batch_bytes`
        accumulate, whichever is first."""
        if self._closed or self._nursery is None:
            raise RuntimeError("use the Producer inside `async with`")
        rec = as_record(record)
        p = Delivery(rec, record_size(rec))
        self._buffer.append(p)
        self._buffered += p.size
        self._wake.set()
        return p

    async def send(self, record: bytes | str | Record) -> int:
        """Queue one record; returns its offset once its batch is acknowledged."""
        (offset,) = await self.send_many([record])
        return offset

    async def send_many(self, records: Iterable[bytes | str | Record]) -> list[int]:
        if self._closed or self._nursery is None:
            raise RuntimeError("use the Producer inside `async with`")
        pending = []
        for r in records:
            rec = as_record(r)
            p = Delivery(rec, record_size(rec))
            pending.append(p)
            self._buffer.append(p)
            self._buffered += p.size
            if self._buffered >= self.batch_bytes:
                self._wake.set()
        self._wake.set()
        for p in pending:
            await p.done.wait()
        errors = [p.error for p in pending if p.error is not None]
        if errors:
            raise errors[0]
        return [p.offset for p in pending]

    async def _sender(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._buffer and self._buffered < self.batch_bytes and not self._closed \
                    and self.linger > 0:
                with trio.move_on_after(self.linger):
                    while self._buffered < self.batch_bytes and not self._closed:
                        await self._wake.wait()
                        self._wake = trio.Event()
            while self._buffer:
                batch, size = [], 0
                while self._buffer and (not batch or size + self._buffer[0].size
                                        <= self.batch_bytes):
                    p = self._buffer.pop(0)
                    batch.append(p)
                    size += p.size
                self._buffered -= size
                await self._send_batch(batch)
            if self._closed:
                return

    async def _send_batch(self, batch: list[Delivery]) -> None:
        seq = self._sequence
        self._sequence += 1
        try:
            res = await self.client.produce([p.record for p in batch], acks=self.acks,
                                            timeout=self.timeout, producer_id=self.producer_id,
                                            sequence=seq)
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
