"""Topic-scoped permissions: which topics a principal may produce to, consume from or administer.

raft/node/auth.py gives each principal node-wide permissions (produce / consume / admin). Topics
add grants scoped to topic names or prefixes, written in a principal's `topics` list:

    [principals.orders-app]
    permissions = ["consume"]                    # node-wide, as today: every topic
    topics = ["produce:orders", "consume:logs.*", "admin:team-a.*"]

A grant is `PERMISSION:PATTERN`; a pattern ending in `*` is a prefix (`logs.*` matches
`logs.app` and `logs.` itself; `*` alone matches every topic), anything else names one topic
exactly. `*` cannot occur in a topic name, so a pattern is never ambiguous. Grants only add:
a node-wide permission still covers every topic (so today's auth files keep their meaning), and
a principal with only topic grants reaches only those topics. Like auth.py, permissions are
independent (admin does not imply produce).

Pure functions; raft/node/auth.py calls them for every request that touches a topic. The permission names are auth.Permission's values, so `TopicPermission(p.value)`
converts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from raft.controller.state import topic_name_error


class TopicPermission(str, Enum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


@dataclass(slots=True, frozen=True)
class TopicGrant:
    permission: TopicPermission
    pattern: str  # a topic name, or a prefix when `prefix`
    prefix: bool = False

    def matches(self, topic: str) -> bool:
        return topic.startswith(self.pattern) if self.prefix else topic == self.pattern

    def __str__(self) -> str:
        return f"{self.permission.value}:{self.pattern}{'*' if self.prefix else ''}"


def parse_grant(text: str) -> TopicGrant:
    """One `PERMISSION:PATTERN` grant; ValueError says what a grant looks like."""
    perm, sep, pattern = text.partition(":") if isinstance(text, str) else ("", "", "")
    try:
        permission = TopicPermission(perm)
    except ValueError:
        permission = None
    if not sep or permission is None:
        raise ValueError(f"topic grant {text!r} must be PERMISSION:PATTERN with PERMISSION one "
                         f"of {[p.value for p in TopicPermission]}, e.g. 'produce:orders' or "
                         f"'consume:logs.*'")
    prefix = pattern.endswith("*")
    name = pattern[:-1] if prefix else pattern
    if "*" in name:
        raise ValueError(f"topic grant {text!r}: '*' may only end a pattern (a prefix)")
    if name and topic_name_error(name) is not None and not (prefix and name in (".", "..")):
        raise ValueError(f"topic grant {text!r}: {topic_name_error(name)}")
    if not name and not prefix:
        raise ValueError(f"topic grant {text!r} names no topic; use '*' for every topic")
    return TopicGrant(permission, name, prefix)


def parse_grants(texts: Iterable[str]) -> tuple[TopicGrant, ...]:
    return tuple(parse_grant(t) for t in texts)


def may_use(permission: TopicPermission, topic: str, node_wide: Iterable[str],
            grants: Iterable[TopicGrant]) -> bool:
    """Whether a principal with `node_wide` permissions (auth.Permission values) and topic
    `grants` holds `permission` on `topic`."""
    if permission.value in {str(getattr(p, "value", p)) for p in node_wide}:
        return True
    return any(g.permission is permission and g.matches(topic) for g in grants)


def usable_topics(permission: TopicPermission, topics: Iterable[str], node_wide: Iterable[str],
                  grants: Iterable[TopicGrant]) -> list[str]:
    """The topics of `topics` the principal may use with `permission` (what a metadata answer
    or `topic list` shows it), sorted."""
    wide, grant_list = list(node_wide), list(grants)
    return sorted(t for t in topics if may_use(permission, t, wide, grant_list))
