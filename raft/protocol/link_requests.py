"""Link requests as typed values (issue 30, docs/REPLICATION.md): the sink cluster's admin
requests for cross-cluster links, answered by the controller's leader once its entry applied
(`link_create`, `link_alter`, `topic_promote`, `link_event`), and two reads any node answers:
`link_list` (the links in the metadata it applied) and `link_status` (the pullers this node
runs, with their lag).

Replies: `link_create` / `link_alter` -> {"link": link map}; `topic_promote` -> {"topic": topic
map}; `link_event` -> {}; `link_list` -> {"links": [link map], "cluster_id"};
`link_status` -> {"node_id", "partitions": [puller map]}.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from raft.protocol.fields import get_int, get_str
from raft.protocol.framing import WireError
from raft.protocol.requests import CONTROLLER_GROUP, Limits, request_frame, topic_name

MAX_LINK_TOPICS = 1_000
MAX_SERVERS = 32
MAX_TEXT = 64 * 1024
MAX_PARTITIONS = 10_000
MAX_REPLICAS = 16
MAX_OFFSET = 2**63 - 1
LINK_OPS = ("pause", "resume", "delete")


def _admin(t: str, rid: int, fields: dict[str, Any], timeout_ms: int | None) -> dict[str, Any]:
    if timeout_ms is not None:
        fields["timeout_ms"] = timeout_ms
    return request_frame(t, rid, fields)


def _link_name(frame: dict[str, Any], where: str, key: str = "name") -> str:
    value = get_str(frame, key, where=where)
    if not 1 <= len(value) <= 128:
        raise WireError(f'{where} field "{key}" must be a link name of 1..128 characters')
    return value


@dataclass(slots=True)
class LinkCreate:
    """Create link `name` mirroring `mirrors` ([source topic, mirror name, partitions] each,
    the partition counts the source's) from the cluster `source_cluster_id`."""

    T: ClassVar[str] = "link_create"
    name: str
    source_servers: list[str]
    source_cluster_id: str
    mirrors: list[tuple[str, str, int]]
    replicas: int = 3
    tls_ca_pem: str = ""
    token: str = ""
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> LinkCreate:
        w = cls.T
        servers = frame.get("source_servers")
        if not isinstance(servers, list) or not 1 <= len(servers) <= MAX_SERVERS or any(
                not isinstance(s, str) or not 1 <= len(s) <= 512 for s in servers):
            raise WireError(f'{w} field "source_servers" must be a list of 1..{MAX_SERVERS} '
                            f'HOST:PORT strings')
        raw = frame.get("mirrors")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_LINK_TOPICS:
            raise WireError(f'{w} field "mirrors" must be a list of 1..{MAX_LINK_TOPICS} '
                            f'[source_topic, topic, partitions]')
        mirrors = []
        for i, m in enumerate(raw):
            if not isinstance(m, list) or len(m) != 3 or isinstance(m[2], bool) or \
                    not isinstance(m[2], int) or not 1 <= m[2] <= MAX_PARTITIONS:
                raise WireError(f'{w} field "mirrors[{i}]" must be [source_topic, topic, '
                                f'partitions 1..{MAX_PARTITIONS}]')
            mirrors.append((topic_name(m[0], w, f"mirrors[{i}][0]"),
                            topic_name(m[1], w, f"mirrors[{i}][1]"), m[2]))
        texts = {k: get_str(frame, k, default="", where=w) for k in ("tls_ca_pem", "token")}
        if any(len(v) > MAX_TEXT for v in texts.values()):
            raise WireError(f"{w}: tls_ca_pem and token are at most {MAX_TEXT} characters")
        cid = get_str(frame, "source_cluster_id", where=w)
        return cls(_link_name(frame, w), list(servers), cid, mirrors,
                   get_int(frame, "replicas", default=3, minimum=1, maximum=MAX_REPLICAS,
                           where=w), texts["tls_ca_pem"], texts["token"],
                   limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return _admin(self.T, rid, {
            "name": self.name, "source_servers": list(self.source_servers),
            "source_cluster_id": self.source_cluster_id,
            "mirrors": [list(m) for m in self.mirrors], "replicas": self.replicas,
            "tls_ca_pem": self.tls_ca_pem, "token": self.token}, self.timeout_ms)


@dataclass(slots=True)
class LinkAlter:
    """Pause, resume or delete link `name`."""

    T: ClassVar[str] = "link_alter"
    name: str
    op: str
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> LinkAlter:
        w = cls.T
        return cls(_link_name(frame, w), get_str(frame, "op", choices=LINK_OPS, where=w),
                   limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return _admin(self.T, rid, {"name": self.name, "op": self.op}, self.timeout_ms)


@dataclass(slots=True)
class TopicPromote:
    """Make mirror topic `name` writable (its link stops writing it, for good)."""

    T: ClassVar[str] = "topic_promote"
    name: str
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> TopicPromote:
        w = cls.T
        return cls(topic_name(frame.get("name"), w, "name"), limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return _admin(self.T, rid, {"name": self.name}, self.timeout_ms)


@dataclass(slots=True)
class LinkEventRequest:
    """A puller's report of a bootstrap: visible offsets gap_from..gap_to of (topic, partition)
    were gone from the source; recorded in the metadata (LinkEvent)."""

    T: ClassVar[str] = "link_event"
    link: str
    topic: str
    partition: int
    gap_from: int
    gap_to: int
    timeout_ms: int | None = None
    group: int = CONTROLLER_GROUP

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> LinkEventRequest:
        w = cls.T
        gap_from = get_int(frame, "gap_from", minimum=0, maximum=MAX_OFFSET, where=w)
        return cls(_link_name(frame, w, "link"), topic_name(frame.get("topic"), w),
                   get_int(frame, "partition", minimum=0, maximum=MAX_PARTITIONS - 1, where=w),
                   gap_from, get_int(frame, "gap_to", minimum=gap_from, maximum=MAX_OFFSET,
                                     where=w), limits.timeout_ms(frame, w))

    def to_frame(self, rid: int) -> dict[str, Any]:
        return _admin(self.T, rid, {"link": self.link, "topic": self.topic,
                                    "partition": self.partition, "gap_from": self.gap_from,
                                    "gap_to": self.gap_to}, self.timeout_ms)


@dataclass(slots=True)
class LinkList:
    """The links this node's metadata holds (no secrets)."""

    T: ClassVar[str] = "link_list"
    group: int = field(default=CONTROLLER_GROUP)

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> LinkList:
        return cls()

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {})


@dataclass(slots=True)
class LinkStatus:
    """The pullers this node runs (the mirror partitions it leads), with their lag."""

    T: ClassVar[str] = "link_status"
    group: int = field(default=CONTROLLER_GROUP)

    @classmethod
    def parse(cls, frame: dict[str, Any], limits: Limits) -> LinkStatus:
        return cls()

    def to_frame(self, rid: int) -> dict[str, Any]:
        return request_frame(self.T, rid, {})


LINK_REQUESTS = (LinkCreate, LinkAlter, TopicPromote, LinkEventRequest, LinkList, LinkStatus)
LINK_TYPES = tuple(c.T for c in LINK_REQUESTS)
