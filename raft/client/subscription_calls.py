"""The subscription requests as `Client` methods (a mixin; raft/client/client.py inherits it).

Positions are the next offset to deliver. Every call that changes a subscription is answered
once the log entry carrying it commits on a majority, with what the cluster decided; errors
are typed (raft.client.errors: UnknownSubscription, SubscriptionLeased, PositionBehind,
PositionPastHighWatermark, InvalidSubscriptionName). `raft.client.consumer.Consumer` builds
reading on top of these.

A subscription lives in one topic partition's log (`topic`, `partition`; default the default
topic's partition 0, as before topics): its position is an offset of that partition, and the
request goes to that partition's leader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from raft.client.topic_calls import where_fields
from raft.protocol.subscription_requests import SubList, SubRequest

if TYPE_CHECKING:
    from raft.client.commits import CommitCoalescer

Where = int | Literal["start", "end"]


class SubscriptionCalls:
    """Requires `call(request, timeout=...)`, `timeout` and `coalescer` (Client has them).
    Requests are raft.protocol's typed ones (SubRequest, SubList), which own the field names."""

    timeout: float
    coalescer: "CommitCoalescer"

    async def call(self, request: Any, *, timeout: float | None = None) -> dict[str, Any]:
        raise NotImplementedError

    async def _sub(self, t: str, timeout: float | None, name: str, *, consumer: str = "",
                   initial: Where | None = None, lease_ms: int = 0, auto_reset: str = "",
                   expect: int = -1, member: str = "", topic: str | None = None,
                   partition: int = 0) -> dict[str, Any]:
        """One subscription operation `t` (a SubRequest; which fields it sends is the
        protocol's to say)."""
        budget = self.timeout if timeout is None else timeout
        return await self.call(SubRequest(t, name, _timeout_ms(budget), consumer,
                                          initial=initial, lease_ms=lease_ms,
                                          auto_reset=auto_reset, expect=expect,
                                          member=member, **where_fields(topic, partition)),
                               timeout=budget)

    async def subscription_open(self, name: str, *, consumer: str = "",
                                start: Where = "start", lease_ms: int = 0,
                                auto_reset: str | None = None, member: str = "",
                                timeout: float | None = None, topic: str | None = None,
                                partition: int = 0) -> dict[str, Any]:
        """Create `name` at `start` ("start", "end" or an offset) if it does not exist, take or
        renew the lease when lease_ms > 0, and store `auto_reset` ("none", "earliest",
        "latest") as its reset policy if given; the subscription (its `position` is where to
        read, its `auto_reset` the policy). `member` ("watch", "take") is a topic
        subscription member's round (raft/client/topic_subscription.py): never refused for a
        lease, the answer names the holder and the members."""
        reply = await self._sub("sub_open", timeout, name, consumer=consumer,
                                initial=start, lease_ms=lease_ms, auto_reset=auto_reset or "",
                                member=member, topic=topic, partition=partition)
        return reply["subscription"]

    async def subscription_commit(self, name: str, position: int, *, consumer: str = "",
                                  lease_ms: int = 0, timeout: float | None = None,
                                  topic: str | None = None,
                                  partition: int = 0) -> dict[str, Any]:
        """Commit `position` (the next offset to deliver: last processed offset + 1); returns
        once the commit is acknowledged at quorum. Commits made through this client at about the
        same time travel in one request, each with its own result (raft/client/commits.py)."""
        return await self.coalescer.commit(name, position, consumer=consumer,
                                           lease_ms=lease_ms,
                                           timeout=self.timeout if timeout is None else timeout,
                                           where=where_fields(topic, partition))

    async def subscription_reset(self, name: str, to: Where, *, consumer: str = "",
                                 expect: int | None = None,
                                 timeout: float | None = None, topic: str | None = None,
                                 partition: int = 0) -> dict[str, Any]:
        """Move `name` to `to` ("start", "end" or an offset), back or forward; creates it.
        With `expect`, only if its position is still `expect` (else it stays, and the answer
        says where it is). A reset forward adds what it passed over to `skipped_offsets`."""
        reply = await self._sub("sub_reset", timeout, name, consumer=consumer, initial=to,
                                expect=-1 if expect is None else expect, topic=topic,
                                partition=partition)
        return reply["subscription"]

    async def subscription_pin(self, name: str, *, start: Where = "start", consumer: str = "",
                               timeout: float | None = None, topic: str | None = None,
                               partition: int = 0) -> dict[str, Any]:
        """Fix the end of an incremental read (Spark): `pin_end` stays until a commit reaches
        it, so a retried read covers the same range."""
        reply = await self._sub("sub_pin", timeout, name, consumer=consumer, initial=start,
                                topic=topic, partition=partition)
        return reply["subscription"]

    async def subscription_release(self, name: str, consumer: str, *, leave: bool = False,
                                   timeout: float | None = None, topic: str | None = None,
                                   partition: int = 0) -> dict[str, Any]:
        """Give up the lease `consumer` holds on `name` (and with `leave`, stop being one of
        its members there)."""
        reply = await self._sub("sub_release", timeout, name, consumer=consumer,
                                member="leave" if leave else "", topic=topic,
                                partition=partition)
        return reply["subscription"]

    async def subscription_delete(self, name: str, *, timeout: float | None = None,
                                  topic: str | None = None, partition: int = 0) -> None:
        await self._sub("sub_delete", timeout, name, topic=topic, partition=partition)

    async def subscription(self, name: str, *, timeout: float | None = None,
                           topic: str | None = None, partition: int = 0) -> dict[str, Any]:
        """One subscription with its lag (`lag_records`, `lag_bytes`) and lease holder."""
        reply = await self._sub("sub_get", timeout, name, topic=topic, partition=partition)
        return reply["subscription"]

    async def subscriptions(self, prefix: str = "", *, timeout: float | None = None,
                            topic: str | None = None,
                            partition: int = 0) -> list[dict[str, Any]]:
        """Every subscription (whose name starts with `prefix`), sorted by name, with lag."""
        out: list[dict[str, Any]] = []
        after = ""
        while True:
            budget = self.timeout if timeout is None else timeout
            reply = await self.call(SubList(prefix, after, timeout_ms=_timeout_ms(budget),
                                            **where_fields(topic, partition)),
                                    timeout=budget)
            out.extend(reply["subscriptions"])
            if not reply.get("more") or not reply["subscriptions"]:
                return out
            after = reply["subscriptions"][-1]["name"]


