"""The controller's link commands (issue 30, docs/REPLICATION.md): cross-cluster links and
their mirror topics, as entries of the sink cluster's controller log.

A link is pulled by the sink: `CreateLink` records where the source listens, how to reach it
(its TLS CA, a token) and which source topics it mirrors under which names, and creates those
mirror topics with the source's partition counts (the proposer placed their replicas, as for
CreateTopic). `PauseLink` / `ResumeLink` / `DeleteLink` change the link; `PromoteTopic` makes
one mirror writable for good (failover); `LinkEvent` records a bootstrap's gap on one mirror
partition, so a gap is counted in the metadata, never hidden.

Decoding trusts nothing (commands.py says why malformed and unsupported differ).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Union

from raft.controller.command_fields import MalformedCommand, _int, _node_list, _str

MAX_LINK_NAME_CHARS = 128
MAX_LINK_TOPICS = 1_000
MAX_SERVERS = 32
MAX_SERVER_CHARS = 512
MAX_PEM_CHARS = 64 * 1024
MAX_TOKEN_CHARS = 4096
MAX_TOPIC_CHARS = 1024  # decode bound (the topic name rule is the state's)
MAX_MIRROR_PARTITIONS = 10_000
MAX_OFFSET = 2**63 - 1


class LinkCommandType(str, Enum):
    CREATE_LINK = "create_link"
    DELETE_LINK = "delete_link"
    PAUSE_LINK = "pause_link"
    RESUME_LINK = "resume_link"
    PROMOTE_TOPIC = "promote_topic"
    LINK_EVENT = "link_event"


@dataclass(slots=True, frozen=True)
class MirrorTopic:
    """One mirrored topic of a link: the source's name, the mirror's name on the sink (the
    link's prefix + the source name), one replica list per source partition."""

    source_topic: str
    name: str
    replicas: tuple[tuple[int, ...], ...]

    def to_raw(self) -> list[Any]:
        return [self.source_topic, self.name, [list(r) for r in self.replicas]]

    @staticmethod
    def from_raw(raw: Any, op: str) -> "MirrorTopic":
        if not isinstance(raw, (list, tuple)) or len(raw) != 3:
            raise MalformedCommand(f"{op}: a mirror topic is [source_topic, name, replicas]")
        source, name, replicas = raw
        fields = {"source_topic": source, "name": name}
        if not isinstance(replicas, (list, tuple)) or \
                not 1 <= len(replicas) <= MAX_MIRROR_PARTITIONS:
            raise MalformedCommand(f"{op}: a mirror topic needs 1..{MAX_MIRROR_PARTITIONS} "
                                   f"replica lists (one per source partition)")
        return MirrorTopic(_str(fields, "source_topic", op, most=MAX_TOPIC_CHARS),
                           _str(fields, "name", op, most=MAX_TOPIC_CHARS),
                           tuple(_node_list(r, f"replicas[{i}]", op)
                                 for i, r in enumerate(replicas)))


@dataclass(slots=True, frozen=True)
class CreateLink:
    """A link named `name` from the cluster `source_cluster_id` (listening on
    `source_servers`), creating its mirror topics. `tls_ca_pem` ("" = plain TCP) and `token`
    ("" = none) are what the sink's pullers use to reach the source. `created_ms` is the
    proposer's clock, recorded as data (apply reads no clock)."""

    T: ClassVar[LinkCommandType] = LinkCommandType.CREATE_LINK
    name: str
    source_servers: tuple[str, ...]
    source_cluster_id: str
    mirrors: tuple[MirrorTopic, ...]
    tls_ca_pem: str = ""
    token: str = ""
    created_ms: int = 0

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name, "source_servers": list(self.source_servers),
                "source_cluster_id": self.source_cluster_id,
                "mirrors": [m.to_raw() for m in self.mirrors],
                "tls_ca_pem": self.tls_ca_pem, "token": self.token,
                "created_ms": self.created_ms}

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "CreateLink":
        servers = raw.get("source_servers")
        if not isinstance(servers, list) or not 1 <= len(servers) <= MAX_SERVERS or any(
                not isinstance(s, str) or not 1 <= len(s) <= MAX_SERVER_CHARS for s in servers):
            raise MalformedCommand(f"{op}: source_servers must be a list of 1..{MAX_SERVERS} "
                                   f"HOST:PORT strings")
        mirrors = raw.get("mirrors")
        if not isinstance(mirrors, list) or not 1 <= len(mirrors) <= MAX_LINK_TOPICS:
            raise MalformedCommand(f"{op}: mirrors must be a list of 1..{MAX_LINK_TOPICS} "
                                   f"mirror topics")
        return CreateLink(_str(raw, "name", op, most=MAX_LINK_NAME_CHARS), tuple(servers),
                          _str(raw, "source_cluster_id", op, most=MAX_SERVER_CHARS),
                          tuple(MirrorTopic.from_raw(m, op) for m in mirrors),
                          _str(raw, "tls_ca_pem", op, most=MAX_PEM_CHARS),
                          _str(raw, "token", op, most=MAX_TOKEN_CHARS),
                          _int(raw, "created_ms", op, least=0, most=MAX_OFFSET))


