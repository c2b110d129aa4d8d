"""Topics in the node (issue 26): the controller (group 0), the reconciler, routing of
partition-addressed requests, membership mirrored into the controller, per-partition status.

The node (raft.node.server.Node) runs two groups from boot: the controller, group 0, and the
default topic's partition, storage.api.LEGACY_GROUP (1), whose log is the store's legacy key
space (a data directory written before topics is the default topic). `TopicRuntime` holds what
makes the rest follow the controller:
- `controller` (raft.node.controller.ControllerService): the applied metadata, the bootstrap,
  admin proposals;
- `reconciler` (raft.node.reconciler.Reconciler): partition groups started, stopped, dropped;
- `mover` (raft.node.replica_moves.ReplicaMover): where this node leads a partition, its
  configuration driven toward the metadata's replica list (replica moves);
- `balancer` (raft.node.leader_balance.LeaderBalancer): leaderships of the partitions it leads
  handed back to their preferred replicas, a few a round;
- membership: the default topic's group keeps a replica on every member node, as the single log
  did, and `add_node` / `remove_node` change its configuration as before; the controller
  group's leader mirrors that configuration into the controller group, one single-server
  change at a time, and registers new members (RegisterNode), so cluster membership is the
  controller's voters and every member follows the controller.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from raft.controller.commands import RegisterNode
from raft.controller.state import DEFAULT_TOPIC, ClusterMetadata, shard_address
from raft.node.config import ConfigError
from raft.node.controller import ControllerService
from raft.node.shard_feed import (FeedWriter, LeaderReporter, ShardFollower, feed_fds,
                                  shard_figures)
from raft.node.reconciler import UNMANAGED, Reconciler
from raft.node.leader_balance import LeaderBalancer
from raft.node.links.manager import LinkManager
from raft.node import mirror_reads
from raft.node.replica_moves import ReplicaMover
from raft.node.topics import Resolved, resolve, unknown_partition, unknown_topic
from raft.protocol.replies import ErrorReply
from raft.protocol.requests import CONTROLLER_GROUP
from raft.core.types import ErrorCode, Role
from storage.api import LEGACY_GROUP, LogStorage, LogStore

# The node: raft.node.server.Node, which imports this module (so it is not imported here).
Node = Any

log = logging.getLogger("raftlog.node")

DEFAULT_GROUP = LEGACY_GROUP  # the default topic's partition 0
MIRROR_EVERY_TICKS = 10  # how often the controller's leader compares memberships
# What a request naming the controller's group (0) explicitly may be: its status and the
# controller's own requests; never a client's write or read of its log.
CONTROLLER_REQUESTS = frozenset({"status", "metadata", "topic_create", "topic_alter",
                                 "topic_delete", "topic_move", "transfer_leader",
                                 "link_create", "link_alter", "topic_promote", "link_event",
                                 "link_list", "link_status"})


class TopicRuntime:
    """See the module docstring; one per node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.node_id = node.node_id
        # Shards (docs/SHARDS.md): the controller lives on shard 0; shard k follows what
        # shard 0 applied (raft.node.shard_feed) and runs the partitions placed on shard k.
        self.shard = node.config.shard
        writes, reports, read, report = feed_fds()
        self.feed: FeedWriter | None = None
        self.reporter: LeaderReporter | None = None
        self.controller: Any
        if self.shard == 0:
            self.controller = ControllerService(node.controller_group, self._founders)
            self.controller.shards = node.config.shards
            if writes:
                self.feed = FeedWriter(writes, self, reports)
                self.controller.on_applied.append(self.feed.kick)
        elif read is None:
            raise ConfigError(f"shard {self.shard} follows the controller through its "
                              f"supervisor: run `raftlog serve --shards N`, not a shard alone")
        else:
            self.controller = ShardFollower(read, self.shard)
            if report is not None:
                self.reporter = LeaderReporter(report, self)
        self.reconciler = Reconciler(self)
        self.controller.on_applied.append(self.reconciler.kick)
        # Settings changes (topic alter) take effect on the running partitions at once.
        self.controller.on_applied.append(node.settings.on_applied)
        self.mover = ReplicaMover(self)  # replica moves, carried out where this node leads
        self.unmanaged = UNMANAGED
        self.balancer = LeaderBalancer(self)  # leadership back to preferred replicas
        # Cross-cluster links (issue 30): pullers where this node leads a mirror partition.
        self.links = LinkManager(self)
        self.controller.on_applied.append(self.links.kick)
        self._shards_warned: str | None = None
        if self.shard == 0:
            self.controller.on_applied.append(self._check_registered_shards)

    # -- what the reconciler needs (raft.node.reconciler.ReconcileHost) ---------------------------
    @property
    def metadata(self) -> ClusterMetadata:
        return self.controller.metadata

    @property
    def store(self) -> LogStore:
        assert self.node.group.log is not None
        return self.node.group.log.store

    def running_groups(self) -> list[int]:
        return self.node.registry.ids()

    def know_node(self, node_id: int, address: str) -> None:
        address = shard_address(address, self.shard)  # shard i talks to shard i only
        if node_id != self.node_id and node_id not in self.node.peer_addresses:
            self.node.set_peer_address(node_id, address)

    def founders_of(self, group_id: int) -> tuple[int, ...] | None:
        """The replicas `group_id` was created with (None: not a live group here). They are in
        the metadata (Partition.founders), so a cut controller log keeps them."""
        p = self.controller.metadata.groups.get(group_id)
        return p.founders if p is not None else None

    def still_named(self, group_id: int) -> bool:
        group = self.node.registry.get(group_id)
        if group is None or group.core is None:
            return False
        core = group.core
        if self.node_id in core.config.members:
            return True
        # Not named by the configuration in force: final only once that entry committed (an
        # uncommitted one can be truncated away, bringing back one that names this node).
        return core._configs[-1].offset > core.commit_index

    async def add_group(self, group_id: int, voters: list[int], log_storage: LogStorage, *,
                        owns_log: bool = False, translated: bool = False) -> Any:
        partition = self.metadata.groups.get(group_id)
        topic = self.metadata.topics.get(partition.topic) if partition is not None else None
        # A mirror topic's partitions (a topic with an origin: docs/REPLICATION.md) are
        # translated groups, for good: offsets keep their meaning after a promote.
        translated = translated or (topic is not None and topic.origin is not None)
        group = await self.node.add_group(group_id, voters, log_storage, owns_log=owns_log,
                                          translated=translated)
        if partition is not None and group.core is not None and partition.replicas:
            # A new partition's preferred replica campaigns first, the others later
            # (RaftCore.first_election): one election per group at a topic create.
            group.core.first_election(partition.replicas[0] == self.node_id)
        return group

    async def remove_group(self, group_id: int) -> None:
        await self.node.remove_group(group_id)

    def _check_registered_shards(self) -> None:
        """Loud, once per state: the metadata registers this node with another shard count
        than it runs (docs/SHARDS.md: every node runs the same K for now)."""
        warning = shard_count_mismatch(self.metadata, self.node_id, self.node.config.shards)
        if warning is not None and warning != self._shards_warned:
            log.error("%s", warning)
        self._shards_warned = warning

    # -- the tasks -----------------------------------------------------------------------------
    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self.controller.run)
        nursery.start_soon(self.reconciler.run)
        if self.feed is not None:
            nursery.start_soon(self.feed.run)
        if self.reporter is not None:
            nursery.start_soon(self.reporter.run)
        if self.shard == 0:  # (shard k's own group 0 is not the controller)
            nursery.start_soon(self._mirror_membership)
        nursery.start_soon(self.mover.run)
        nursery.start_soon(self.balancer.run)
        nursery.start_soon(self.links.run)

    def _founders(self) -> dict[int, str]:
        """The controller's voters and where they listen: who the bootstrap registers."""
        core = self.node.controller_group.core
        out = {}
        for n in core.config.voters:
            address = (self.node.address if n == self.node_id
                       else self.node.peer_address(n) or core.config.addresses.get(n))
            if address:
                out[n] = address
        return out

    async def _mirror_membership(self) -> None:
        """The controller's leader makes the controller's configuration follow the default
        topic's (add_node / remove_node change that one): one change at a time, the next once
        it committed; and registers members the metadata does not know."""
        interval = MIRROR_EVERY_TICKS * self.node.config.tick_ms / 1000
        while True:
            await trio.sleep(interval)
            try:
                await self.mirror_once()
            except Exception:  # a refused change is retried at the next round
                log.exception("membership_mirror_failed node=%d", self.node_id)

    async def mirror_once(self) -> None:
        ctl, default = self.node.controller_group, self.node.group
        if (ctl.core is None or default.core is None or ctl.core.role != Role.LEADER
                or ctl.closing):
            return
        want, have = default.core.config, ctl.core.config
        want_members, have_members = set(want.members), set(have.members)
        timeout = self.node.config.default_timeout_ms / 1000
        if want_members - have_members:
            n = min(want_members - have_members)
            address = want.addresses.get(n) or self.node.peer_address(n)
            if address:
                log.info("controller_membership_follow node=%d add_learner=%d", self.node_id, n)
                await ctl.call_core(lambda rid: ctl.core.propose_config(
                    rid, add_learner=n, address=address), timeout)
            return
        if have_members - want_members and want_members:
            n = min(have_members - want_members)
            log.info("controller_membership_follow node=%d remove=%d", self.node_id, n)
            await ctl.call_core(lambda rid: ctl.core.propose_config(rid, remove=n), timeout)
            return
        meta = self.metadata
        if not meta.nodes:
            return  # not bootstrapped yet: the bootstrap registers the founders
        for n in sorted(have.voters):
            address = have.addresses.get(n) or self.node.peer_address(n)
            if n not in meta.nodes and address:  # (every node runs as many shards)
                await self.controller.propose(RegisterNode(n, address, self.node.config.shards),
                                              timeout)
                return

    # -- routing -------------------------------------------------------------------------------
    def leader_of(self, group_id: int) -> tuple[int | None, str | None]:
        if self.shard and group_id == CONTROLLER_GROUP:  # shard 0's
            return self.controller.leader_hint
        group = self.node.registry.get(group_id)
        if group is None or group.core is None or (self.shard and group_id in self.unmanaged):
            return self._other_shard_leader(group_id)
        leader = group.core.leader_id
        return leader, self.node.peer_address(leader) if leader != self.node_id \
            else self.node.address

    def _shard_lines(self, meta: ClusterMetadata) -> list[dict[str, Any]]:
        """Shard 0's view of every shard of this node (docs/SHARDS.md): its address, the
        partitions placed on it and how many of them it leads (its reports); [] with one."""
        shards = self.node.config.shards
        if self.shard or shards == 1:
            return []
        leaders = self.feed.leaders() if self.feed is not None else {}
        info = meta.nodes.get(self.node_id)
        out = []
        for k in range(shards):
            placed = meta.groups_of(self.node_id, k)
            if k == 0 and DEFAULT_GROUP not in placed and DEFAULT_GROUP in self.node.registry:
                placed = {**placed, DEFAULT_GROUP: None}
            figures = (shard_figures(self) if k == 0 else
                       self.feed.figures.get(k, {}) if self.feed is not None else {})
            out.append({"shard": k,
                        "address": None if info is None else shard_address(info.address, k),
                        "partitions": len(placed),
                        "leading": sum(1 for g in placed if leaders.get(g) == self.node_id),
                        "reported": k == 0 or bool(figures),
                        **{f: figures.get(f) for f in SHARD_FIGURES}})
        return out

    def _other_shards(self, meta: ClusterMetadata) -> list[dict[str, Any]]:
        """Shard 0's lines for the partitions shards 1..K-1 of this node run (docs/SHARDS.md),
        so the node's `status` counts all of them: each from the metadata and the leader its
        shard reported ("leader", "follower", or None while it knows none); [] on shard k."""
        if self.shard or self.feed is None:
            return []
        leaders = self.feed.leaders()
        out = []
        for k in range(1, self.node.config.shards):
            for group_id in sorted(meta.groups_of(self.node_id, k)):
                p = meta.groups[group_id]
                leader = leaders.get(group_id)
                role = None if leader is None else \
                    "leader" if leader == self.node_id else "follower"
                out.append({"topic": p.topic, "partition": p.index, "group": group_id,
                            "shard": k, "role": role, "leader": leader,
                            "replicas": list(p.replicas)})
        return out

    def _other_shard_leader(self, group_id: int) -> tuple[int | None, str | None]:
        """The leader of a partition another shard of this node runs, as that shard reported
        it (through shard 0: raft.node.shard_feed), at its shard's address."""
        leaders = (self.feed.leaders() if self.feed is not None
                   else getattr(self.controller, "leaders", {}))
        leader = leaders.get(group_id)
        if leader is None:
            return None, None
        meta = self.metadata
        p = meta.groups.get(group_id)
        return leader, meta.shard_address(leader, 0 if p is None else p.shard)

    def route(self, t: str, request: Any) -> Resolved:
        """The group a client request goes to: its explicit `group` (never the controller's
        for a request that is not the controller's own), else its (topic, partition)."""
        group_id = request.group
        if group_id is None and self.shard and t == "status" and \
                getattr(request, "topic", DEFAULT_TOPIC) == DEFAULT_TOPIC:
            return Resolved(DEFAULT_GROUP)  # this shard process's own status
        if group_id is None:
            partition = getattr(request, "topic_partition", None)
            return self.resolve(getattr(request, "topic", DEFAULT_TOPIC),
                                getattr(request, "partition", 0) if partition is None
                                else partition)
        if self.shard and group_id in self.unmanaged and t not in CONTROLLER_REQUESTS:
            return Resolved(None, ErrorReply(
                ErrorCode.NOT_LEADER,
                f"group {group_id} lives on shard 0 of each node; this is shard {self.shard} "
                f"(`metadata` says where each partition's shard listens)",
                {"leader_id": None, "group": group_id}))
        if group_id == CONTROLLER_GROUP and t not in CONTROLLER_REQUESTS:
            return Resolved(None, ErrorReply(
                ErrorCode.BAD_REQUEST,
                f"group {CONTROLLER_GROUP} is the controller's log (the cluster's metadata): "
                f"{t} is not served on it; leave out the group field and name a topic and "
                f"partition (`metadata` lists them)"))
        return Resolved(group_id)

    def topic_of_group(self, group_id: int | None) -> str | None:
        """The topic whose partition `group_id` is (None: the controller's group, or a group
        the applied metadata does not name): what topic-scoped permissions check."""
        if group_id is None or group_id == CONTROLLER_GROUP:
            return None
        p = self.metadata.groups.get(group_id)
        if p is not None:
            return p.topic
        return DEFAULT_TOPIC if group_id == DEFAULT_GROUP else None

    def resolve(self, topic: str, partition: int) -> Resolved:
        """The group a request for (topic, partition) goes to here, or the refusal."""
        meta = self.metadata
        if topic == DEFAULT_TOPIC and partition == 0 and self.shard == 0:
            return Resolved(DEFAULT_GROUP)  # from boot, before the controller's first commit
        if not meta.topics:
            if topic != DEFAULT_TOPIC:
                return Resolved(None, unknown_topic(_with_default(meta), topic))
            return Resolved(None, unknown_partition(_default_only(), partition))
        if self.shard:  # shard k runs its own partitions only (its groups 0, 1 are not)
            return resolve(meta, topic, partition,
                           lambda g: g in self.node.registry and g not in self.unmanaged,
                           self.node.peer_address, self.shard)
        return resolve(meta, topic, partition, lambda g: g in self.node.registry,
                       self.node.peer_address)

    # -- status ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """`status`'s `partitions` (one line per group this node runs) and `controller`."""
        meta = self.metadata
        lines = []
        for group_id in self.node.registry.ids():
            if group_id == CONTROLLER_GROUP or (self.shard and group_id in self.unmanaged):
                continue  # (shard k's own groups 0 and 1 are no partitions: docs/SHARDS.md)
            group = self.node.registry.get(group_id)
            core = group.core
            p = meta.groups.get(group_id)
            topic, index = ((p.topic, p.index) if p is not None
                            else (DEFAULT_TOPIC, 0) if group_id == DEFAULT_GROUP
                            else (None, None))
            lines.append({"topic": topic, "partition": index, "group": group_id,
                          "role": core.role.value, "leader": core.leader_id,
                          "term": core.term, "commit_index": core.commit_index,
                          "high_watermark": core.high_watermark,
                          "log_start": group.log.start_offset,
                          "voters": list(core.config.voters),
                          "learners": list(core.config.learners),
                          "replicas": None if p is None else list(p.replicas),
                          "move": _move_step(self.mover.steps.get(group_id))})
            if group.translated:  # a mirror partition: what clients see is in visible offsets
                lines[-1].update(translated=True, visible_end=core.visible_end,
                                 high_watermark=mirror_reads.visible_hw(group, core.commit_index),
                                 log_start=mirror_reads.visible_start(group))
        ctl = self.node.controller_group.core if self.shard == 0 else None
        leader, address = self.leader_of(CONTROLLER_GROUP)
        shard_lines = self._shard_lines(meta)
        return {"partitions": lines, "shard": self.shard, "shards": self.node.config.shards,
                "node_shards": shard_lines, "shard_partitions": self._other_shards(meta),
                "node_totals": node_totals(shard_lines),
                "controller": {"leader": leader, "leader_address": address,
                               "applied": meta.applied,
                               "role": None if ctl is None else ctl.role.value,
                               "topics": len(meta.topics)}}


