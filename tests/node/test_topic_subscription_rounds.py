"""A topic subscription member's rounds against a stand-in for the client (no nodes): a
partition that does not answer keeps the last round's view, a round nobody answers is an error,
and the member takes its share of what the partitions say is free."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from raft.client import TopicSubscription, UnavailableError
from raft.core.subscription_members import PartitionView


class FakePartitions:
    """Each partition's holder and members, as the table would answer a member's open."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.holders: dict[int, str | None] = {p: None for p in range(count)}
        self.members: dict[int, set[str]] = {p: set() for p in range(count)}
        self.down: set[int] = set()
        self.metadata = SimpleNamespace(current=None)

    async def topic(self, name: str) -> Any:
        return SimpleNamespace(partition_count=self.count)

    async def subscription_open(self, name: str, *, consumer: str, member: str = "",
                                partition: int = 0, **_: Any) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if partition in self.down:
            raise UnavailableError(f"partition {partition} has no leader")
        if member:
            self.members[partition].add(consumer)
        if member == "take" and self.holders[partition] in (None, consumer):
            self.holders[partition] = consumer
        return {"name": name, "position": 0, "auto_reset": "none",
                "lease_holder": self.holders[partition],
                "members": sorted(self.members[partition])}


def test_a_partition_that_does_not_answer_keeps_its_last_view() -> None:
    async def main() -> None:
        fake = FakePartitions(4)
        fake.holders[3] = "other"
        fake.members[3].add("other")
        m = TopicSubscription(fake, "t", "g", member_id="me", lease_ms=60_000, follow=False)
        assert await m.open() == [0, 1]  # two members, four partitions: two each
        fake.down = {1}
        await m.rebalance()
        assert m.assigned == [0, 1] and set(m.failures) == {1}
        assert m.views[1] == PartitionView("me", ("me",))  # as the last round saw it
        fake.down = {0, 1, 2, 3}
        with pytest.raises(UnavailableError):
            await m.rebalance()

    trio.run(main)
