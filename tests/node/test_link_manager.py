"""The link manager's choice (raft/node/links/manager.py): a puller exactly for the mirror
partitions this node leads whose topic is an active mirror of an active link that feeds it;
write_refusal on every group of an active mirror, cleared once promoted."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raft.controller.link_commands import (CreateLink, DeleteLink, MirrorTopic, PauseLink,
                                           PromoteTopic)
from raft.core.types import Role
from raft.node.links.manager import LinkManager
from tests.controller.controller_helpers import founded, run


@dataclass
class FakeGroup:
    role: Role
    closing: bool = False
    write_refusal: str | None = None
    core: Any = field(init=False)

    def __post_init__(self) -> None:
        self.core = SimpleNamespace(role=self.role)


def manager(commands: tuple, roles: dict[int, Role]) -> tuple[LinkManager, dict[int, FakeGroup]]:
    meta = founded()
    assert all(r.ok for r in run(meta, *commands)), "setup refused"
    groups = {g: FakeGroup(role) for g, role in roles.items()}
    node = SimpleNamespace(config=SimpleNamespace(link_rate=1.0, node_dir=None),
                           registry=SimpleNamespace(get=groups.get),
                           transport=SimpleNamespace(identity=SimpleNamespace(cluster_id="sink")))
    mgr = LinkManager.__new__(LinkManager)
    mgr.runtime, mgr.node = SimpleNamespace(metadata=meta), node
    return mgr, groups


LINK = CreateLink("dr", ("h:1",), "src", (MirrorTopic("orders", "orders", ((1, 2, 3),) * 2),))
# founded() holds the default topic in group 1: the mirror's partitions are groups 2 and 3.
ROLES = {1: Role.LEADER, 2: Role.LEADER, 3: Role.FOLLOWER}


@pytest.mark.parametrize("commands, pulled, refused", [
    ((LINK,), {2}, {2, 3}),
    ((LINK, PauseLink("dr")), set(), {2, 3}),
    ((LINK, DeleteLink("dr")), set(), {2, 3}),
    ((LINK, PromoteTopic("orders")), set(), set()),
    ((LINK, DeleteLink("dr"), CreateLink("dr", ("h:1",), "other",
                                         (MirrorTopic("orders", "o2", ((1, 2, 3),)),))),
     set(), {2, 3}),  # a new link of that name, for another source, does not inherit it
])
def test_pullers_and_write_refusals(commands: tuple, pulled: set[int],
                                    refused: set[int]) -> None:
    mgr, groups = manager(commands, ROLES)
    wanted = mgr.wanted()
    assert set(wanted) == pulled
    assert {g for g, grp in groups.items() if grp.write_refusal} == refused
    for g in refused:
        assert "raftlog topic promote orders" in (groups[g].write_refusal or "")
    for spec, _ in wanted.values():
        assert spec.subscription == "__link.sink.dr" and spec.source_topic == "orders"


def test_a_promoted_topic_clears_the_refusal_set_before() -> None:
    mgr, groups = manager((LINK,), ROLES)
    mgr.wanted()
    assert groups[3].write_refusal
    run(mgr.runtime.metadata, PromoteTopic("orders"))
    mgr.wanted()
    assert groups[2].write_refusal is None and groups[3].write_refusal is None


@pytest.mark.parametrize("source", ["src", "other"])
def test_a_new_link_of_the_same_name_does_not_inherit_the_old_mirror(source: str) -> None:
    """The old link's topic stays a read-only mirror nobody writes, even when the new link
    reads the same source topic (into another mirror name)."""
    again = CreateLink("dr", ("h:1",), source, (MirrorTopic("orders", "o2", ((1, 2, 3),)),))
    mgr, groups = manager((LINK, DeleteLink("dr"), again), ROLES)
    assert 2 not in mgr.wanted()


def test_a_new_link_of_the_same_name_does_not_inherit_the_old_mirror_same_source() -> None:
    test_a_new_link_of_the_same_name_does_not_inherit_the_old_mirror("src")


def test_lag_metrics_one_series_per_pulled_partition() -> None:
    from raft.node.metrics import _mirror_families
    rows = [{"link": "dr", "topic": "orders", "partition": 2, "lag_records": 7,
             "lag_seconds": 1.5, "bootstraps": 2, "offsets_lost": 40}]
    got = {f.name: [(s.labels, s.value) for s in f.samples] for f in _mirror_families(rows)}
    labels = {"link": "dr", "topic": "orders", "partition": "2"}
    assert got == {"raftlog_link_lag_records": [(labels, 7)],
                   "raftlog_link_lag_seconds": [(labels, 1.5)],
                   "raftlog_link_bootstraps": [(labels, 2)],
                   "raftlog_link_offsets_lost": [(labels, 40)]}


class _Sources:
    """The link clients, never used: the pullers here are fakes."""

    def client(self, link: Any) -> Any:
        return object()

    async def forget_except(self, names: set[str]) -> None:
        return None

    async def aclose(self) -> None:
        return None


def test_a_new_leader_of_a_mirror_partition_pulls_at_once_on_the_virtual_clock() -> None:
    """Leadership of a mirror partition moving here starts its puller with no clock time
    passing (the registry's state-change hook wakes the manager; its SCAN_S look never comes
    on a clock that stands still), and moving away stops it; a plain partition's change does
    not even wake the manager."""
    import trio
    import trio.testing
    from raft.node.links import manager as manager_module

    started: list[int] = []

    class FakePuller:
        def __init__(self, spec: Any, *_: Any) -> None:
            self.spec = spec
            started.append(spec.group)

        async def run(self) -> None:
            await trio.sleep_forever()

    # Its own MonkeyPatch, not the fixture: tests/raft/test_mutants.py calls killers bare.
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(manager_module, "Puller", FakePuller)
        _pulls_at_once(manager_module, started)


def _pulls_at_once(manager_module: Any, started: list[int]) -> None:
    import trio
    import trio.testing

    meta = founded()
    assert all(r.ok for r in run(meta, LINK))
    groups = {g: FakeGroup(Role.FOLLOWER) for g in (1, 2, 3)}
    registry = SimpleNamespace(get=groups.get, on_state_change=[])
    node = SimpleNamespace(config=SimpleNamespace(link_rate=1.0, node_dir=Path("/nonexistent")),
                           registry=registry,
                           transport=SimpleNamespace(identity=SimpleNamespace(cluster_id="sink")))
    mgr = LinkManager(SimpleNamespace(node=node, metadata=meta))
    mgr.sources = _Sources()
    looks = 0
    wanted = mgr.wanted

    def counted() -> Any:
        nonlocal looks
        looks += 1
        return wanted()

    mgr.wanted = counted  # type: ignore[method-assign]
    seen: dict[str, Any] = {}

    def changed(gid: int, role: Role) -> None:
        groups[gid].core.role = role
        for hook in registry.on_state_change:
            hook(gid)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mgr.run)
            await trio.testing.wait_all_tasks_blocked()
            t0, seen["first"] = trio.current_time(), list(started)
            changed(2, Role.LEADER)
            await trio.testing.wait_all_tasks_blocked()
            seen["led"], seen["pulling"] = list(started), set(mgr.pullers)
            before = looks
            changed(1, Role.LEADER)  # the default topic's group: not a mirror's
            await trio.testing.wait_all_tasks_blocked()
            seen["plain_looks"] = looks - before
            changed(2, Role.FOLLOWER)
            await trio.testing.wait_all_tasks_blocked()
            seen["after_loss"] = set(mgr.pullers)
            seen["elapsed"] = trio.current_time() - t0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())
    assert seen["first"] == [] and seen["elapsed"] == 0, seen
    assert seen["led"] == [2] and seen["pulling"] == {2}, seen
    assert seen["plain_looks"] == 0, seen
    assert seen["after_loss"] == set(), seen


def test_the_registry_passes_a_groups_state_change_on_with_its_id() -> None:
    from raft.node.registry import GroupRegistry
    registry = GroupRegistry(1)
    heard: list[int] = []
    registry.on_state_change.append(heard.append)
    group = SimpleNamespace(core=object(), scrub_scheduler=None, on_input=None,
                            on_state_change=lambda: None)
    registry.add(7, group, None)  # type: ignore[arg-type]
    group.on_state_change()
    assert heard == [7]


@pytest.mark.parametrize("commands, counts, want", [
    ((LINK,), {"dr": {"orders": 4}}, [("orders", 4)]),
    ((LINK,), {"dr": {"orders": 2}}, []),  # as many already
    ((LINK,), {"dr": {"orders": 1}}, []),  # never shrinks
    ((LINK,), {}, []),  # the source did not answer
    ((LINK, PauseLink("dr")), {"dr": {"orders": 4}}, []),  # a paused link waits
    ((LINK, PromoteTopic("orders")), {"dr": {"orders": 4}}, []),  # the sink's own now
    ((LINK, DeleteLink("dr"), CreateLink("dr", ("h:1",), "other",
                                         (MirrorTopic("orders", "o2", ((1, 2, 3),)),))),
     {"dr": {"orders": 4}}, [("o2", 4)]),  # the old mirror does not follow the new source
])
def test_only_an_active_mirror_of_an_active_link_follows_its_sources_partitions(
        commands: tuple, counts: dict, want: list) -> None:
    from raft.node.links.grow import grows
    meta = founded()
    assert all(r.ok for r in run(meta, *commands)), "setup refused"
    assert grows(meta, counts) == want


def test_a_promoted_mirror_does_not_follow_its_old_source() -> None:
    test_only_an_active_mirror_of_an_active_link_follows_its_sources_partitions(
        (LINK, PromoteTopic("orders")), {"dr": {"orders": 4}}, [])


def test_a_paused_links_mirror_does_not_grow() -> None:
    test_only_an_active_mirror_of_an_active_link_follows_its_sources_partitions(
        (LINK, PauseLink("dr")), {"dr": {"orders": 4}}, [])


def test_the_manager_sleeps_until_an_event_and_retries_only_what_failed() -> None:
    """With no links the manager looks once and then does no work however long the node
    idles (issue 28: it used to look every SCAN_S on every node, 1,000 partitions or not);
    a metadata change wakes it at once. A link whose source client cannot be made is looked at
    again every SCAN_S until it can."""
    import trio
    import trio.testing
    from raft.node.links import manager as manager_module

    meta = founded()
    groups = {g: FakeGroup(Role.LEADER) for g in (1, 2, 3)}
    node = SimpleNamespace(config=SimpleNamespace(link_rate=1.0, node_dir=Path("/nonexistent")),
                           registry=SimpleNamespace(get=groups.get, on_state_change=[]),
                           controller_group=SimpleNamespace(core=None),
                           transport=SimpleNamespace(identity=SimpleNamespace(cluster_id="sink")))
    mgr = LinkManager(SimpleNamespace(node=node, metadata=meta))
    failing = True

    class Sources(_Sources):
        def client(self, link: Any) -> Any:
            if failing:
                raise ValueError("bad CA")
            return object()

    class FakePuller:
        def __init__(self, spec: Any, *_: Any) -> None:
            self.spec = spec

        async def run(self) -> None:
            await trio.sleep_forever()

    mgr.sources = Sources()
    seen: dict[str, Any] = {}

    async def main() -> None:
        nonlocal failing
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mgr.run)
            await trio.sleep(100 * manager_module.SCAN_S)
            seen["idle"] = mgr.looks
            assert all(r.ok for r in run(meta, LINK))
            mgr.kick()  # the controller's on_applied hook
            await trio.testing.wait_all_tasks_blocked()
            seen["woken"] = mgr.looks
            await trio.sleep(10.5 * manager_module.SCAN_S)
            seen["retrying"] = mgr.looks
            failing = False
            await trio.sleep(manager_module.SCAN_S)
            seen["pulling"] = set(mgr.pullers)
            before = mgr.looks
            await trio.sleep(100 * manager_module.SCAN_S)
            seen["settled"] = mgr.looks - before
            nursery.cancel_scope.cancel()

    with pytest.MonkeyPatch.context() as monkeypatch:  # not the fixture: mutants call bare
        monkeypatch.setattr(manager_module, "Puller", FakePuller)
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen["idle"] == 1, seen
    assert seen["woken"] == 2, seen
    assert seen["retrying"] == 12, seen  # every SCAN_S while the client fails
    assert seen["pulling"] == {2, 3}, seen
    assert seen["settled"] == 0, seen
