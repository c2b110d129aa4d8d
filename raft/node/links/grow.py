"""A mirror follows its source topic's partition count (docs/REPLICATION.md).

A mirror topic has its source's partitions, at the same offsets; when the source grows
(`raftlog topic alter T --partitions N` there), the sink grows the mirror to N too, so the
new partitions get pullers like the others. Only an active mirror of an active link that
feeds it follows (a promoted topic is the sink's own: it keeps its partitions; a paused link
waits until resumed). Partitions only grow, so a mirror never has more than its source had.

Who: the node that leads the sink's controller (one node per cluster, and it proposes the
grow itself, `plan_grow_topic`, as `topic alter` would). Every GROW_CHECK_S it reads each
active link's source metadata through the link's client (one `metadata` request per link),
nothing else; other nodes only sleep.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from raft.controller.links import LinkState
from raft.controller.placement import PlacementError, plan_grow_topic
from raft.controller.state import ClusterMetadata
from raft.core.types import Role

log = logging.getLogger("raftlog.links")

GROW_CHECK_S = 10.0
GROW_TIMEOUT_S = 10.0


def feeds(meta: ClusterMetadata, topic: Any) -> bool:
    """Whether `topic` is an active mirror written by an active link that feeds it now."""
    origin = topic.origin
    if origin is None or not topic.mirror_active:
        return False
    link = meta.links.get(origin.link)
    return (link is not None and link.state is LinkState.ACTIVE
            and link.source_cluster_id == origin.source_cluster_id
            and link.topics.get(origin.source_topic) == topic.name)


def grows(meta: ClusterMetadata,
          source_counts: dict[str, dict[str, int]]) -> list[tuple[str, int]]:
    """(mirror topic, partitions) for each mirror whose source has more partitions than it
    (`source_counts`: link -> source topic -> partition count, what the source's metadata
    said). Pure, so the rule is tested on its own."""
    out = []
    for topic in sorted(meta.topics.values(), key=lambda t: t.name):
        if not feeds(meta, topic):
            continue
        origin = topic.origin
        have = source_counts.get(origin.link, {}).get(origin.source_topic)
        if have is not None and have > len(topic.partitions):
            out.append((topic.name, have))
    return out


class MirrorGrower:
    """The controller leader's look at its links' sources (see the module docstring)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def _leads_controller(self) -> bool:
        runtime = self.manager.runtime
        ctl = self.manager.node.controller_group
        return (ctl.core is not None and ctl.core.role == Role.LEADER
                and hasattr(runtime.controller, "propose"))

    async def run(self) -> None:
        while True:
            await trio.sleep(GROW_CHECK_S)  # one wake a period per node, whatever it runs
            if self._leads_controller():
                await self.check_once()

    async def source_counts(self) -> dict[str, dict[str, int]]:
        meta = self.manager.runtime.metadata
        wanted: dict[str, set[str]] = {}
        for topic in meta.topics.values():
            if feeds(meta, topic):
                wanted.setdefault(topic.origin.link, set()).add(topic.origin.source_topic)
        out: dict[str, dict[str, int]] = {}
        for name, topics in sorted(wanted.items()):
            try:
                client = self.manager.sources.client(meta.links[name])
                with trio.move_on_after(GROW_TIMEOUT_S):
                    source = await client.refresh_metadata()
            except Exception as e:  # a bad CA: the manager reports it; try again next time
                log.info("link_source_metadata_failed link=%s error=%s", name, e)
                continue
            if source is None:
                continue
            counts = out[name] = {}
            for t in topics:
                info = source.topics.get(t)
                if info is not None:
                    counts[t] = info.partition_count
        return out

    async def check_once(self) -> list[tuple[str, int]]:
        """Grow the mirrors whose sources grew; what it proposed and was applied."""
        counts = await self.source_counts()
        done = []
        runtime = self.manager.runtime
        for name, partitions in grows(runtime.metadata, counts):
            if not self._leads_controller():
                break
            try:
                command = plan_grow_topic(runtime.metadata, name, partitions)
            except PlacementError as e:
                log.warning("link_mirror_grow_refused topic=%s partitions=%d error=%s: add "
                            "nodes, or run `raftlog topic alter %s --partitions %d` when "
                            "they are", name, partitions, e, name, partitions)
                continue
            answer = await runtime.controller.propose(command, GROW_TIMEOUT_S)
            if answer.error is None and (answer.result is None or answer.result.ok):
                log.info("link_mirror_grown topic=%s partitions=%d", name, partitions)
                done.append((name, partitions))
            else:
                log.warning("link_mirror_grow_failed topic=%s partitions=%d error=%s %s",
                            name, partitions, answer.error, answer.message)
        return done
