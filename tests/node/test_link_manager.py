"""The link manager's choice (raft/node/links/manager.py): a puller exactly for the mirror
partitions this node leads whose topic is an active mirror of an active link that feeds it;
write_refusal on every group of an active mirror, cleared once promoted."""

from __future__ import annotations

from dataclasses import dataclass, field
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
             "lag_seconds": 1.5}]
    got = {f.name: [(s.labels, s.value) for s in f.samples] for f in _mirror_families(rows)}
    labels = {"link": "dr", "topic": "orders", "partition": "2"}
    assert got == {"raftlog_link_lag_records": [(labels, 7)],
                   "raftlog_link_lag_seconds": [(labels, 1.5)]}
