"""`BlockingClient`: the client for code without a trio loop."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import trio

from raft.client.client import Client
from raft.client.consumer import BlockingConsumer, Consumer
from raft.client.producer import Producer
from raft.client.results import FetchResult, ProduceResult
from raft.client.subscription_calls import BlockingSubscriptionCalls
from storage.records import Record

T = TypeVar("T")


class BlockingClient(BlockingSubscriptionCalls):
    """The client for code without a trio loop (scripts, Spark executors): a private trio loop
    runs in a daemon thread and each call is handed to it.

        with BlockingClient("127.0.0.1:7101") as c:
            c.produce([b"a", b"b"], acks="leader")
    """

    def __init__(self, servers: str | Sequence[str], **kwargs: Any) -> None:
        self._client = Client(servers, **kwargs)
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="raftlog-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()
            await self._client.aclose()

        try:
            trio.run(main)
        except BaseException as e:  # surfaced to the constructor
            self._error = e
            self._ready.set()

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if self._token is None or self._stop is None:
            raise RuntimeError("the client is closed")

        async def run() -> T:
            return await fn(*args, **kwargs)

        return trio.from_thread.run(run, trio_token=self._token)

    def produce(self, records: Iterable[bytes | str | Record], **kwargs: Any) -> ProduceResult:
        return self._call(self._client.produce, list(records), **kwargs)

    def produce_idempotent(self, values: Iterable[bytes | str | Record], *, acks: str = "quorum",
                           batch_bytes: int = 1 << 20, linger: float = 0.0,
                           producer_id: int | None = None, topic: str | None = None,
                           partition: int | None = None) -> list[int]:
        """Send many records in batches through an idempotent Producer; their offsets (per
        partition with a `topic` of several: `produce_to_topic` says which)."""
        return [offset for _, offset in self.produce_to_topic(
            values, acks=acks, batch_bytes=batch_bytes, linger=linger,
            producer_id=producer_id, topic=topic, partition=partition)]

    def produce_to_topic(self, values: Iterable[bytes | str | Record], *, topic: str | None,
                         acks: str = "quorum", batch_bytes: int = 1 << 20, linger: float = 0.0,
                         producer_id: int | None = None, partition: int | None = None
                         ) -> list[tuple[int, int]]:
        """Send records through an idempotent Producer of `topic` (keys pick partitions);
        (partition, offset) of each, in the order given."""
        vals = list(values)

        async def go() -> list[tuple[int, int]]:
            async with Producer(self._client, acks=acks, batch_bytes=batch_bytes,
                                linger=linger, producer_id=producer_id, topic=topic,
                                partition=partition) as p:
                return [(d.partition, d.offset) for d in await p.deliver_many(vals)]

        return self._call(go)

    def fetch(self, offset: int, **kwargs: Any) -> FetchResult:
        return self._call(self._client.fetch, offset, **kwargs)

    def offset_for_time(self, timestamp_ms: int, **kwargs: Any) -> int:
        return self._call(self._client.offset_for_time, timestamp_ms, **kwargs)

    def status(self, address: str | None = None) -> dict[str, Any]:
        return self._call(self._client.status, address)

    def cluster_status(self, timeout: float = 2.0) -> dict[str, dict[str, Any]]:
        return self._call(self._client.cluster_status, timeout)

    def transfer_leader(self, to: int | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.transfer_leader, to, **kwargs)

    def add_node(self, node_id: int, address: str, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.add_node, node_id, address, **kwargs)

    def remove_node(self, node_id: int, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.remove_node, node_id, **kwargs)

    # -- topics (raft/client/topic_calls.py) ----------------------------------------------------
    def cluster_metadata(self, **kwargs: Any) -> Any:
        return self._call(self._client.cluster_metadata, **kwargs)

    def list_topics(self) -> list[Any]:
        return self._call(self._client.list_topics)

    def topic(self, name: str, **kwargs: Any) -> Any:
        return self._call(self._client.topic, name, **kwargs)

    def describe_topic(self, name: str) -> dict[str, Any]:
        return self._call(self._client.describe_topic, name)

    def create_topic(self, name: str, partitions: int, replicas: int, **kwargs: Any) -> Any:
        return self._call(self._client.create_topic, name, partitions, replicas, **kwargs)

    def alter_topic(self, name: str, **kwargs: Any) -> Any:
        return self._call(self._client.alter_topic, name, **kwargs)

    def delete_topic(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.delete_topic, name, **kwargs)

    def move_partition(self, name: str, partition: int, replicas: list[int],
                       **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.move_partition, name, partition, replicas, **kwargs)

    def partition_membership(self, name: str, partition: int) -> dict[str, Any] | None:
        return self._call(self._client.partition_membership, name, partition)

    def consumer(self, subscription: str, **kwargs: Any) -> BlockingConsumer:
        """A `Consumer` of `subscription` (same keywords) to iterate with a plain `for`:

            with client.consumer("orders", auto_commit_ms=1000) as consumer:
                for record in consumer:
                    handle(record)
        """
        return BlockingConsumer(self, Consumer(self._client, subscription, **kwargs))

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            stop = self._stop
            try:
                trio.from_thread.run_sync(stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._thread.join(timeout=10)
            self._token = None

    def __enter__(self) -> "BlockingClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BlockingClient"]
