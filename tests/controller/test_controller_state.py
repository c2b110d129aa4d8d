"""ClusterMetadata: every command accepted, and refused with its reason, table-driven; group ids;
tombstones; snapshots; the snapshot section; reconcile."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_helpers import founded, run
from raft.controller.bootstrap import bootstrap, bootstrap_commands
from raft.controller.commands import (
    AlterTopicPartitions,
    CreateTopic,
    DecommissionNode,
    DeleteTopic,
    MoveReplicas,
    RegisterNode,
    SetTopicSettings,
    TopicSettings,
    UnsupportedCommand,
    encode_command,
)
from raft.controller.reconcile import reconcile
from raft.controller.section import SECTION, apply_batch
from raft.controller.state import (
    DEFAULT_TOPIC,
    ClusterMetadata,
    EffectKind,
    NodeStatus,
    Refusal,
    topic_name_error,
)
from raft.core.snapshot import SnapshotContext
from storage.batch import Batch, BatchKind

R3 = (1, 2, 3)


def with_orders() -> ClusterMetadata:
    meta = founded(4)
    assert run(meta, CreateTopic("orders", ((1, 2, 3), (2, 3, 4))))[0].ok
    return meta


# (name, setup commands, command, expected refusal or None)
CASES = [
    ("create", [], CreateTopic("t", (R3, R3)), None),
    ("create with settings", [], CreateTopic("t", (R3,), TopicSettings(retention_bytes=10)),
     None),
    ("create: name taken", [CreateTopic("t", (R3,))], CreateTopic("t", (R3,)),
     Refusal.TOPIC_EXISTS),
    ("create: default exists from bootstrap", [], CreateTopic(DEFAULT_TOPIC, (R3,)),
     Refusal.TOPIC_EXISTS),
    ("create: empty name", [], CreateTopic("", (R3,)), Refusal.INVALID_NAME),
    ("create: '.'", [], CreateTopic(".", (R3,)), Refusal.INVALID_NAME),
    ("create: '..'", [], CreateTopic("..", (R3,)), Refusal.INVALID_NAME),
    ("create: bad character", [], CreateTopic("a/b", (R3,)), Refusal.INVALID_NAME),
    ("create: 250 characters", [], CreateTopic("a" * 250, (R3,)), Refusal.INVALID_NAME),
    ("create: 249 characters", [], CreateTopic("a" * 249, (R3,)), None),
    ("create: no partitions", [], CreateTopic("t", ()), Refusal.INVALID_PARTITIONS),
    ("create: replica twice", [], CreateTopic("t", ((1, 1, 2),)), Refusal.INVALID_REPLICAS),
    ("create: uneven replica counts", [], CreateTopic("t", ((1, 2), (1, 2, 3))),
     Refusal.INVALID_REPLICAS),
    ("create: unknown node", [], CreateTopic("t", ((1, 2, 9),)), Refusal.UNKNOWN_NODE),
    ("create: decommissioned node", [DecommissionNode(3)], CreateTopic("t", (R3,)),
     Refusal.NODE_DECOMMISSIONED),
    ("grow", [CreateTopic("t", (R3,))], AlterTopicPartitions("t", 3, ((2, 3, 1), (3, 1, 2))),
     None),
    ("grow: same count", [CreateTopic("t", (R3,))], AlterTopicPartitions("t", 1, ()), None),
    ("grow: shrink", [CreateTopic("t", (R3, R3))], AlterTopicPartitions("t", 1, ()),
     Refusal.SHRINK_REFUSED),
    ("grow: unknown topic", [], AlterTopicPartitions("nope", 2, (R3,)),
     Refusal.UNKNOWN_TOPIC),
    ("grow: lists do not match the count", [CreateTopic("t", (R3,))],
     AlterTopicPartitions("t", 3, (R3,)), Refusal.INVALID_REPLICAS),
    ("grow: another replication factor", [CreateTopic("t", (R3,))],
     AlterTopicPartitions("t", 2, ((1, 2),)), Refusal.INVALID_REPLICAS),
    ("grow: unknown node", [CreateTopic("t", (R3,))],
     AlterTopicPartitions("t", 2, ((1, 2, 7),)), Refusal.UNKNOWN_NODE),
    ("settings", [CreateTopic("t", (R3,))],
     SetTopicSettings("t", TopicSettings(retention_ms=5)), None),
    ("settings: unknown topic", [], SetTopicSettings("x", TopicSettings(retention_ms=5)),
     Refusal.UNKNOWN_TOPIC),
    ("delete", [CreateTopic("t", (R3,))], DeleteTopic("t"), None),
    ("delete: unknown topic", [], DeleteTopic("t"), Refusal.UNKNOWN_TOPIC),
    ("delete: twice", [CreateTopic("t", (R3,)), DeleteTopic("t")], DeleteTopic("t"),
     Refusal.UNKNOWN_TOPIC),
    ("delete: the default topic", [], DeleteTopic(DEFAULT_TOPIC), Refusal.DEFAULT_TOPIC),
    ("move", [CreateTopic("t", ((1, 2),))], MoveReplicas("t", 0, (3, 2)), None),
    ("move: reorder only", [CreateTopic("t", (R3,))], MoveReplicas("t", 0, (3, 1, 2)), None),
    ("move: unknown topic", [], MoveReplicas("t", 0, R3), Refusal.UNKNOWN_TOPIC),
    ("move: unknown partition", [CreateTopic("t", (R3,))], MoveReplicas("t", 1, R3),
     Refusal.UNKNOWN_PARTITION),
    ("move: other replica count", [CreateTopic("t", (R3,))], MoveReplicas("t", 0, (1, 2)),
     Refusal.INVALID_REPLICAS),
    ("move: a node twice", [CreateTopic("t", (R3,))], MoveReplicas("t", 0, (1, 1, 2)),
     Refusal.INVALID_REPLICAS),
    ("move: to an unknown node", [CreateTopic("t", (R3,))], MoveReplicas("t", 0, (1, 2, 8)),
     Refusal.UNKNOWN_NODE),
    ("move: to a decommissioned node", [CreateTopic("t", ((1, 2),)), DecommissionNode(3)],
     MoveReplicas("t", 0, (1, 3)), Refusal.NODE_DECOMMISSIONED),
    ("move: a decommissioned member may stay while others move",
     [CreateTopic("t", ((1, 2),)), DecommissionNode(2)], MoveReplicas("t", 0, (2, 1)), None),
    ("register", [], RegisterNode(4, "h:4"), None),
    ("register: new address", [], RegisterNode(2, "elsewhere:2"), None),
    ("register: empty address", [], RegisterNode(4, ""), Refusal.MALFORMED),
    ("register: a decommissioned id", [DecommissionNode(3)], RegisterNode(3, "h:3"),
     Refusal.NODE_DECOMMISSIONED),
    ("decommission", [], DecommissionNode(2), None),
    ("decommission: unknown node", [], DecommissionNode(9), Refusal.UNKNOWN_NODE),
]


@pytest.mark.parametrize("name,setup,command,refusal", CASES, ids=[c[0] for c in CASES])
def test_every_command_is_accepted_or_refused_with_its_reason(name, setup, command,
                                                              refusal) -> None:
    meta = founded(3)
    for result in run(meta, *setup):
        assert result.ok, (name, result.reason)
    before = meta.to_snapshot()
    result = meta.apply(meta.applied + 1, command)
    assert result.refusal is refusal, result.reason
    if refusal is None:
        assert result.reason == ""
    else:
        assert result.reason  # says why
        assert not result.effects
        after = meta.to_snapshot()
        assert {**after, "applied": before["applied"]} == before  # a refusal changes nothing


def test_a_created_topic_gets_consecutive_group_ids_and_created_effects() -> None:
    meta = founded(3)
    [r] = run(meta, CreateTopic("t", ((1, 2), (2, 3), (3, 1))))
    assert [(e.kind, e.group, e.partition, e.replicas) for e in r.effects] == [
        (EffectKind.GROUP_CREATED, 2, 0, (1, 2)), (EffectKind.GROUP_CREATED, 3, 1, (2, 3)),
        (EffectKind.GROUP_CREATED, 4, 2, (3, 1))]
    assert meta.partition("t", 1).group == 3 and meta.next_group_id == 5


def test_group_ids_are_never_reused_after_a_delete() -> None:
    """A topic deleted and created again (or any later topic) gets fresh group ids, so nothing
    addressed to the old groups can reach the new ones."""
    meta = founded(3)
    run(meta, CreateTopic("a", (R3,)), CreateTopic("b", (R3, R3)))
    old = {p.group for p in meta.topics["b"].partitions}
    assert run(meta, DeleteTopic("b"))[0].ok
    run(meta, CreateTopic("b", (R3, R3)), CreateTopic("c", (R3,)))
    new = {p.group for p in meta.topics["b"].partitions} | {meta.partition("c", 0).group}
    assert not old & new
    assert all(meta.is_deleted(g) for g in old)
    assert meta.topics["b"].topic_id != 0 and len(new) == 3


def test_delete_leaves_tombstones_and_removed_effects() -> None:
    meta = with_orders()
    groups = [p.group for p in meta.topics["orders"].partitions]
    [r] = run(meta, DeleteTopic("orders"))
    assert [(e.kind, e.group) for e in r.effects] == [(EffectKind.GROUP_REMOVED, g)
                                                      for g in groups]
    assert sorted(meta.tombstones) == groups
    assert meta.tombstones[groups[1]].partition == 1
    assert meta.tombstones[groups[1]].deleted_at == meta.applied
    assert "orders" not in meta.topics and not set(groups) & set(meta.groups)


def test_settings_merge_and_reset_to_the_default() -> None:
    meta = founded(3)
    run(meta, CreateTopic("t", (R3,), TopicSettings(retention_bytes=100, retention_ms=7)),
        SetTopicSettings("t", TopicSettings(max_record_bytes=1000)))
    assert meta.topics["t"].settings == TopicSettings(100, 7, 1000)
    [r] = run(meta, SetTopicSettings("t", TopicSettings(retention_ms=9),
                                     frozenset({"retention_bytes"})))
    assert meta.topics["t"].settings == TopicSettings(None, 9, 1000)
    assert {e.kind for e in r.effects} == {EffectKind.SETTINGS_CHANGED}
    defaults = TopicSettings(retention_bytes=1 << 30, retention_ms=1, max_record_bytes=1)
    assert meta.topics["t"].settings.resolved(defaults) == TopicSettings(1 << 30, 9, 1000)
    assert meta.settings_of(meta.partition("t", 0).group, defaults) == TopicSettings(1 << 30, 9,
                                                                                     1000)


def test_a_move_reports_the_replica_change() -> None:
    meta = with_orders()
    [r] = run(meta, MoveReplicas("orders", 1, (4, 3, 1)))
    [e] = r.effects
    assert (e.kind, e.replicas, e.previous) == (EffectKind.REPLICAS_CHANGED, (4, 3, 1),
                                                (2, 3, 4))


def test_bootstrap_registers_the_founders_and_creates_the_default_topic() -> None:
    meta = bootstrap({3: "c:1", 1: "a:1", 2: "b:1"})
    assert [type(c).__name__ for c in bootstrap_commands({1: "a", 2: "b"})] == [
        "RegisterNode", "RegisterNode", "CreateTopic"]
    assert meta.active_nodes() == [1, 2, 3]
    default = meta.partition(DEFAULT_TOPIC, 0)
    assert (default.group, default.replicas) == (1, (1, 2, 3))
    assert len(meta.topics[DEFAULT_TOPIC].partitions) == 1
    with pytest.raises(ValueError, match="founding"):
        bootstrap({})


def test_entries_apply_in_order_once() -> None:
    meta = founded(3)
    with pytest.raises(ValueError, match="in order"):
        meta.apply(meta.applied, CreateTopic("t", (R3,)))


def test_a_malformed_entry_is_refused_alike_and_a_newer_one_stops_the_node() -> None:
    meta = founded(3)
    bad = msgpack.packb({"ctl": "controller", "v": 1, "op": "delete_topic", "name": 7})
    result = meta.apply_payload(meta.applied + 1, bad)
    assert result.refusal is Refusal.MALFORMED and "name" in result.reason
    newer = msgpack.packb({"ctl": "controller", "v": 2, "op": "delete_topic", "name": "t"})
    with pytest.raises(UnsupportedCommand, match="upgrade"):
        meta.apply_payload(meta.applied + 1, newer)


def test_topic_name_rule_matches_kafka() -> None:
    for good in ("a", "A-b_c.9", "x" * 249, "..."):
        assert topic_name_error(good) is None, good
    for bad in ("", ".", "..", "x" * 250, "a b", "é", "a*"):
        assert topic_name_error(bad), bad


def test_snapshot_round_trip_equals_the_state() -> None:
    meta = with_orders()
    run(meta, CreateTopic("gone", (R3,)), DeleteTopic("gone"), DecommissionNode(4),
        SetTopicSettings("orders", TopicSettings(retention_bytes=5)))
    raw = msgpack.unpackb(msgpack.packb(meta.to_snapshot()), raw=False)
    again = ClusterMetadata.from_snapshot(raw)
    assert again == meta
    assert again.nodes[4].status is NodeStatus.DECOMMISSIONED
    assert again.to_snapshot() == meta.to_snapshot()


def test_founders_survive_a_move_and_the_snapshot() -> None:
    """A partition keeps the replicas it was created with after a move, and in the snapshot: a
    node restored from a cut controller log must still know it founded the group (or joins it)."""
    meta = with_orders()
    before = meta.partition("orders", 1)
    founders = before.founders
    assert founders == before.replicas
    run(meta, MoveReplicas("orders", 1, (4, 3, 1)))
    assert meta.partition("orders", 1).founders == founders
    again = ClusterMetadata.from_snapshot(msgpack.unpackb(msgpack.packb(meta.to_snapshot())))
    assert again.partition("orders", 1).founders == founders
    assert again.partition("orders", 1).replicas == (4, 3, 1)


@pytest.mark.parametrize("damage", [
    lambda s: s.update(v=2),
    lambda s: s["topics"][0][3][0].__setitem__(2, []),  # no founders

    lambda s: s.update(next_group_id=1),  # below the groups it holds
    lambda s: s["topics"][0][3].append([2, [1, 2]]),  # a group held twice
    lambda s: s["topics"][0][3][0].__setitem__(1, [1, 99]),  # an unknown node
    lambda s: s["tombstones"].append([2, "x", 0, 1]),  # a live group tombstoned
    lambda s: s["nodes"].append([1, "again", "active"]),
    lambda s: s["topics"].append(["..", 1, {}, [[50, [1]]]]),
    lambda s: s.pop("nodes"),
])
def test_a_damaged_snapshot_is_refused_with_a_clear_error(damage) -> None:
    raw = with_orders().to_snapshot()
    damage(raw)
    with pytest.raises(ValueError, match="controller metadata snapshot is malformed"):
        ClusterMetadata.from_snapshot(raw)


def _control(offset: int, payload: bytes) -> Batch:
    return Batch.create(payload, 1, kind=BatchKind.CONTROL, base_offset=offset, term=1)


def test_the_snapshot_section_folds_controller_entries_and_ignores_the_rest() -> None:
    ctx = SnapshotContext()
    meta = SECTION.fresh(ctx, 0)
    entries = [*bootstrap_commands({1: "a", 2: "b"}), CreateTopic("t", ((1, 2),))]
    offset = 0
    for command in entries:
        apply_batch(meta, _control(offset, encode_command(command)))
        offset += 1
    loads = msgpack.packb({"ctl": "load_begin", "load_id": "x"})
    apply_batch(meta, _control(offset, loads))  # another CONTROL user's entry
    apply_batch(meta, Batch.create(b"x", 1, base_offset=offset + 1, term=1))
    assert sorted(meta.topics) == [DEFAULT_TOPIC, "t"] and meta.applied == offset - 1
    again = SECTION.load(msgpack.unpackb(msgpack.packb(SECTION.dump(meta, offset)), raw=False),
                         ctx)
    assert again == meta


def test_reconcile_starts_stops_and_deletes_only_what_the_metadata_says() -> None:
    meta = with_orders()  # default: group 1 on 1-4; orders: group 2 on 1,2,3, group 3 on 2,3,4
    plan = reconcile(meta, 4, running=[])
    assert [p.group for p in plan.start] == [1, 3]
    run(meta, MoveReplicas("orders", 1, (2, 3, 1)), CreateTopic("x", ((1, 2, 3),)),
        DeleteTopic("x"))
    plan = reconcile(meta, 4, running=[1, 3], on_disk=[3, 4, 99])
    assert plan.stop == (3,) and plan.start == ()  # moved away: stop, keep the data
    assert plan.delete == (4,)  # topic x was deleted: drop its data
    assert plan.unknown == (99,)  # not allocated in this metadata yet: leave it alone
    assert reconcile(meta, 1, running=[1, 2, 3]).empty


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.text(max_size=3))
_shapes = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4), max_leaves=16)


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({"v": st.just(1), "applied": _shapes, "next_group_id": _shapes,
                              "nodes": _shapes, "topics": _shapes, "tombstones": _shapes}))
def test_any_snapshot_map_loads_or_is_refused_with_a_value_error(raw) -> None:
    try:
        ClusterMetadata.from_snapshot(raw)
    except ValueError as e:
        assert "malformed" in str(e)
