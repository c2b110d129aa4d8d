"""Which mirror partitions this node pulls, and the pullers' lifetimes (docs/REPLICATION.md).

One manager per node (per shard process). It runs one puller for each mirror partition whose
topic is an active mirror of an active link and whose group this node leads; a puller stops
when the leadership, the link or the topic changes. It is woken by every controller entry
applied and by every role, term or leader change of a mirror partition's group here (the
registry's `on_state_change`), so a new leader pulls at once, and by a puller that ended. It
sleeps on those events alone: a look on a timer (SCAN_S) only follows a source client that
could not be made, so a node with no links does no work here at all (issue 28: 1,000 idle
partitions). A look is one pass over the mirror partitions only, however many plain partitions
the node runs, and an idle puller costs one long-poll fetch (no per-partition timer).

When a link stops writing a mirror for good (link deleted, topic promoted or deleted), the
puller's leader deletes the link's subscription on the source partition, so the source no
longer holds retention for it (a paused link keeps it: holding is the point). A paused link
has no pullers: when it ends, the node leading the sink's controller deletes the
subscriptions of every partition of its mirrors (it remembers, from one look to the next,
which mirrors paused links fed, since the deleted link's record is gone from the metadata).

It also sets `write_refusal` on every group of an active mirror this node runs (leader or
not), so a client produce there is refused with MIRROR_READ_ONLY and what to run; a promoted
topic's groups have it cleared.

A mirror follows its source's partition count (grow.py, on the controller's leader).

Structured: every puller is a task of the manager's nursery, under its own cancel scope.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from raft.controller.link_commands import LinkEvent
from raft.controller.links import Link, LinkState, Origin
from raft.client.client import Client
from raft.core.types import Role
from raft.node.links.grow import MirrorGrower
from raft.node.links.puller import Puller, PullSpec
from raft.node.links.source import SourceClients
from raft.node.links.throttle import ByteRate
from raft.protocol.link_requests import LinkEventRequest

log = logging.getLogger("raftlog.links")

SCAN_S = 1.0
MIB = 1 << 20
GAP_REPORT_TIMEOUT_S = 10.0


def read_only_message(topic: str, origin: Origin) -> str:
    return (f"topic {topic!r} is a mirror of topic {origin.source_topic!r} of cluster "
            f"{origin.source_cluster_id} (link {origin.link!r}): it is read-only while the "
            f"link writes it. To write here (failover), run `raftlog topic promote {topic}`")


def _feeds(link: Link | None, origin: Origin, topic: str) -> bool:
    """Whether `link` is the one that writes mirror `topic` (a link deleted and created again
    under the same name, but for another source, does not inherit the topic)."""
    return (link is not None and link.source_cluster_id == origin.source_cluster_id
            and link.topics.get(origin.source_topic) == topic)


class LinkManager:
    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        node = runtime.node
        self.node = node
        self.rate = ByteRate(node.config.link_rate * MIB)
        self.sources = SourceClients(node.config.node_dir / "links")
        self.pullers: dict[int, tuple[Puller, trio.CancelScope]] = {}
        self._wake = trio.Event()
        self._own: Client | None = None
        self._releasing: dict[str, int] = {}  # link -> source positions being deleted
        self._nursery: trio.Nursery | None = None
        self._mirror_groups: set[int] = set()  # the groups of mirror topics (wanted())
        # (link, mirror topic) -> (link, partitions, source topic) for the mirrors a paused
        # link feeds, as of the last look (_release_paused_ends)
        self._paused: dict[tuple[str, str], tuple[Link, int, str]] = {}
        self._fed_now: tuple[set[tuple[str, str]], dict[tuple[str, str],
                                                        tuple[Link, int, str]]] = (set(), {})
        self._retry = False  # a look failed in part: look again after SCAN_S, not only on events
        self.looks = 0  # reconcile passes made (tests: none while nothing happens)
        self.grower = MirrorGrower(self)  # mirrors follow their sources' partition counts
        node.registry.on_state_change.append(self.group_state_changed)

    def kick(self) -> None:
        self._wake.set()

    def group_state_changed(self, group_id: int) -> None:
        """A group here changed role, term or leader: look now if it is a mirror's."""
        if group_id in self._mirror_groups:
            self._wake.set()

    @property
    def cluster_id(self) -> str:
        identity = getattr(self.node.transport, "identity", None)
        return (identity.cluster_id if identity is not None else None) or "unknown"

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.grower.run)
                while True:
                    await self.reconcile_once()
                    with trio.move_on_after(SCAN_S if self._retry else math.inf):
                        await self._wake.wait()
                    self._wake = trio.Event()
        finally:
            with trio.CancelScope(shield=True):
                await self.sources.aclose()
                if self._own is not None:
                    await self._own.aclose()

    def wanted(self) -> dict[int, tuple[PullSpec, Link]]:
        """The mirror partitions to pull here now; sets each mirror group's write_refusal."""
        meta, registry = self.runtime.metadata, self.node.registry
        out: dict[int, tuple[PullSpec, Link]] = {}
        mirror_groups: set[int] = set()
        fed: set[tuple[str, str]] = set()
        paused: dict[tuple[str, str], tuple[Link, int, str]] = {}
        for topic in meta.topics.values():
            origin = topic.origin
            if origin is None:
                continue
            mirror_groups.update(p.group for p in topic.partitions)
            link = meta.links.get(origin.link)
            feeds = topic.mirror_active and _feeds(link, origin, topic.name)
            if feeds and link is not None:
                fed.add((link.name, topic.name))
                if link.state is LinkState.PAUSED:
                    paused[(link.name, topic.name)] = (link, len(topic.partitions),
                                                       origin.source_topic)
            pulls = feeds and link is not None and link.state is LinkState.ACTIVE
            refusal = read_only_message(topic.name, origin) if topic.mirror_active else None
            for p in topic.partitions:
                group = registry.get(p.group)
                if group is None:
                    continue
                group.write_refusal = refusal
                core = group.core
                if pulls and core is not None and core.role == Role.LEADER and \
                        not group.closing:
                    assert link is not None
                    out[p.group] = (PullSpec(link.name, self.cluster_id, topic.name, p.index,
                                             p.group, origin.source_topic), link)
        self._mirror_groups = mirror_groups  # (groups not started here yet included)
        self._fed_now = (fed, paused)  # what _release_paused_ends compares with the last look
        return out

    def _release_paused_ends(self) -> None:
        """Delete the source subscriptions of mirrors that a paused link fed at the last look
        and no link feeds now (deleted or promoted while paused: no puller releases them), on
        the node leading the controller only. Best effort, as a puller's release is."""
        fed, paused = self._fed_now
        group = getattr(self.node, "controller_group", None)
        ctl = group.core if group is not None else None
        leads = ctl is not None and ctl.role == Role.LEADER and self._nursery is not None
        for key, (link, partitions, source_topic) in self._paused.items():
            if key in fed or not leads:
                continue
            specs = [PullSpec(link.name, self.cluster_id, key[1], p, -1, source_topic)
                     for p in range(partitions)]
            assert self._nursery is not None
            self._nursery.start_soon(self._release_all, specs, link)
        self._paused = paused

    def _ended(self, spec: PullSpec) -> bool:
        """Whether the link no longer writes this mirror at all (deleted, or the topic
        promoted or deleted), as opposed to paused or led elsewhere."""
        meta = self.runtime.metadata
        topic = meta.topics.get(spec.topic)
        return topic is None or topic.origin is None or not topic.mirror_active or \
            not _feeds(meta.links.get(spec.link), topic.origin, topic.name)

    async def reconcile_once(self) -> None:
        self.looks += 1
        self._retry = False
        wanted = self.wanted()
        self._release_paused_ends()
        for gid, (puller, scope) in list(self.pullers.items()):
            spec = wanted.get(gid)
            if spec is None or spec[0] != puller.spec:
                scope.cancel()
                del self.pullers[gid]
                if self._ended(puller.spec):  # its position need not hold the source any more
                    self._releasing[puller.spec.link] = \
                        self._releasing.get(puller.spec.link, 0) + 1
                    assert self._nursery is not None
                    self._nursery.start_soon(self._release, puller.spec, puller.client)
        for gid, (spec, link) in wanted.items():
            if gid in self.pullers:
                continue
            group = self.node.registry.get(gid)
            try:
                client = self.sources.client(link)
            except Exception as e:  # a bad CA in the metadata: shown, retried at each scan
                log.warning("link_source_client_failed link=%s error=%s", link.name, e)
                self._retry = True
                continue
            puller = Puller(spec, group, client, self.rate, self._report_gap)
            scope = trio.CancelScope()
            self.pullers[gid] = (puller, scope)
            assert self._nursery is not None
            self._nursery.start_soon(self._run_puller, puller, scope)
            log.info("link_puller_started link=%s topic=%s partition=%d group=%d",
                     spec.link, spec.topic, spec.partition, gid)
        await self.sources.forget_except(set(self.runtime.metadata.links) | set(self._releasing))

    async def _release_all(self, specs: list[PullSpec], link: Link) -> None:
        """_release for every partition of a mirror a paused link fed, with a client of its
        own (the link's record may be gone, and a new link may hold its name)."""
        try:
            client = self.sources.make(link)
        except Exception as e:  # a bad CA: as for a release that failed
            log.warning("link_position_release_failed link=%s error=%s", link.name, e)
            return
        self._releasing[link.name] = self._releasing.get(link.name, 0) + len(specs)
        async with client:
            for spec in specs:
                await self._release(spec, client)

    async def _release(self, s: PullSpec, client: Client) -> None:
        """Delete the link's subscription on the source partition (best effort: a source
        that cannot be reached keeps it until its expiry or valve, docs/REPLICATION.md)."""
        try:
            await client.subscription_delete(s.subscription, topic=s.source_topic,
                                             partition=s.partition,
                                             timeout=GAP_REPORT_TIMEOUT_S)
            log.info("link_position_released link=%s topic=%s partition=%d", s.link, s.topic,
                     s.partition)
        except Exception as e:
            log.warning("link_position_release_failed link=%s topic=%s partition=%d error=%s: "
                        "the source keeps holding its retention for it; delete subscription "
                        "%s there", s.link, s.topic, s.partition, e, s.subscription)
        finally:
            left = self._releasing.get(s.link, 1) - 1
            if left:
                self._releasing[s.link] = left
            else:
                self._releasing.pop(s.link, None)
                self.kick()  # its client may go now

    async def _run_puller(self, puller: Puller, scope: trio.CancelScope) -> None:
        with scope:
            try:
                await puller.run()
            except Exception:  # a bug in one puller must not stop the node: logged, retried
                log.exception("link_puller_failed link=%s topic=%s partition=%d",
                              puller.spec.link, puller.spec.topic, puller.spec.partition)
                await trio.sleep(SCAN_S)
        held = self.pullers.get(puller.spec.group)
        if held is not None and held[0] is puller:
            del self.pullers[puller.spec.group]
            self.kick()

    # -- gaps ----------------------------------------------------------------------------------
    async def _report_gap(self, spec: PullSpec, gap_from: int, gap_to: int) -> None:
        """Record a bootstrap's gap in the controller (LinkEvent); raises unless recorded."""
        ctl_group = self.node.controller_group
        if ctl_group.core is not None and ctl_group.core.role == Role.LEADER and \
                hasattr(self.runtime.controller, "propose"):
            done = await self.runtime.controller.propose(
                LinkEvent(spec.link, spec.topic, spec.partition, gap_from, gap_to),
                GAP_REPORT_TIMEOUT_S)
            if done.error is not None:
                raise RuntimeError(f"{done.error.name}: {done.message}")
            if done.result is not None and not done.result.ok:
                raise RuntimeError(done.result.reason)
            return
        if self._own is None:
            self._own = self._own_client()
        await self._own.call(LinkEventRequest(spec.link, spec.topic, spec.partition, gap_from,
                                              gap_to, int(GAP_REPORT_TIMEOUT_S * 1000)),
                             timeout=GAP_REPORT_TIMEOUT_S)

    def _own_client(self) -> Client:
        """A client to this node's own cluster, for the gap report of a node that does not
        lead the controller. With TLS it presents the node's certificate: on a sink that
        requires tokens the node has none, and a node certificate is what authenticates it
        there (for node-internal requests only, raft.node.auth.NODE_REQUESTS)."""
        cfg = self.node.config
        addresses = [n.address for n in self.runtime.metadata.nodes.values()]
        if cfg.tls_cert is None:
            return Client(addresses, timeout=GAP_REPORT_TIMEOUT_S, retry_refused=True)
        return Client(addresses, timeout=GAP_REPORT_TIMEOUT_S, retry_refused=True,
                      tls_ca=cfg.tls_ca, tls_cert=cfg.tls_cert, tls_key=cfg.tls_key)

    # -- what link describe and the metrics read --------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        """Each puller's status, with its partition's bootstraps and offsets lost so far
        (the replicated metadata's count: every bootstrap, whichever node pulled then)."""
        links = self.runtime.metadata.links
        out = []
        for p, _ in sorted(self.pullers.values(), key=lambda ps: ps[0].spec.group):
            row, link = p.status(), links.get(p.spec.link)
            gaps = link.gaps.get((p.spec.topic, p.spec.partition)) if link else None
            row["bootstraps"] = gaps.count if gaps else 0
            row["offsets_lost"] = gaps.offsets if gaps else 0
            out.append(row)
        return out
