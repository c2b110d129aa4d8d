"""The controller commands' field readers and failure kinds, shared by the topic commands
(commands.py) and the link commands (link_commands.py): every reader names the operation and
the field, and what it must be. See commands.py for why malformed and unsupported differ."""

from __future__ import annotations

import re
from typing import Any

MAX_REPLICAS = 16  # replicas of one partition
MAX_NODE_ID = 2**31 - 1


class MalformedCommand(ValueError):
    """A controller entry of a known kind whose fields are wrong: refused the same way on every
    node. The message names the operation and the field."""


class UnsupportedCommand(ValueError):
    """A controller entry of a version or operation this build does not know (written by a
    newer node). Applying the log past it would diverge from nodes that know it: stop and
    upgrade this node."""


def _int(raw: dict[str, Any], key: str, op: str, *, least: int, most: int) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise MalformedCommand(f"{op}: {key} must be an integer in {least}..{most}, "
                               f"got {value!r}")
    return value


def _str(raw: dict[str, Any], key: str, op: str, *, most: int) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or len(value) > most:
        raise MalformedCommand(f"{op}: {key} must be a string of at most {most} characters, "
                               f"got {type(value).__name__}")
    return value


def _node_list(value: Any, what: str, op: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= MAX_REPLICAS:
        raise MalformedCommand(f"{op}: {what} must be a list of 1..{MAX_REPLICAS} node ids")
    out = []
    for node in value:
        if isinstance(node, bool) or not isinstance(node, int) or not 1 <= node <= MAX_NODE_ID:
            raise MalformedCommand(f"{op}: {what} holds {node!r}, not a node id "
                                   f"(1..{MAX_NODE_ID})")
        out.append(node)
    return tuple(out)


MAX_TOPIC_CHARS = 249  # Kafka's limit (file names: topic + partition suffix)
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]+\Z")


def topic_name_error(name: str) -> str | None:
    """Why `name` cannot be a topic name (Kafka's rule), or None if it can."""
    if not 1 <= len(name) <= MAX_TOPIC_CHARS:
        return f"a topic name is 1..{MAX_TOPIC_CHARS} characters, got {len(name)}"
    if name in (".", ".."):
        return f"{name!r} cannot be a topic name"
    if not _TOPIC_CHARS.match(name):
        return f"topic name {name!r} may use only letters, digits, '.', '_' and '-'"
    return None