def _timeout_ms(budget_s: float) -> int:
    # A node refuses timeout_ms above its max_timeout_ms (120 s by default).
    return max(1, min(120_000, int(budget_s * 1000)))


class BlockingSubscriptionCalls:
    """The same calls for BlockingClient: each is run on its private trio loop."""

    _client: Any

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def subscription_open(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.subscription_open, name, **kwargs)

    def subscription_commit(self, name: str, position: int, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.subscription_commit, name, position, **kwargs)

    def subscription_reset(self, name: str, to: Where, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.subscription_reset, name, to, **kwargs)

    def subscription_pin(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.subscription_pin, name, **kwargs)

    def subscription_release(self, name: str, consumer: str, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.subscription_release, name, consumer, **kwargs)

    def subscription_delete(self, name: str, **kwargs: Any) -> None:
        self._call(self._client.subscription_delete, name, **kwargs)

    def subscription(self, name: str, **kwargs: Any) -> dict[str, Any]:
        return self._call(self._client.subscription, name, **kwargs)

    def subscriptions(self, prefix: str = "", **kwargs: Any) -> list[dict[str, Any]]:
        return self._call(self._client.subscriptions, prefix, **kwargs)


__all__ = ["BlockingSubscriptionCalls", "SubscriptionCalls", "Where"]
