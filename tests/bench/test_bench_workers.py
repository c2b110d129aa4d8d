"""The bench's process plumbing and failover arithmetic, without a cluster."""

from __future__ import annotations

import pytest
import trio

from bench.workers import Sync, WorkerError, WorkerGroup
from bench.workloads.failover import outage, timeline


async def _count_rounds(arg: int, sync: Sync) -> None:
    sync.ready()
    k = 0
    while True:
        k += 1
        t0 = await sync.wait_round(k)
        if t0 is None:
            return
        await trio.sleep(0)
        sync.report(k, {"arg": arg, "round": k, "t0": t0})


async def _fail(arg: int, sync: Sync) -> None:
    sync.ready()
    await sync.wait_round(1)
    raise RuntimeError(f"boom {arg}")


def test_rounds_start_together_and_report_in_order() -> None:
    with WorkerGroup(_count_rounds, [10, 20]) as group:
        for k in (1, 2):
            t0, res = group.round(timeout=60)
            assert [r["arg"] for r in res] == [10, 20]
            assert all(r["round"] == k and r["t0"] == t0 for r in res)
    assert all(not p.is_alive() for p in group.procs)


def test_a_failing_generator_surfaces_its_traceback() -> None:
    with pytest.raises(WorkerError, match="boom 1"):
        with WorkerGroup(_fail, [1]) as group:
            group.round(timeout=60)


def test_outage_counts_only_writes_sent_after_the_event_and_acked_elsewhere() -> None:
    ev = 100.0
    events = [
        (99.0, 99.1, True, "a"),   # before the event
        (100.1, 100.2, True, "a"),  # the old leader still acking (transfer in progress)
        (100.2, 100.9, False, "b"),
        (100.5, 101.4, True, "b"),  # first write after the event acked by the new leader
        (101.0, 101.2, True, "b"),
    ]
    assert outage(events, ev, "a") == pytest.approx(1.2)
    assert outage(events[:3], ev, "a") is None
    pts = timeline(events, ev)
    assert pts[0] == (-1.0, pytest.approx(100.0), True) and len(pts) == 5
