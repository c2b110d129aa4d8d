"""ClusterMetadata: the controller's state machine (Raft group 0, issue 26).

Every node applies the controller log's committed commands (commands.py) in log order, so every
node holds the same topics, partitions, replica sets, settings and nodes. `apply` decides every
verdict from the state and the command alone (no clocks, no liveness, no randomness): the same
commands give the same state and the same answers everywhere. A refused command changes nothing
and says why; the leader answers its requester with the verdict its own apply reached.

Group ids. Group 0 is the controller; data partitions get ids from 1, allocated here, in log
order, monotonic and never reused. A topic deleted and created again gets new ids, so a message
or a stale directory of the old group can never be taken for the new one. A group id below
`next_group_id` that no live partition holds is deleted: nodes drop its data (the tombstones
name what it was, for operators; the rule `is_deleted` needs only the counter).

What a node does with an applied command is in its `ApplyResult.effects`: groups created,
removed, or whose replica set or settings changed (reconcile.py turns the metadata into the
groups one node should run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from raft.controller.commands import (
    AlterTopicPartitions,
    Command,
    CreateTopic,
    DecommissionNode,
    DeleteTopic,
    MalformedCommand,
    MoveReplicas,
    RegisterNode,
    SetTopicSettings,
    TopicSettings,
    decode_command,
)
from raft.controller.links import (Link, Origin, link_from_raw, link_to_raw, origin_from_raw,
                                   origin_to_raw)
from raft.controller.links_apply import LINK_HANDLERS, LinkApply
from raft.controller.command_fields import MAX_TOPIC_CHARS, topic_name_error  # noqa: F401
from raft.controller.results import (ApplyResult, Effect, EffectKind, Refusal,  # noqa: F401
                                     _refused)

CONTROLLER_GROUP = 0  # the controller's own Raft group
FIRST_DATA_GROUP = 1
DEFAULT_TOPIC = "default"  # exists from bootstrap; today's commands use it without --topic

class NodeStatus(str, Enum):
    ACTIVE = "active"
    DECOMMISSIONED = "decommissioned"  # nothing new placed on it; its replicas move away


@dataclass(slots=True)
class Partition:
    topic: str
    index: int
    group: int
    replicas: tuple[int, ...]  # first = preferred leader
    # The replicas it was created with: its founding voters, which start the group knowing
    # each other; a replica moved in later joins as a non-member (raft.node.reconciler). Kept
    # in the state, not rebuilt from the create entry, since retention cuts that entry.
    founders: tuple[int, ...] = ()
    shard: int = 0  # the shard index it lives on, the same on every replica (docs/SHARDS.md)


@dataclass(slots=True)
class Topic:
    name: str
    topic_id: int  # the offset of its create entry: tells a recreated topic from the old one
    settings: TopicSettings
    partitions: list[Partition] = field(default_factory=list)
    # A mirror topic (created by a link, docs/REPLICATION.md): where it comes from, for ever
    # (its groups are translated), and whether its link still writes it (clients may not).
    origin: Origin | None = None
    mirror_active: bool = False


@dataclass(slots=True)
class NodeInfo:
    node_id: int
    address: str  # shard 0's
    status: NodeStatus = NodeStatus.ACTIVE
    shards: int = 1  # shard processes it runs; shard k listens on shard_address(address, k)


def shard_address(address: str, shard: int) -> str:
    """Where shard `shard` of a node whose shard 0 listens on `address` listens: the next
    ports (docs/SHARDS.md). Shard 0 is `address` itself, whatever its form."""
    if shard == 0:
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} has no port: shard {shard} listens on its "
                         f"port + {shard}")
    return f"{host}:{int(port) + shard}"


@dataclass(slots=True, frozen=True)
class Tombstone:
    """A deleted group: what it was, and the offset of the entry that deleted it."""

    group: int
    topic: str
    partition: int
    deleted_at: int


@dataclass(slots=True)
class ClusterMetadata(LinkApply):
    """The cluster's metadata as of controller log offset `applied`."""

    applied: int = -1
    next_group_id: int = FIRST_DATA_GROUP
    topics: dict[str, Topic] = field(default_factory=dict)
    nodes: dict[int, NodeInfo] = field(default_factory=dict)
    tombstones: dict[int, Tombstone] = field(default_factory=dict)
    groups: dict[int, Partition] = field(default_factory=dict)  # index: group id -> partition
    links: dict[str, Link] = field(default_factory=dict)  # cross-cluster links (links_apply.py)

    # -- applying --------------------------------------------------------------------------
    def apply_payload(self, offset: int, payload: bytes) -> ApplyResult:
        """Apply one committed controller CONTROL payload at `offset`. A malformed one is
        refused (every node decodes the same bytes alike); UnsupportedCommand propagates: the
        runtime must stop rather than skip what a newer node applied."""
        try:
            command = decode_command(payload)
        except MalformedCommand as e:
            self._advance(offset)
            return _refused(Refusal.MALFORMED, str(e))
        return self.apply(offset, command)

    def apply(self, offset: int, command: Command) -> ApplyResult:
        """Apply `command`, the entry at controller log `offset` (offsets only grow)."""
        self._advance(offset)
        handler = _HANDLERS[type(command)]
        return handler(self, offset, command)

    def _advance(self, offset: int) -> None:
        if offset <= self.applied:
            raise ValueError(f"controller metadata applied up to {self.applied} but got an "
                             f"entry at {offset}: apply committed entries once, in order")
        self.applied = offset

    def _allocate_group(self) -> int:
        gid = self.next_group_id
        self.next_group_id = gid + 1
        return gid

    def _replica_error(self, replicas: tuple[int, ...], what: str) -> ApplyResult | None:
        if len(set(replicas)) != len(replicas):
            return _refused(Refusal.INVALID_REPLICAS,
                            f"{what}: replicas {list(replicas)} name a node twice; each replica "
                            f"of a partition is on its own node")
        for node in replicas:
            info = self.nodes.get(node)
            if info is None:
                return _refused(Refusal.UNKNOWN_NODE,
                                f"{what}: node {node} is not registered (known: "
                                f"{sorted(self.nodes)}); register it first")
            if info.status is NodeStatus.DECOMMISSIONED:
                return _refused(Refusal.NODE_DECOMMISSIONED,
                                f"{what}: node {node} is decommissioned; place replicas on "
                                f"active nodes")
        return None

    def _shard_error(self, replicas: tuple[int, ...], shard: int,
                     what: str) -> ApplyResult | None:
        """A partition lives on shard `shard` of every replica: each must run that many."""
        short = [n for n in replicas if n in self.nodes and self.nodes[n].shards <= shard]
        if short:
            return _refused(Refusal.INVALID_REPLICAS,
                            f"{what}: shard {shard} does not exist on node(s) {short} "
                            f"(shards: {[self.nodes[n].shards for n in short]}); a partition "
                            f"lives on the same shard index on every replica")
        return None

    def _assignment_error(self, replicas: tuple[tuple[int, ...], ...],
                          name: str, first: int,
                          shards: tuple[int, ...] = ()) -> ApplyResult | None:
        if shards and len(shards) != len(replicas):
            return _refused(Refusal.INVALID_REPLICAS,
                            f"topic {name!r}: {len(replicas)} partitions but {len(shards)} "
                            f"shard indexes")
        sizes = {len(r) for r in replicas}
        if len(sizes) > 1:
            return _refused(Refusal.INVALID_REPLICAS,
                            f"topic {name!r}: every partition needs the same number of replicas,"
                            f" got {sorted(sizes)}")
        for i, r in enumerate(replicas):
            err = self._replica_error(r, f"topic {name!r} partition {first + i}")
            if err is None and shards:
                err = self._shard_error(r, shards[i], f"topic {name!r} partition {first + i}")
            if err is not None:
                return err
        return None

    def _create_topic(self, offset: int, cmd: CreateTopic) -> ApplyResult:
        why = topic_name_error(cmd.name)
        if why is not None:
            return _refused(Refusal.INVALID_NAME, why)
        if cmd.name in self.topics:
            return _refused(Refusal.TOPIC_EXISTS, f"topic {cmd.name!r} exists; alter it, or "
                                                  f"delete it first")
        if not cmd.replicas:
            return _refused(Refusal.INVALID_PARTITIONS,
                            f"topic {cmd.name!r} needs at least one partition")
        err = self._assignment_error(cmd.replicas, cmd.name, 0, cmd.shards)
        if err is not None:
            return err
        topic = Topic(cmd.name, offset, cmd.settings)
        self.topics[cmd.name] = topic
        return ApplyResult(effects=tuple(self._add_partitions(topic, cmd.replicas,
                                                              cmd.shards)))

    def _add_partitions(self, topic: Topic, replicas: tuple[tuple[int, ...], ...],
                        shards: tuple[int, ...] = ()) -> list[Effect]:
        effects = []
        for i, r in enumerate(replicas):
            p = Partition(topic.name, len(topic.partitions), self._allocate_group(), tuple(r),
                          tuple(r), shards[i] if shards else 0)
            topic.partitions.append(p)
            self.groups[p.group] = p
            effects.append(Effect(EffectKind.GROUP_CREATED, p.group, p.topic, p.index,
                                  p.replicas))
        return effects

    def _alter_partitions(self, offset: int, cmd: AlterTopicPartitions) -> ApplyResult:
        topic = self.topics.get(cmd.name)
        if topic is None:
            return self._unknown_topic(cmd.name)
        have = len(topic.partitions)
        if cmd.partitions < have:
            return _refused(Refusal.SHRINK_REFUSED,
                            f"topic {cmd.name!r} has {have} partitions; partitions can only "
                            f"grow (fewer would move keys and drop records)")
        if cmd.partitions - have != len(cmd.new_replicas):
            return _refused(Refusal.INVALID_REPLICAS,
                            f"topic {cmd.name!r}: growing {have} -> {cmd.partitions} needs "
                            f"{cmd.partitions - have} replica lists, got {len(cmd.new_replicas)}")
        rf = len(topic.partitions[0].replicas)
        if any(len(r) != rf for r in cmd.new_replicas):
            return _refused(Refusal.INVALID_REPLICAS,
                            f"topic {cmd.name!r} has {rf} replicas per partition; new "
                            f"partitions need as many")
        err = self._assignment_error(cmd.new_replicas, cmd.name, have, cmd.new_shards)
        if err is not None:
            return err
        return ApplyResult(effects=tuple(self._add_partitions(topic, cmd.new_replicas,
                                                              cmd.new_shards)))

    def _set_settings(self, offset: int, cmd: SetTopicSettings) -> ApplyResult:
        topic = self.topics.get(cmd.name)
        if topic is None:
            return self._unknown_topic(cmd.name)
        topic.settings = topic.settings.merged(cmd.settings, cmd.reset)
        return ApplyResult(effects=tuple(
            Effect(EffectKind.SETTINGS_CHANGED, p.group, p.topic, p.index, p.replicas)
            for p in topic.partitions))

    def _delete_topic(self, offset: int, cmd: DeleteTopic) -> ApplyResult:
        if cmd.name == DEFAULT_TOPIC:
            return _refused(Refusal.DEFAULT_TOPIC,
                            f"the topic {DEFAULT_TOPIC!r} is where commands without --topic "
                            f"write; it cannot be deleted (delete its records with retention)")
        topic = self.topics.pop(cmd.name, None)
        if topic is None:
            return self._unknown_topic(cmd.name)
        effects = []
        for p in topic.partitions:
            del self.groups[p.group]
            self.tombstones[p.group] = Tombstone(p.group, p.topic, p.index, offset)
            effects.append(Effect(EffectKind.GROUP_REMOVED, p.group, p.topic, p.index,
                                  p.replicas))
        return ApplyResult(effects=tuple(effects))

    def _move_replicas(self, offset: int, cmd: MoveReplicas) -> ApplyResult:
        topic = self.topics.get(cmd.topic)
        if topic is None:
            return self._unknown_topic(cmd.topic)
        if not 0 <= cmd.partition < len(topic.partitions):
            return _refused(Refusal.UNKNOWN_PARTITION,
                            f"topic {cmd.topic!r} has partitions 0..{len(topic.partitions) - 1}"
                            f", not {cmd.partition}")
        p = topic.partitions[cmd.partition]
        if len(cmd.replicas) != len(p.replicas):
            # Changing the replication factor is its own operation (not built yet).
            return _refused(Refusal.INVALID_REPLICAS,
                            f"topic {cmd.topic!r} partition {cmd.partition} has "
                            f"{len(p.replicas)} replicas; a move keeps the count")
        where = f"topic {cmd.topic!r} partition {cmd.partition}"
        if len(set(cmd.replicas)) != len(cmd.replicas):
            return _refused(Refusal.INVALID_REPLICAS,
                            f"{where}: replicas {list(cmd.replicas)} name a node twice")
        # Nodes it already has may stay even if decommissioned (a move drains them one at a
        # time); nodes it gains must be registered and active.
        gained = tuple(n for n in cmd.replicas if n not in p.replicas)
        err = self._replica_error(gained, where) or self._shard_error(gained, p.shard, where)
        if err is not None:
            return err
        previous, p.replicas = p.replicas, tuple(cmd.replicas)
        return ApplyResult(effects=(Effect(EffectKind.REPLICAS_CHANGED, p.group, p.topic,
                                           p.index, p.replicas, previous),))

    def _register_node(self, offset: int, cmd: RegisterNode) -> ApplyResult:
        info = self.nodes.get(cmd.node_id)
        if info is not None and info.status is NodeStatus.DECOMMISSIONED:
            return _refused(Refusal.NODE_DECOMMISSIONED,
                            f"node id {cmd.node_id} was decommissioned and is never reused; "
                            f"give the new node another id")
        if not cmd.address:
            return _refused(Refusal.MALFORMED, "a node's address must not be empty")
        if info is None:
            self.nodes[cmd.node_id] = NodeInfo(cmd.node_id, cmd.address, shards=cmd.shards)
            return ApplyResult()
        held = max((p.shard for p in self.groups_of(cmd.node_id).values()), default=-1)
        if cmd.shards <= held:
            return _refused(Refusal.INVALID_REPLICAS,
                            f"node {cmd.node_id} holds partitions on shard {held}; it cannot "
                            f"register {cmd.shards} shard(s) (move those replicas first)")
        info.address, info.shards = cmd.address, cmd.shards
        return ApplyResult()

    def _decommission_node(self, offset: int, cmd: DecommissionNode) -> ApplyResult:
        info = self.nodes.get(cmd.node_id)
        if info is None:
            return _refused(Refusal.UNKNOWN_NODE, f"node {cmd.node_id} is not registered "
                                                  f"(known: {sorted(self.nodes)})")
        info.status = NodeStatus.DECOMMISSIONED
        return ApplyResult()

    def _unknown_topic(self, name: str) -> ApplyResult:
        known = sorted(self.topics)
        shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
        return _refused(Refusal.UNKNOWN_TOPIC, f"no topic named {name!r} (topics: {shown})")

    # -- queries ---------------------------------------------------------------------------
    def partition(self, topic: str, index: int) -> Partition | None:
        t = self.topics.get(topic)
        return t.partitions[index] if t is not None and 0 <= index < len(t.partitions) else None

    def settings_of(self, group: int, defaults: TopicSettings = TopicSettings()) -> TopicSettings:
        """The settings in force for a data group: its topic's, else `defaults` (the node's
        cluster-wide retention flags). KeyError for a group that is not live."""
        return self.topics[self.groups[group].topic].settings.resolved(defaults)

    def is_deleted(self, group: int) -> bool:
        """Whether `group` was a data partition that no longer exists (drop its data). A group
        id not allocated yet is not deleted: this node's metadata may be behind."""
        return FIRST_DATA_GROUP <= group < self.next_group_id and group not in self.groups

    def active_nodes(self) -> list[int]:
        return sorted(n for n, i in self.nodes.items() if i.status is NodeStatus.ACTIVE)

    def groups_of(self, node_id: int, shard: int | None = None) -> dict[int, Partition]:
        """The data groups whose replica set names `node_id` (on `shard` only, if given)."""
        return {g: p for g, p in self.groups.items() if node_id in p.replicas
                and (shard is None or p.shard == shard)}

    def shard_address(self, node_id: int, shard: int) -> str | None:
        """Where shard `shard` of node `node_id` listens (None: not registered)."""
        info = self.nodes.get(node_id)
        return None if info is None else shard_address(info.address, shard)


    # -- snapshot: the metadata as a msgpack-able map (the controller log's retention) ------
    def to_snapshot(self) -> dict[str, Any]:
        """The whole state, sorted so equal states give equal bytes on every node."""
        return {
            "v": SNAPSHOT_VERSION,
            "applied": self.applied,
            "next_group_id": self.next_group_id,
            # A node's shard count and a partition's shard are written only when not the
            # one-shard default: a one-shard cluster's snapshot is what it was before shards.
            "nodes": [[n.node_id, n.address, n.status.value, *([n.shards] if n.shards != 1
                                                              else [])]
                      for _, n in sorted(self.nodes.items())],
            "topics": [[t.name, t.topic_id, t.settings.to_raw(),
                        [[p.group, list(p.replicas), list(p.founders),
                          *([p.shard] if p.shard else [])]
                         for p in t.partitions],
                        *([origin_to_raw(t.origin, t.mirror_active)] if t.origin else [])]
                       for _, t in sorted(self.topics.items())],
            "tombstones": [[t.group, t.topic, t.partition, t.deleted_at]
                           for _, t in sorted(self.tombstones.items())],
            # Written only when there are links: a cluster without any snapshots as before.
            **({"links": [link_to_raw(link) for _, link in sorted(self.links.items())]}
               if self.links else {}),
        }

    @staticmethod
    def from_snapshot(raw: Any) -> "ClusterMetadata":
        """The state a to_snapshot() map describes; ValueError naming what is wrong (snapshots
        arrive from peers: nothing in them is trusted, and their invariants are checked)."""
        try:
            return _from_snapshot(raw)
        except (KeyError, TypeError, ValueError, MalformedCommand) as e:
            raise ValueError(f"the controller metadata snapshot is malformed ({e}); the node "
                             f"cannot trust it: fetch the controller log from another member"
                             ) from None


