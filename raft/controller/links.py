"""Links and mirror topics as the sink's controller metadata holds them (issue 30,
docs/REPLICATION.md), and their snapshot form.

A `Link` is what the sink needs to pull from the source: where it listens, its cluster id,
the TLS CA and token, the topics it mirrors (source name -> mirror name), whether it is active
or paused, and per mirror partition the bootstraps it went through (gaps are counted here, in
the replicated metadata, so every node's `link describe` shows them and no restart forgets
them). A mirror topic carries its `Origin` for ever (its offsets are translated: they keep
their meaning after a promote); `mirror_active` on the topic says whether the link still
writes it (read-only for clients) or it was promoted (writable, the link leaves it alone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

MAX_LINK_NAME = 64  # "__link.<32 hex>.<name>" must fit a subscription name (128)
_LINK_CHARS = re.compile(r"[A-Za-z0-9_-]+\Z")  # no '.': it separates the subscription name's parts
MAX_GAPS_KEPT = 8  # per partition: the latest gaps, with the count of all of them


def link_name_error(name: str) -> str | None:
    """Why `name` cannot name a link, or None if it can."""
    if not 1 <= len(name) <= MAX_LINK_NAME:
        return f"a link name is 1..{MAX_LINK_NAME} characters, got {len(name)}"
    if not _LINK_CHARS.match(name):
        return f"link name {name!r} may use only letters, digits, '_' and '-'"
    return None


def link_subscription(sink_cluster_id: str, link: str) -> str:
    """The subscription on each source partition that carries this link's position: the
    source's retention holds what the sink has not mirrored, like any subscription."""
    return f"__link.{sink_cluster_id}.{link}"


class LinkState(str, Enum):
    ACTIVE = "active"
    PAUSED = "paused"


@dataclass(slots=True, frozen=True)
class Origin:
    """Where a mirror topic comes from: the link that created it, the source cluster and
    topic."""

    link: str
    source_cluster_id: str
    source_topic: str

    def to_map(self) -> dict[str, str]:
        return {"link": self.link, "source_cluster_id": self.source_cluster_id,
                "source_topic": self.source_topic}


@dataclass(slots=True)
class Gaps:
    """The bootstraps of one mirror partition: how many, how many offsets they skipped, the
    latest few gaps (from, to inclusive)."""

    count: int = 0
    offsets: int = 0
    latest: list[tuple[int, int]] = field(default_factory=list)

    def add(self, gap_from: int, gap_to: int) -> bool:
        """Count the gap; False (nothing counted) for one that starts at or before the end of
        the latest: the puller retrying a report whose answer it lost (it was applied). A
        later bootstrap starts past the earlier gap, since the mirror went on after it."""
        if self.latest and gap_from <= self.latest[-1][1]:
            return False
        self.count += 1
        self.offsets += gap_to - gap_from + 1
        self.latest = (self.latest + [(gap_from, gap_to)])[-MAX_GAPS_KEPT:]
        return True


@dataclass(slots=True)
class Link:
    name: str
    source_servers: tuple[str, ...]
    source_cluster_id: str
    topics: dict[str, str]  # source topic -> mirror topic on this cluster
    state: LinkState = LinkState.ACTIVE
    tls_ca_pem: str = ""
    token: str = ""
    created_ms: int = 0
    created_at: int = 0  # the controller log offset of its CreateLink
    gaps: dict[tuple[str, int], Gaps] = field(default_factory=dict)  # (mirror topic, partition)

    def describe(self, secrets: bool = False) -> dict[str, Any]:
        """The link as `link list` / `link describe` show it (the token never leaves unless
        `secrets`: the pullers' own use)."""
        out: dict[str, Any] = {
            "name": self.name, "source_servers": list(self.source_servers),
            "source_cluster_id": self.source_cluster_id, "state": self.state.value,
            "topics": [{"source_topic": s, "topic": m} for s, m in sorted(self.topics.items())],
            "tls": bool(self.tls_ca_pem), "token": bool(self.token),
            "created_ms": self.created_ms,
            "gaps": [{"topic": t, "partition": p, "bootstraps": g.count,
                      "offsets_lost": g.offsets, "latest": [list(x) for x in g.latest]}
                     for (t, p), g in sorted(self.gaps.items())]}
        if secrets:
            out["tls_ca_pem"], out["token"] = self.tls_ca_pem, self.token
        return out


# -- snapshot form -------------------------------------------------------------------------------
def link_to_raw(link: Link) -> list[Any]:
    return [link.name, list(link.source_servers), link.source_cluster_id,
            [[s, m] for s, m in sorted(link.topics.items())], link.state.value,
            link.tls_ca_pem, link.token, link.created_ms, link.created_at,
            [[t, p, g.count, g.offsets, [list(x) for x in g.latest]]
             for (t, p), g in sorted(link.gaps.items())]]


def _s(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string")
    return value


def _i(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0")
    return value


def link_from_raw(raw: Any) -> Link:
    """A link_to_raw list back (ValueError naming what is wrong: snapshots come from peers)."""
    (name, servers, cid, topics, state, pem, token, created_ms, created_at, gaps) = raw
    name = _s(name, "link name")
    if link_name_error(name):
        raise ValueError(f"link {name!r}: not a valid link name")
    link = Link(name, tuple(_s(s, "source server") for s in servers), _s(cid, "cluster id"),
                {_s(s, "source topic"): _s(m, "mirror topic") for s, m in topics},
                LinkState(state), _s(pem, "tls_ca_pem"), _s(token, "token"),
                _i(created_ms, "created_ms"), _i(created_at, "created_at"))
    for topic, partition, count, offsets, latest in gaps:
        link.gaps[(_s(topic, "gap topic"), _i(partition, "gap partition"))] = Gaps(
            _i(count, "gap count"), _i(offsets, "gap offsets"),
            [(_i(a, "gap from"), _i(b, "gap to")) for a, b in latest])
    return link


def origin_to_raw(origin: Origin, mirror_active: bool) -> list[Any]:
    return [origin.link, origin.source_cluster_id, origin.source_topic, mirror_active]


def origin_from_raw(raw: Any) -> tuple[Origin, bool]:
    link, cid, source_topic, active = raw
    if not isinstance(active, bool):
        raise ValueError("a mirror topic's mirror_active must be a boolean")
    return Origin(_s(link, "origin link"), _s(cid, "origin cluster"),
                  _s(source_topic, "origin topic")), active
