"""The node's one scrub scheduler (raft/node/scrub_scheduler.py), on in-memory logs under trio's
mock clock: many small logs share one call, the byte rate is the node's (not per group), a big
log does not starve small ones, and what a batched call finds (damage, a read error) goes to the
group whose log it was in, never to a neighbour in the batch."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from inproc_cluster import running_cluster, trio_test
from raft.node.scrub_scheduler import MAX_BATCH, NodeScrubber
from raft.node.scrubber import IDLE_PASS_S, Scrubber
from storage.memory import MemoryLog
from test_multigroup_inproc import add_groups
from test_scrubber import Host, flushed_log

SLICE = 64 << 10


class BrokenLog(MemoryLog):
    """A log whose disk refuses every scrub read."""

    def scrub(self, offset: int, max_bytes: int) -> Any:
        raise OSError("read refused by the disk (test)")


def node_of(logs: list[MemoryLog], rate: float = 64.0,
            slice_bytes: int = SLICE) -> tuple[NodeScrubber, list[Host], list[Scrubber]]:
    scheduler = NodeScrubber(rate, slice_bytes)
    hosts = [Host(lg) for lg in logs]
    scrubbers = [Scrubber(h, rate, slice_bytes) for h in hosts]
    for s in scrubbers:
        scheduler.add(s)
    return scheduler, hosts, scrubbers


def run_for(scheduler: NodeScrubber, seconds: float) -> None:
    async def main() -> None:
        with trio.move_on_after(seconds):
            await scheduler.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_many_small_logs_share_one_call_per_round() -> None:
    """200 small logs: every one is scrubbed, in a few calls, not a thread hop each."""
    scheduler, hosts, scrubbers = node_of([flushed_log(2, 100) for _ in range(200)])
    run_for(scheduler, 5.0)
    assert all(s.stats.passes >= 1 for s in scrubbers)
    round_calls = -(-200 // MAX_BATCH)  # ceil
    # A second pass a second later (MIN_PASS_S) finds them unchanged: the next waits
    # IDLE_PASS_S, so 5 s hold two rounds.
    assert scheduler.calls == 2 * round_calls
    assert scheduler.visits == 400
    assert sum(h.calls for h in hosts) == scheduler.calls  # one run_io per call, not per log


def test_idle_logs_coming_due_together_share_calls() -> None:
    """After a minute unchanged logs are due again: still batched, not one call each."""
    scheduler, _hosts, scrubbers = node_of([flushed_log(2, 100) for _ in range(200)])
    run_for(scheduler, 3 * IDLE_PASS_S + 1)
    assert all(s.stats.passes >= 3 for s in scrubbers)
    assert scheduler.calls <= 4 * -(-200 // MAX_BATCH)


def test_the_byte_rate_is_the_nodes_not_each_groups() -> None:
    """Two logs of 1 MiB at 0.25 MiB/s for 2 s: half a MiB in all (per group it would be 1)."""
    scheduler, _hosts, scrubbers = node_of([flushed_log(256, 4096) for _ in range(2)],
                                           rate=0.25)
    run_for(scheduler, 2.0)
    total = sum(s.stats.bytes_read for s in scrubbers)
    assert 0.5 * (1 << 20) <= total <= 0.5 * (1 << 20) + SLICE + 4200
    assert all(s.stats.bytes_read > 0 for s in scrubbers)  # both visited, in turn


def test_a_big_log_does_not_starve_small_ones() -> None:
    """A 4 MiB log takes 64 slices a pass; the small logs complete passes meanwhile."""
    big = flushed_log(1024, 4096)
    scheduler, _hosts, scrubbers = node_of([big] + [flushed_log(2, 100) for _ in range(10)],
                                           rate=1.0)
    run_for(scheduler, 2.0)
    assert scrubbers[0].stats.passes == 0  # 2 s at 1 MiB/s: half of it read
    assert all(s.stats.passes >= 1 for s in scrubbers[1:])


def test_damage_found_in_a_batched_call_goes_to_its_own_group() -> None:
    """Three small logs scrubbed in one call, the middle one rotten: only its group is woken
    (its core re-fetches the batch) and only its scrubber reports the find."""
    logs = [flushed_log(4, 100) for _ in range(3)]
    logs[1].flip_bits(2)
    scheduler, hosts, scrubbers = node_of(logs)
    run_for(scheduler, 0.5)
    assert scheduler.calls == 1 and scheduler.visits == 3
    assert [h.wakes for h in hosts] == [0, 1, 0]
    assert [s.stats.found for s in scrubbers] == [0, 1, 0]
    assert [(d.first, d.last) for d in logs[1].damaged()] == [(2, 2)]
    assert all(h.failure is None for h in hosts)


def test_a_read_error_in_a_batched_call_fail_stops_its_own_group_only() -> None:
    broken = BrokenLog()
    scheduler, hosts, scrubbers = node_of([flushed_log(4, 100), broken, flushed_log(4, 100)])
    run_for(scheduler, 0.5)
    assert [h.failure is not None for h in hosts] == [False, True, False]
    assert isinstance(hosts[1].failure, OSError)
    assert scrubbers[0].stats.passes == 1 and scrubbers[2].stats.passes == 1  # in 0.5 s


def test_a_forgotten_group_is_not_visited_and_off_at_rate_zero() -> None:
    scheduler, hosts, scrubbers = node_of([flushed_log(2, 100) for _ in range(2)])

    async def main() -> None:
        await scheduler.forget(scrubbers[1])
        with trio.move_on_after(5.0):
            await scheduler.run()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert hosts[0].calls == 2 and hosts[1].calls == 0  # two passes, then idle
    off, off_hosts, _s = node_of([flushed_log(2, 100)], rate=0)
    run_for(off, 5.0)
    assert off.calls == 0 and off_hosts[0].calls == 0


@trio_test
async def test_a_node_scrubs_every_group_from_its_one_task_and_forgets_removed_ones() -> None:
    """In a running node the groups start no scrub task of their own: the node's scheduler
    holds each group's scrubber from `add_group` until `remove_group`."""
    async with running_cluster(3) as cluster:
        await cluster.wait_leader()
        await add_groups(cluster, [101, 102])
        for node in cluster.nodes:
            assert len(node.scrub_scheduler) == len(node.registry) == 4
            assert all(g.scrub_scheduler is node.scrub_scheduler
                       for g in node.registry.groups())
        node = cluster.nodes[0]
        removed = node.registry.get(102)
        await node.remove_group(102)
        assert len(node.scrub_scheduler) == 3
        assert removed.scrubber not in node.scrub_scheduler._targets