SNAPSHOT_VERSION = 1


def _int_field(value: Any, what: str, least: int = -1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what} must be an integer >= {least}, got {value!r}")
    return value


def _from_snapshot(raw: Any) -> ClusterMetadata:
    if not isinstance(raw, dict) or raw.get("v") != SNAPSHOT_VERSION:
        raise ValueError(f"expected a map with v={SNAPSHOT_VERSION}")
    meta = ClusterMetadata(_int_field(raw["applied"], "applied"),
                           _int_field(raw["next_group_id"], "next_group_id", FIRST_DATA_GROUP))
    for node_id, address, status, *more in raw["nodes"]:
        node_id = _int_field(node_id, "node id", 1)
        if not isinstance(address, str) or node_id in meta.nodes or len(more) > 1:
            raise ValueError(f"node {node_id}: a string address, listed once")
        meta.nodes[node_id] = NodeInfo(node_id, address, NodeStatus(status),
                                       _int_field(more[0], "shards", 1) if more else 1)
    for name, topic_id, settings, partitions, *mirror in raw["topics"]:
        if not isinstance(name, str) or topic_name_error(name) or name in meta.topics \
                or len(mirror) > 1:
            raise ValueError(f"topic {name!r}: a valid name, listed once")
        topic = Topic(name, _int_field(topic_id, "topic id", 0),
                      TopicSettings.from_raw(settings, f"topic {name!r}"))
        if mirror:
            topic.origin, topic.mirror_active = origin_from_raw(mirror[0])
        for index, (group, replicas, founders, *more) in enumerate(partitions):
            group = _int_field(group, "group id", FIRST_DATA_GROUP)
            if group >= meta.next_group_id or group in meta.groups:
                raise ValueError(f"group {group} of topic {name!r}: below next_group_id "
                                 f"{meta.next_group_id} and held once")
            for what, ids in (("replicas", replicas), ("founders", founders)):
                if not isinstance(ids, list) or not ids or len(set(ids)) != len(ids) or \
                        any(isinstance(n, bool) or n not in meta.nodes for n in ids):
                    raise ValueError(f"group {group}: {what} must be distinct known nodes")
            shard = _int_field(more[0], "shard", 0) if more else 0
            if len(more) > 1 or any(meta.nodes[n].shards <= shard for n in replicas):
                raise ValueError(f"group {group}: shard {shard} must exist on every replica")
            p = Partition(name, index, group, tuple(replicas), tuple(founders), shard)
            topic.partitions.append(p)
            meta.groups[group] = p
        if not topic.partitions:
            raise ValueError(f"topic {name!r} has no partitions")
        meta.topics[name] = topic
    for group, topic, partition, deleted_at in raw["tombstones"]:
        group = _int_field(group, "tombstone group", FIRST_DATA_GROUP)
        if group >= meta.next_group_id or group in meta.groups or group in meta.tombstones \
                or not isinstance(topic, str):
            raise ValueError(f"tombstone {group}: a deleted group id, listed once")
        meta.tombstones[group] = Tombstone(group, topic, _int_field(partition, "partition", 0),
                                           _int_field(deleted_at, "deleted_at", 0))
    for entry in raw.get("links", []):
        link = link_from_raw(entry)
        if link.name in meta.links:
            raise ValueError(f"link {link.name!r} listed twice")
        meta.links[link.name] = link
    return meta


_HANDLERS = {
    CreateTopic: ClusterMetadata._create_topic,
    AlterTopicPartitions: ClusterMetadata._alter_partitions,
    SetTopicSettings: ClusterMetadata._set_settings,
    DeleteTopic: ClusterMetadata._delete_topic,
    MoveReplicas: ClusterMetadata._move_replicas,
    RegisterNode: ClusterMetadata._register_node,
    DecommissionNode: ClusterMetadata._decommission_node,
    **LINK_HANDLERS,
}
