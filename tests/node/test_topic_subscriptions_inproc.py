"""Subscriptions over a topic against real nodes in this process (issue 26 item 6): members of
one subscription share a topic's 6 partitions (3/3, then 2/2/2 when a third joins), a member that
closes hands its partitions over, a member that stops renewing loses its partitions after the
lease and its late commit is refused, and every record is delivered (exactly once while members
move gracefully; at least once, and committed exactly once, across a member that stops).

Leases are decided by the leader's entry stamps; the test moves that clock
(`subscription_service._wall_ms`) instead of waiting, and drives the members' rounds itself
(`rebalance()`), with a lease long enough that nothing renews behind its back. No sleeps."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from unittest import mock

import pytest
import trio

from inproc_cluster import DEADLINE_S, running_cluster, trio_test
from raft.client import Client, Producer, SubscriptionLeased, TopicSubscription
from raft.node import subscription_service

LEASE_MS = 60_000
PARTITIONS = 6


@contextmanager
def leader_clock() -> Iterator[list[int]]:
    """The leaders' entry stamps run `shift[0]` ms ahead of the wall clock."""
    shift = [0]
    with mock.patch.object(subscription_service, "_wall_ms",
                           lambda: int(time.time() * 1000) + shift[0]):
        yield shift


@asynccontextmanager
async def topic_t(deadline_s: float) -> AsyncIterator[Client]:
    """A client of a 3-node cluster with topic "t" (PARTITIONS partitions, 3 replicas each),
    all within one deadline: the setup every test here starts from."""
    async with running_cluster(3) as cluster:
        servers = [n.address for n in cluster.nodes]
        with trio.fail_after(deadline_s):
            async with Client(servers, timeout=DEADLINE_S) as c:
                await c.create_topic("t", partitions=PARTITIONS, replicas=3)
                yield c


async def produce_each(c: Client, values: Callable[[int], list[bytes]]) -> set[tuple[int, int]]:
    """Write `values(partition)` to every partition of "t" in turn: the (partition, offset)
    pairs written."""
    sent: set[tuple[int, int]] = set()
    async with Producer(c, topic="t", linger=0) as p:
        for part in range(PARTITIONS):
            offs = await p.send_many(values(part), partition=part)
            sent.update((part, o) for o in offs)
    return sent


