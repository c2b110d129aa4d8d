"""What applying a controller command answers: its verdict (a refusal and why) and its effects
on groups. Shared by the topic commands (state.py) and the link commands (links_apply.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Refusal(str, Enum):
    """Why a command was refused (the same on every node)."""

    MALFORMED = "malformed"
    INVALID_NAME = "invalid_name"
    TOPIC_EXISTS = "topic_exists"
    UNKNOWN_TOPIC = "unknown_topic"
    UNKNOWN_PARTITION = "unknown_partition"
    SHRINK_REFUSED = "shrink_refused"
    INVALID_PARTITIONS = "invalid_partitions"
    INVALID_REPLICAS = "invalid_replicas"
    UNKNOWN_NODE = "unknown_node"
    NODE_DECOMMISSIONED = "node_decommissioned"
    DEFAULT_TOPIC = "default_topic"
    LINK_EXISTS = "link_exists"
    UNKNOWN_LINK = "unknown_link"
    NOT_A_MIRROR = "not_a_mirror"


class EffectKind(str, Enum):
    GROUP_CREATED = "group_created"  # its replicas start it
    GROUP_REMOVED = "group_removed"  # every node drops its data
    REPLICAS_CHANGED = "replicas_changed"  # membership change (or only the preferred leader)
    SETTINGS_CHANGED = "settings_changed"  # retention / record size of the group's topic


@dataclass(slots=True, frozen=True)
class Effect:
    """What one applied command means for one group: what nodes reconcile against."""

    kind: EffectKind
    group: int
    topic: str
    partition: int
    replicas: tuple[int, ...]
    previous: tuple[int, ...] = ()  # REPLICAS_CHANGED: the set before


@dataclass(slots=True, frozen=True)
class ApplyResult:
    refusal: Refusal | None = None
    reason: str = ""
    effects: tuple[Effect, ...] = ()

    @property
    def ok(self) -> bool:
        return self.refusal is None


def _refused(refusal: Refusal, reason: str) -> ApplyResult:
    return ApplyResult(refusal, reason)

