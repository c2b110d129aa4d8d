"""The collector is refrozen after a burst of group creations or deletions (raft/node/gc_freeze.py).

Groups created after the start-up freeze were walked by every generation-2 collection (0.1-0.3 s
of CPU with 1,000 partitions); a refreeze takes them out. Deleted groups must not stay frozen for
good: their reference cycles would never be freed. The freeze tests run in a child interpreter,
since freezing is process-wide and this one runs the rest of the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import trio
import trio.testing

from raft.node.gc_freeze import GcRefreezer

REPO = Path(__file__).resolve().parents[2]

# "Groups": objects in reference cycles (as a group's callbacks point back at it), 200 of them
# with 50 objects each.
CHILD = textwrap.dedent("""
    import gc, json, sys
    from raft.node.gc_freeze import GcRefreezer

    class Part:
        def __init__(self, owner):
            self.owner = owner
    class Group:
        def __init__(self):
            self.parts = [Part(self) for _ in range(49)]

    out = {}
    r = GcRefreezer()
    out["never_froze"] = r.refreeze(removed=False)
    gc.collect(); gc.freeze()
    base = gc.get_freeze_count()
    groups = {g: Group() for g in range(200)}
    out["created_tracked"] = sum(isinstance(o, Group) for o in gc.get_objects())
    r.refreeze(removed=False)
    out["after_create_tracked"] = sum(isinstance(o, Group) for o in gc.get_objects())
    out["frozen_grew"] = gc.get_freeze_count() - base
    del groups
    r.refreeze(removed=REMOVED)
    out["left_frozen"] = gc.get_freeze_count() - base
    print(json.dumps(out))
""")


def _child(removed: bool) -> dict:
    import json
    done = subprocess.run([sys.executable, "-c", CHILD.replace("REMOVED", str(removed))],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_new_groups_leave_the_collections_and_deleted_ones_are_freed() -> None:
    out = _child(removed=True)
    assert out["never_froze"] is False  # a process that never froze is left alone
    assert out["created_tracked"] == 200  # before the refreeze every collection walks them
    assert out["after_create_tracked"] == 0 and out["frozen_grew"] >= 200 * 50
    # Unfrozen and collected: the deleted groups' cycles are gone, nothing of them stays.
    assert out["left_frozen"] < 200 * 50 / 10, out


def test_deleted_groups_would_leak_if_the_refreeze_did_not_unfreeze_first() -> None:
    """What the unfreeze is for: frozen cycles are never collected."""
    out = _child(removed=False)
    assert out["left_frozen"] >= 200 * 50, out


def test_one_refreeze_per_burst_once_it_settles() -> None:
    calls: list[tuple[float, bool]] = []

    async def main() -> None:
        r = GcRefreezer(settle_s=1.0, max_wait_s=10.0, follow_up_s=5.0)
        r.refreeze = lambda *, removed: calls.append((trio.current_time(), removed))  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(r.run)
            start = trio.current_time()
            for _ in range(5):  # a burst of creations, 0.5 s apart
                r.changed(removed=False)
                await trio.sleep(0.5)
            assert calls == []
            await trio.sleep(2)
            assert len(calls) == 1 and calls[0][1] is False
            # (settled: a whole settle_s with no change, at most two after the last change)
            assert calls[0][0] - start <= 2.0 + 2 * 1.0
            await trio.sleep(5)  # and once more, for what the new groups created meanwhile
            assert len(calls) == 2 and calls[1][1] is False
            assert calls[1][0] - calls[0][0] == 5.0
            await trio.sleep(30)
            assert len(calls) == 2  # nothing changed: nothing more
            r.changed(removed=True)  # a deletion: the next refreeze unfreezes first
            r.changed(removed=False)
            await trio.sleep(3)
            assert len(calls) == 3 and calls[2][1] is True
            r.changed(removed=False)  # a new burst before the follow-up: no follow-up now
            for _ in range(40):  # a steady trickle still gets a refreeze by max_wait_s
                r.changed(removed=False)
                await trio.sleep(0.5)
            assert len(calls) >= 4 and calls[3][1] is False
            assert calls[3][0] - calls[2][0] <= 10 + 1.0 + 1.0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