async def take(m: TopicSubscription, n: int,
               into: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """The member's next `n` records, noted in `into`: their (partition, offset) pairs."""
    out = []
    for _ in range(n):
        r = await m.__anext__()
        into.append((r.partition, r.offset, m.member_id))
        out.append((r.partition, r.offset))
    return out


async def settle(members: list[TopicSubscription], total: int = PARTITIONS,
                 max_rounds: int = 8) -> dict[str, list[int]]:
    """Rounds of every member until every partition is held and nothing moved for a round."""
    last: dict[str, list[int]] | None = None
    for _ in range(max_rounds):
        for m in members:
            await m.rebalance()
        now = {m.member_id: m.assigned for m in members}
        if now == last and sum(len(v) for v in now.values()) == total:
            return now
        last = now
    raise AssertionError(f"members did not settle in {max_rounds} rounds: {last}")


async def drain(member: TopicSubscription, into: list[tuple[int, int, str]]) -> None:
    """Read the member's partitions to their high watermarks and commit."""
    async for r in member:
        into.append((r.partition, r.offset, member.member_id))
    await member.commit()


def member(c: Client, name: str) -> TopicSubscription:
    return TopicSubscription(c, "t", "g", member_id=name, lease_ms=LEASE_MS, auto_commit_ms=0,
                             follow=False)


@trio_test
async def test_members_share_a_topic_rebalance_and_fence_a_member_that_stops() -> None:
    with leader_clock() as shift:
        async with topic_t(DEADLINE_S * 6) as c:
            produced: set[tuple[int, int]] = set()

            async def produce(n: int) -> None:
                produced.update(await produce_each(
                    c, lambda part: [f"{part}:{i}".encode() for i in range(n)]))

            got: list[tuple[int, int, str]] = []
            await produce(5)
            a, b = member(c, "A"), member(c, "B")
            await a.open()
            await b.open()
            held = await settle([a, b])
            assert sorted(map(len, held.values())) == [3, 3]
            assert set(a.assigned).isdisjoint(b.assigned)
            await drain(a, got)
            await drain(b, got)

            # A third member joins: each of A and B gives up one partition.
            await produce(5)
            c3 = member(c, "C")
            await c3.open()
            before = {m.member_id: set(m.assigned) for m in (a, b)}
            held = await settle([a, b, c3])
            assert sorted(map(len, held.values())) == [2, 2, 2]
            assert all(len(before[m] & set(held[m])) == 2 for m in ("A", "B"))
            for m in (a, b, c3):
                await drain(m, got)
            assert Counter((p, o) for p, o, _ in got) == Counter(produced)

            # A closes (commits, releases, leaves): B and C take its partitions.
            await produce(5)
            a_had = set(a.assigned)
            await drain(a, got)
            await a.aclose()
            held = await settle([b, c3])
            assert sorted(map(len, held.values())) == [3, 3]
            assert a_had <= set(held["B"]) | set(held["C"])
            for m in (b, c3):
                await drain(m, got)
            assert Counter((p, o) for p, o, _ in got) == Counter(produced)

            # C reads, commits some, processes two more, then stops renewing.
            await produce(5)
            c_had = c3.assigned
            await take(c3, 3, got)
            await c3.commit()
            late = await take(c3, 2, got)
            shift[0] += LEASE_MS * 2 // 3
            await b.rebalance()  # B renews; C does not
            shift[0] += LEASE_MS // 2  # past C's lease, within B's
            held = await settle([b])
            assert held["B"] == list(range(PARTITIONS))
            # C's late commit is refused: it loses its partitions, positions stay.
            lost_at = {p: (await c.subscription("g", topic="t", partition=p))["position"]
                       for p in c_had}
            with pytest.raises(SubscriptionLeased):
                await c.subscription_commit("g", lost_at[c_had[0]] + 1, consumer="C",
                                            lease_ms=LEASE_MS, topic="t",
                                            partition=c_had[0])
            await c3.commit()  # refused where it had something to commit
            assert {p for p, _ in late} <= set(c3.lost)
            await c3.rebalance()  # its next round shows B holding the rest
            assert c3.assigned == [] and sorted(c3.lost) == sorted(c_had)
            for p in c_had:
                sub = await c.subscription("g", topic="t", partition=p)
                assert sub["position"] == lost_at[p] and sub["lease_holder"] == "B"
            await drain(b, got)
            # At least once: every record; twice only what C processed after its last
            # commit (B read it again from the committed position).
            counts = Counter((p, o) for p, o, _ in got)
            assert set(counts) == produced
            assert sorted(k for k, n in counts.items() if n > 1) == sorted(late)
            # Every partition's position is past its last record (positions only move forward, so
            # each offset was committed once).
            for p in range(PARTITIONS):
                sub = await c.subscription("g", topic="t", partition=p)
                assert sub["position"] > max(o for q, o in produced if q == p)
                assert sub["lag_records"] == 0
            await b.aclose()
            await c3.aclose()  # C came back in its last round: it leaves too
            listed = await c.subscription("g", topic="t", partition=0)
            assert listed["members"] == [] and listed["lease_holder"] is None


@trio_test
async def test_a_member_restarted_under_its_id_resumes_its_partitions_from_their_commits() -> None:
    async with topic_t(DEADLINE_S * 4) as c:
        produced = await produce_each(c, lambda part: [b"v"] * 5)
        got: list[tuple[int, int, str]] = []
        a, b = member(c, "A"), member(c, "B")
        await a.open()
        await b.open()
        held = await settle([a, b])
        await take(a, 4, got)
        await a.commit()
        uncommitted = await take(a, 2, got)
        # A dies here (no commit, no release) and comes back under the same id: its
        # leases are its own, so it takes its partitions back at once.
        again = member(c, "A")
        assert await again.open() == held["A"]
        assert (await settle([again, b])) == held
        await drain(again, got)
        await drain(b, got)
        counts = Counter((p, o) for p, o, _ in got)
        assert set(counts) == produced
        assert sorted(k for k, n in counts.items() if n > 1) == sorted(uncommitted)
        for p in range(PARTITIONS):
            assert (await c.subscription("g", topic="t", partition=p))["lag_records"] == 0


@trio_test
async def test_members_iterating_on_their_own_share_and_hand_over_exactly_once() -> None:
    """The rounds run inside the iterators (heartbeat 200 ms), records arrive while they read,
    a member closes half-way: every record is delivered once."""
    async with topic_t(DEADLINE_S * 4) as c:
        produced: set[tuple[int, int]] = set()
        got: list[tuple[int, int, str]] = []
        seen: set[tuple[int, int]] = set()
        all_seen = [trio.Event()]

        def check() -> None:
            if produced <= seen:
                all_seen[0].set()

        async def produce(n: int) -> None:
            sent = await produce_each(c, lambda part: [b"v"] * n)
            produced.update(sent)  # all at once: check() must not see half of it
            all_seen[0] = trio.Event()
            check()

        members: dict[str, TopicSubscription] = {}
        shared = trio.Event()

        def moved(*_: object) -> None:
            if sorted(len(m.assigned) for m in members.values()) == [2, 2, 2]:
                shared.set()

        async def seen_all() -> None:
            await all_seen[0].wait()

        async def run(name: str, scope: trio.CancelScope) -> None:
            with scope:
                async with TopicSubscription(c, "t", "g", member_id=name,
                                             lease_ms=10_000, heartbeat_ms=200,
                                             auto_commit_ms=50, max_wait=0.2,
                                             on_assigned=moved,
                                             on_revoked=moved) as m:
                    members[name] = m
                    async for r in m:
                        got.append((r.partition, r.offset, name))
                        seen.add((r.partition, r.offset))
                        check()

        scopes = {n: trio.CancelScope() for n in "ABC"}
        async with trio.open_nursery() as nursery:
            for n in "ABC":
                nursery.start_soon(run, n, scopes[n])
            await shared.wait()  # 2/2/2, reached by the members' own rounds
            await produce(10)
            await seen_all()
            # C leaves gracefully: its iterator ends at the next record boundary.
            scopes["C"].cancel()
            await produce(10)
            await seen_all()
            for s in scopes.values():
                s.cancel()
        counts = Counter((p, o) for p, o, _ in got)
        assert set(counts) == produced
        assert [k for k, n in counts.items() if n > 1] == []
        assert {m for _, _, m in got} >= {"A", "B"}