SHARD_FIGURES = ("groups", "cpu_seconds", "rss_bytes", "loop_lag_max_ms")


def shard_count_mismatch(meta: ClusterMetadata, node_id: int, shards: int) -> str | None:
    """The log line when the cluster registered `node_id` with another shard count than the
    `shards` it runs (nodes are registered with the registering node's count: a node started
    with another --shards, or the default on a machine with other cores); None when alike."""
    info = meta.nodes.get(node_id)
    if info is None or info.shards == shards:
        return None
    what = (f"shards {shards}..{info.shards - 1} have no process to run them"
            if info.shards > shards else f"its shards {info.shards}..{shards - 1} get none")
    return (f"shard_count_mismatch node={node_id} runs={shards} registered={info.shards}: the "
            f"controller places partitions on shards 0..{info.shards - 1} of this node, and "
            f"{what}. Every node of a cluster runs the same --shards for now (a node keeps the "
            f"count its data was written with): start this node anew, on an empty --data-dir, "
            f"with --shards {info.shards}, after moving its replicas away (docs/SHARDS.md "
            f"\"Changing the shard count\")")


def node_totals(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The node's figures over its shards' lines (None with one shard): sums, and the
    largest loop lag; figures of a shard that has not reported yet are left out."""
    if not lines:
        return None
    out: dict[str, Any] = {"shards": len(lines)}
    for key in ("partitions", "leading", "groups", "cpu_seconds", "rss_bytes"):
        vals = [line[key] for line in lines if line.get(key) is not None]
        out[key] = round(sum(vals), 2) if vals else None
    lags = [line["loop_lag_max_ms"] for line in lines if line.get("loop_lag_max_ms") is not None]
    out["loop_lag_max_ms"] = max(lags) if lags else None
    return out


def partition_series(runtime: TopicRuntime, limit: int) -> dict[str, Any]:
    """Per-partition figures for /metrics, read at scrape time (never per request or tick):
    for every data group this node runs, its topic and partition, high watermark and known
    leader; on the leader also its commit lag (dirty offset - commit index) and each
    follower's flushed lag (dirty offset - the follower's verified flushed offset). At most
    `limit` partitions get series (bounded cardinality): the ones this node leads first, the
    furthest behind first; `left_out` counts the others. Cost: one pass over the groups."""
    meta = runtime.metadata
    rows = []
    for group in runtime.node.registry.groups():
        group_id, core = group.group_id, group.core
        if group_id == CONTROLLER_GROUP or core is None or group.log is None or \
                (runtime.shard and group_id in runtime.unmanaged):
            continue
        p = meta.groups.get(group_id)
        topic, index = ((p.topic, p.index) if p is not None else (DEFAULT_TOPIC, 0)
                        if group_id == DEFAULT_GROUP else (None, None))
        if topic is None:
            continue  # not in the applied metadata (yet, or any more)
        row: dict[str, Any] = {"topic": topic, "partition": index,
                               "high_watermark": mirror_reads.visible_hw(group, core.commit_index)
                               if group.translated else core.high_watermark,
                               "leader": core.leader_id or 0, "leads": False, "worst": 0}
        leader = core.leader if core.role == Role.LEADER else None
        if leader is not None:
            dirty = group.log.dirty_offset
            row["leads"] = True
            row["commit_lag"] = max(0, dirty - core.commit_index)
            row["followers"] = {pr.node_id: max(0, dirty - pr.flushed_offset)
                                for pr in leader.progress.values()
                                if pr.node_id != runtime.node_id}
            row["worst"] = max([row["commit_lag"], *row["followers"].values()])
        rows.append(row)
    rows.sort(key=lambda r: (not r["leads"], -r["worst"], r["topic"], r["partition"]))
    return {"series": rows[:limit], "left_out": max(0, len(rows) - limit)}


def _move_step(step: Any) -> str | None:
    """What the partition's leader is doing toward the desired replicas (None elsewhere)."""
    return None if step is None else step.kind.value


def _default_only() -> Any:
    from raft.controller.state import Partition, Topic
    from raft.controller.commands import TopicSettings
    t = Topic(DEFAULT_TOPIC, -1, TopicSettings())
    t.partitions.append(Partition(DEFAULT_TOPIC, 0, DEFAULT_GROUP, ()))
    return t


def _with_default(meta: ClusterMetadata) -> ClusterMetadata:
    """Before the bootstrap applied, the default topic exists all the same."""
    shown = ClusterMetadata()
    shown.topics[DEFAULT_TOPIC] = _default_only()
    return shown
