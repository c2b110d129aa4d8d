"""Per-topic settings in force on this node's partitions (issue 26 item 7): retention by size and
age, and the largest record a producer may write.

The controller stores each topic's settings (raft.controller.commands.TopicSettings; None means
"the cluster default"). The defaults are this node's flags (`--retention-bytes`,
`--retention-ms`; no record size limit beyond `--max-frame-bytes`), so the default topic and
every topic that set nothing behave exactly as the single log did. The other retention knobs
(`--retention-min-ms`, `--retention-max-ms`, `--low-disk-mb`) stay node-wide: they protect the
node's disk, not a topic's data.

How a change takes effect without a restart: each data group reads its settings through
`SettingsInForce.of(group_id)` when it needs them (the retention task once per round, produce
once per request), so the value is always the one of the metadata applied now. Reads are a dict
lookup: the resolved settings are cached per group and the cache is dropped after every applied
controller step (`on_applied`), which also wakes the retention tasks that had nothing to do
(an idle retention task waits on an event, never on a timer: no per-tick work per partition).

The controller's own group (0) runs its own size limit instead (`controller_retention_bytes`,
set by the node: raft.node.server, raft.node.controller).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from raft.controller.commands import TopicSettings
from raft.controller.state import ClusterMetadata
from raft.core.retention import RetentionPolicy


@dataclass(slots=True, frozen=True)
class GroupSettings:
    """What one partition runs with now."""

    retention: RetentionPolicy
    max_record_bytes: int | None  # None: no limit beyond the frame size
    topic: str | None = None  # None: a group the applied metadata does not name (yet)


class SettingsInForce:
    """The node's resolver of per-partition settings (see the module docstring)."""

    def __init__(self, node_policy: RetentionPolicy,
                 metadata: Callable[[], ClusterMetadata],
                 groups: Callable[[], Iterable[Any]]) -> None:
        self._node_policy = node_policy  # the node's flags: every topic's defaults
        self.defaults = TopicSettings(node_policy.max_bytes, node_policy.max_age_ms, None)
        self._metadata = metadata
        self._groups = groups  # the running raft.node.group.RaftGroup objects
        self._cache: dict[int, GroupSettings] = {}
        self._by_topic: dict[str, GroupSettings] = {}

    def of(self, group_id: int) -> GroupSettings:
        """The settings group `group_id` runs with under the metadata applied now."""
        got = self._cache.get(group_id)
        if got is None:
            got = self._cache[group_id] = self._resolve(group_id)
        return got

    def _resolve(self, group_id: int) -> GroupSettings:
        meta = self._metadata()
        partition = meta.groups.get(group_id)
        if partition is None:  # the default topic before the bootstrap applied, or unknown
            settings, topic = self.defaults, None
        else:
            topic = partition.topic
            shared = self._by_topic.get(topic)  # a topic's partitions share one resolution
            if shared is not None:
                return shared
            settings = meta.settings_of(group_id, self.defaults)
        policy = dataclasses.replace(self._node_policy, max_bytes=settings.retention_bytes,
                                     max_age_ms=settings.retention_ms)
        resolved = GroupSettings(policy, settings.max_record_bytes, topic)
        if topic is not None:
            self._by_topic[topic] = resolved
        return resolved

    def on_applied(self) -> None:
        """A controller step applied: settings may have changed. Forget the cache and wake the
        retention tasks whose policy is now active (an idle task waits for this)."""
        self._cache.clear()
        self._by_topic.clear()
        for group in self._groups():
            task = getattr(group, "retention", None)
            if task is not None and task.follows_settings:
                task.wake()

    def forget(self, group_id: int) -> None:
        self._cache.pop(group_id, None)


def record_over(payload: bytes, limit: int) -> tuple[int, int] | None:
    """(index, encoded size) of the first record of a valid records payload
    (storage/records.py, already checked) whose encoding [key, value, headers] is larger than
    `limit` bytes; None when every record fits. A payload no larger than the limit needs no
    walk; otherwise each record is skipped by its length in C (msgpack), never copied."""
    if len(payload) <= limit:
        return None
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(payload), 1))
    unpacker.feed(payload)
    for index in range(unpacker.read_array_header()):
        start = unpacker.tell()
        unpacker.skip()
        size = unpacker.tell() - start
        if size > limit:
            return index, size
    return None