@dataclass(slots=True, frozen=True)
class _NamedLinkCommand:
    name: str

    def _fields(self) -> dict[str, Any]:
        return {"name": self.name}


@dataclass(slots=True, frozen=True)
class DeleteLink(_NamedLinkCommand):
    """Stop and forget a link. Its mirror topics stay, read-only, until promoted or deleted
    (deleting a link never makes a topic writable by surprise)."""

    T: ClassVar[LinkCommandType] = LinkCommandType.DELETE_LINK

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "DeleteLink":
        return DeleteLink(_str(raw, "name", op, most=MAX_LINK_NAME_CHARS))


@dataclass(slots=True, frozen=True)
class PauseLink(_NamedLinkCommand):
    """Stop pulling (mirrors stay read-only; the source's retention still holds what the link
    has not mirrored, up to its age valve)."""

    T: ClassVar[LinkCommandType] = LinkCommandType.PAUSE_LINK

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "PauseLink":
        return PauseLink(_str(raw, "name", op, most=MAX_LINK_NAME_CHARS))


@dataclass(slots=True, frozen=True)
class ResumeLink(_NamedLinkCommand):
    T: ClassVar[LinkCommandType] = LinkCommandType.RESUME_LINK

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "ResumeLink":
        return ResumeLink(_str(raw, "name", op, most=MAX_LINK_NAME_CHARS))


@dataclass(slots=True, frozen=True)
class PromoteTopic(_NamedLinkCommand):
    """Make mirror topic `name` writable: its link stops mirroring it, for good. It keeps its
    origin (its offsets stay translated: they must not change meaning)."""

    T: ClassVar[LinkCommandType] = LinkCommandType.PROMOTE_TOPIC

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "PromoteTopic":
        return PromoteTopic(_str(raw, "name", op, most=MAX_TOPIC_CHARS))


@dataclass(slots=True, frozen=True)
class LinkEvent:
    """A bootstrap of mirror partition (`topic`, `partition`) of link `link`: the source no
    longer held visible offsets `gap_from`..`gap_to` (inclusive), so the mirror continues at
    the source's log start and those offsets are missing from it."""

    T: ClassVar[LinkCommandType] = LinkCommandType.LINK_EVENT
    link: str
    topic: str
    partition: int
    gap_from: int
    gap_to: int

    def _fields(self) -> dict[str, Any]:
        return {"link": self.link, "topic": self.topic, "partition": self.partition,
                "gap_from": self.gap_from, "gap_to": self.gap_to}

    @staticmethod
    def _parse(raw: dict[str, Any], op: str) -> "LinkEvent":
        gap_from = _int(raw, "gap_from", op, least=0, most=MAX_OFFSET)
        return LinkEvent(_str(raw, "link", op, most=MAX_LINK_NAME_CHARS),
                         _str(raw, "topic", op, most=MAX_TOPIC_CHARS),
                         _int(raw, "partition", op, least=0, most=MAX_MIRROR_PARTITIONS - 1),
                         gap_from, _int(raw, "gap_to", op, least=gap_from, most=MAX_OFFSET))


LinkCommand = Union[CreateLink, DeleteLink, PauseLink, ResumeLink, PromoteTopic, LinkEvent]
LINK_COMMANDS = (CreateLink, DeleteLink, PauseLink, ResumeLink, PromoteTopic, LinkEvent)
