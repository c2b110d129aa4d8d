"""Client authentication and permissions: who a connection is, and what it may ask for.

Enabled by `--auth-file FILE` (which needs TLS: tokens must not travel in clear, and without
mutual TLS any process could pose as a peer and bypass all of this). The file names principals
and what each may do:

    [principals.reader]
    permissions = ["consume"]
    tokens = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]

    [principals.ops]                # no tokens: authenticates with a client certificate
    permissions = ["admin", "produce", "consume"]

A client authenticates in its hello, with a bearer token (`"token": "..."`) or, failing that,
with its TLS client certificate (`raftlog://client/<name>` names the principal). Tokens are
stored as SHA-256 digests only: they are 256-bit random strings (`raftlog token create`), so a
slow hash buys nothing, and the file never holds a usable secret. SIGHUP re-reads the file; a
connection's permissions are looked up on every request, so a permission change or a revoked
token applies at once, to open connections too.

Topic grants (issue 26): a principal may also list `topics = ["produce:orders.*",
"consume:logs", "admin:team-a.*"]` (raft.controller.access: a name, or a prefix ending in `*`).
Node-wide permissions still cover every topic, so a file without `topics` means what it always
did. A request that touches a topic (produce, fetch, loads, subscriptions: by the topic of the
partition it reaches; topic_create / topic_alter / topic_delete: by the topic they name) passes
with the node-wide permission or a grant of it matching that topic; cluster-wide requests
(add_node, remove_node, the controller's own group, types not classified) need the node-wide
permission. `metadata` shows a principal with grants (and no node-wide permission) only the
topics it may use.

Permissions: `produce` (produce and staged-load writes), `consume` (fetch; subscription open,
commit (one or many: sub_commit_many), reset, pin, release, get, list), `admin` (membership,
leadership transfer, load abort, subscription delete, and any request type not listed
below: new request types are refused until someone classifies them). `status` and
`load_status` are open to every authenticated principal. A refused request gets FORBIDDEN
naming the permission; the connection stays usable. No token or digest is ever logged or
reported.

A cluster's own nodes may also connect as clients with their node certificates (session
method "node"), for the node-internal requests in NODE_REQUESTS only (a puller's gap report,
raft/node/links/manager.py); every other request from such a session is FORBIDDEN, and so is
every request when the certificate names a node id that is not a member of this cluster (a
retired node's certificate, another cluster's node sharing the CA). A certificate carries a
node id, not a cluster: clusters that share one CA and reuse node ids cannot tell each
other's nodes apart, so give each cluster its own CA (`raftlog certs init` does).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from collections.abc import Callable, Collection
from typing import Any

from raft.controller.access import (TopicGrant, TopicPermission, may_use, parse_grants,
                                    usable_topics)
from raft.node.config import ConfigError
from raft.node.tls import Identity
from raft.core.types import ErrorCode


class Permission(str, Enum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


# Request type -> the permission it needs (None: any authenticated principal). Not listed:
# ADMIN (fail closed). tests/security/test_security_unit.py checks every registered type is here.
REQUIRED: dict[str, Permission | None] = {
    "status": None,
    "load_status": None,
    "produce": Permission.PRODUCE,
    "load_begin": Permission.PRODUCE,
    "load_stage": Permission.PRODUCE,
    "load_commit": Permission.PRODUCE,
    "fetch": Permission.CONSUME,
    "transfer_leader": Permission.ADMIN,
    "add_node": Permission.ADMIN,
    "remove_node": Permission.ADMIN,
    "load_abort": Permission.ADMIN,
    # Subscriptions (docs/SUBSCRIPTIONS.md): a consumer opens, commits, pins (Spark), releases
    # and reads its own, and resets it (issue 29: a consumer whose position retention passed
    # must be able to move on, `--auto-reset`, without an operator; a reset is no more than a
    # consumer could do by reading from elsewhere, and the table records what it skipped);
    # forgetting one is an operator's act.
    "sub_open": Permission.CONSUME,
    "sub_commit": Permission.CONSUME,
    "sub_commit_many": Permission.CONSUME,
    "sub_pin": Permission.CONSUME,
    "sub_release": Permission.CONSUME,
    "sub_get": Permission.CONSUME,
    "sub_list": Permission.CONSUME,
    "sub_reset": Permission.CONSUME,
    "sub_delete": Permission.ADMIN,
    # Topics (issue 26): reading the metadata is what every client does first (producers and
    # consumers alike); changing topics is an operator's act.
    "metadata": None,
    "topic_create": Permission.ADMIN,
    "topic_alter": Permission.ADMIN,
    "topic_delete": Permission.ADMIN,
    "topic_move": Permission.ADMIN,
    # Cross-cluster links (docs/REPLICATION.md): the sink's operator's acts, and what they
    # show (the sources a cluster reads from) is the operator's too.
    "link_create": Permission.ADMIN,
    "link_alter": Permission.ADMIN,
    "topic_promote": Permission.ADMIN,
    "link_event": Permission.ADMIN,
    "link_list": Permission.ADMIN,
    "link_status": Permission.ADMIN,
}

# Request types checked against the topic they touch (the partition's, or the topic they name):
# a topic grant of the permission they need is enough. Every other type needs the node-wide
# permission (membership is the cluster's, not a topic's).
TOPIC_SCOPED = frozenset({
    "produce", "load_begin", "load_stage", "load_commit", "load_abort", "fetch",
    "transfer_leader", "sub_open", "sub_commit", "sub_commit_many", "sub_pin", "sub_release",
    "sub_get", "sub_list", "sub_reset", "sub_delete", "topic_create", "topic_alter",
    "topic_delete", "topic_move",
})
# What a node's own client may send when it authenticates with its node certificate (mutual
# TLS with the cluster CA proves it is one of the cluster's nodes): the node-internal requests
# a node sends to another node of its own cluster, nothing else. A link's puller on a node
# that does not lead the controller records a bootstrap's gap this way (docs/REPLICATION.md):
# the node has no token of its own, and an unrecorded gap would stop the mirror for good.
NODE_REQUESTS = frozenset({"link_event"})
# Requests that name their topic rather than reach a partition of it.
NAMES_TOPIC = frozenset({"topic_create", "topic_alter", "topic_delete", "topic_move"})

TOKEN_PREFIX = "rl_"
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def required_permission(request_type: str) -> Permission | None:
    return REQUIRED.get(request_type, Permission.ADMIN)


def new_token() -> str:
    """A fresh bearer token: 256 random bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What the auth file stores for a token."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


class AuthFileError(ValueError):
    """The auth file cannot be used; the message names the file and the entry."""


class AuthError(Exception):
    """A client failed to authenticate (UNAUTHENTICATED); the message says what to send."""

    code = ErrorCode.UNAUTHENTICATED


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    permissions: frozenset[Permission]
    token_digests: tuple[str, ...] = ()
    grants: tuple[TopicGrant, ...] = ()  # topic-scoped permissions (raft.controller.access)

    def may(self, needed: Permission, topic: str) -> bool:
        return may_use(TopicPermission(needed.value), topic, self.permissions, self.grants)

    def visible_topics(self, topics: list[str]) -> list[str] | None:
        """The topics `metadata` shows this principal; None: every one (no grants, or a
        node-wide permission, which covers every topic)."""
        if not self.grants or self.permissions:
            return None
        seen: set[str] = set()
        for p in {g.permission for g in self.grants}:
            seen.update(usable_topics(p, topics, (), self.grants))
        return sorted(seen)


@dataclass(frozen=True, slots=True)
class AuthTable:
    principals: dict[str, Principal]
    by_digest: dict[str, str] = field(default_factory=dict)  # token digest -> principal

    @property
    def token_count(self) -> int:
        return len(self.by_digest)

    @classmethod
    def load(cls, path: str | Path) -> "AuthTable":
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise AuthFileError(f"auth file {path} does not exist; create it with `raftlog "
                                f"token create --auth-file {path} --principal NAME "
                                f"--permissions consume`") from None
        except OSError as e:
            raise AuthFileError(f"auth file {path} cannot be read: {e.strerror or e}") from None
        except tomllib.TOMLDecodeError as e:
            raise AuthFileError(f"auth file {path} is not valid TOML: {e}") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "auth file") -> "AuthTable":
        unknown = sorted(set(data) - {"principals"})
        if unknown:
            raise AuthFileError(f"{source}: unknown key(s) {', '.join(unknown)}; the file has "
                                f"one table per principal: [principals.NAME]")
        raw = data.get("principals", {})
        if not isinstance(raw, dict):
            raise AuthFileError(f"{source}: principals must be tables: [principals.NAME]")
        principals: dict[str, Principal] = {}
        by_digest: dict[str, str] = {}
        for name, entry in raw.items():
            where = f"{source}: [principals.{name}]"
            if not _NAME_RE.match(name):
                raise AuthFileError(f"{where}: a name is 1-63 letters, digits, '.', '_' or '-'")
            if not isinstance(entry, dict):
                raise AuthFileError(f"{where} must be a table")
            extra = sorted(set(entry) - {"permissions", "tokens", "topics"})
            if extra:
                raise AuthFileError(f"{where}: unknown key(s) {', '.join(extra)}; a principal "
                                    f"has permissions, topics and tokens")
            topics = entry.get("topics", [])
            if not isinstance(topics, list):
                raise AuthFileError(f'{where}: topics must be a list of grants, e.g. '
                                    f'["produce:orders.*", "consume:logs"]')
            try:
                grants = parse_grants(topics)
            except ValueError as e:
                raise AuthFileError(f"{where}: {e}") from None
            perms = entry.get("permissions", [])
            if not isinstance(perms, list):
                raise AuthFileError(f"{where}: permissions must be a list, e.g. "
                                    f'["produce", "consume"]')
            try:
                permissions = frozenset(Permission(p) for p in perms)
            except ValueError:
                raise AuthFileError(f"{where}: permissions {perms!r} must each be one of "
                                    f"{[p.value for p in Permission]}") from None
            tokens = entry.get("tokens", [])
            if not isinstance(tokens, list):
                raise AuthFileError(f"{where}: tokens must be a list of sha256 digests")
            for digest in tokens:
                if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
                    # Never echo the value: it may be a token pasted by mistake.
                    raise AuthFileError(f"{where}: every token must be stored as "
                                        f"'sha256:<64 hex digits>' (`raftlog token create` "
                                        f"writes it), never the token itself")
                if digest in by_digest:
                    raise AuthFileError(f"{where}: a token digest is also listed under "
                                        f"[principals.{by_digest[digest]}]; a token names one "
                                        f"principal")
                by_digest[digest] = name
            principals[name] = Principal(name, permissions, tuple(tokens), grants)
        return cls(principals, by_digest)

    def to_toml(self) -> str:
        """The file as `raftlog token create` writes it back (digests only)."""
        lines = ["# raftlog auth file: principals and their permissions (produce, consume,",
                 "# admin). Tokens are stored as SHA-256 digests; send SIGHUP to the nodes",
                 "# after editing. See docs/SECURITY.md.", ""]
        for name in sorted(self.principals):
            p = self.principals[name]
            perms = ", ".join(f'"{x.value}"' for x in sorted(p.permissions, key=lambda x: x.value))
            lines.append(f"[principals.{name}]")
            lines.append(f"permissions = [{perms}]")
            if p.grants:
                lines.append("topics = [" + ", ".join(f'"{g}"' for g in p.grants) + "]")
            lines.append("tokens = [" + ", ".join(f'"{d}"' for d in p.token_digests) + "]")
            lines.append("")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the session may not send: the error to answer with."""

    code: ErrorCode
    message: str
    permission: str | None = None  # the missing permission (FORBIDDEN)
    topic: str | None = None  # the topic it is missing on (topic grants)


@dataclass(slots=True)
class Session:
    """One client connection's authentication: its principal and how it proved it."""

    principal: str | None
    method: str  # "token", "certificate", "node" or "none" (authentication off)
    digest: str | None = None
    node_id: int | None = None  # a "node" session's: the id its certificate names


class Authenticator:
    """The node's current auth table (None when authentication is off) and the checks."""

    def __init__(self, auth_file: str | Path | None) -> None:
        self.path = Path(auth_file) if auth_file else None
        self.table: AuthTable | None = None
        # This cluster's node ids (set by the node: raft.node.server's _cluster_members); a
        # "node" session whose certificate names another id is refused. None:
        # not known (unit tests), every node certificate of the CA counts.
        self.members: Callable[[], Collection[int]] | None = None
        if self.path is not None:
            try:
                self.table = AuthTable.load(self.path)
            except AuthFileError as e:
                raise ConfigError(str(e)) from None

    @property
    def enabled(self) -> bool:
        return self.table is not None

    def reload(self) -> AuthTable | None:
        """Re-read the file (SIGHUP). On error the current table stays and AuthFileError
        is raised for the caller to log."""
        if self.path is None:
            return None
        table = AuthTable.load(self.path)
        self.table = table
        return table

    def authenticate(self, token: str | None, identity: Identity | None) -> Session:
        """The session for a client hello that carried `token` (its shape already checked by
        raft.protocol.hello); raises AuthError when authentication is on and the client proved
        nothing (or sent a token that is not valid)."""
        table = self.table
        if table is None:
            return Session(None, "none")
        if token is not None:
            digest = token_digest(token)
            name = table.by_digest.get(digest)
            if name is None:
                raise AuthError("the token is not valid (unknown, mistyped or revoked); ask "
                                "an operator for a current one (`raftlog token create`)")
            return Session(name, "token", digest)
        if identity is not None and identity.kind == "client":
            return Session(identity.principal, "certificate")
        if identity is not None and identity.kind == "node":  # a node's own client
            return Session(identity.principal, "node", node_id=identity.node_id)
        raise AuthError("this node requires authentication: send a token (--token or "
                        "RAFTLOG_TOKEN) or a client certificate (--tls-cert/--tls-key)")

    def authorize(self, session: Session, request_type: str) -> Refusal | None:
        """None when `session` may send `request_type`; else why not."""
        table = self.table
        if table is None:
            return None
        name = session.principal
        if session.method == "token" and table.by_digest.get(session.digest or "") != name:
            return Refusal(ErrorCode.UNAUTHENTICATED,
                           "the token this connection authenticated with has been revoked; "
                           "reconnect with a current token")
        if session.method == "node":
            members = self.members() if self.members is not None else None
            if members is not None and session.node_id not in members:
                return Refusal(ErrorCode.FORBIDDEN,
                               f"the certificate names node {session.node_id}, which is not a "
                               f"member of this cluster (its nodes: {sorted(members)}); a "
                               f"node certificate authenticates only this cluster's own "
                               f"nodes: give each cluster its own CA (`raftlog certs init`)",
                               None)
            if request_type in NODE_REQUESTS:
                return None
            return Refusal(ErrorCode.FORBIDDEN,
                           f"a node certificate authenticates only node-internal requests "
                           f"({', '.join(sorted(NODE_REQUESTS))}), not {request_type!r}; "
                           f"connect with a token (--token or RAFTLOG_TOKEN) or a client "
                           f"certificate (`raftlog certs issue`)", None)
        needed = required_permission(request_type)
        if needed is None:
            return None
        principal = table.principals.get(name or "")
        if principal is not None and needed in principal.permissions:
            return None
        if (principal is not None and request_type in TOPIC_SCOPED
                and any(g.permission.value == needed.value for g in principal.grants)):
            return None  # a topic grant may cover it: authorize_topic decides once routed
        return Refusal(ErrorCode.FORBIDDEN,
                       f"principal {name!r} lacks the {needed.value} permission needed for "
                       f"{request_type!r} requests; grant it in the node's auth file "
                       f"(permissions = [\"{needed.value}\", ...]) and send SIGHUP",
                       needed.value)

    def authorize_topic(self, session: Session, request_type: str,
                        topic: str | None) -> Refusal | None:
        """After routing: None when `session` may send `request_type` to `topic` (the topic
        of the partition it reaches, or the one it names; None: no topic's, e.g. the
        controller's own group); else FORBIDDEN naming the topic and the permission."""
        table = self.table
        needed = required_permission(request_type)
        if table is None or needed is None or session.method == "node":
            return None  # (a node's session: authorize() let node-internal requests only)
        principal = table.principals.get(session.principal or "")
        if principal is None or needed in principal.permissions:
            return None  # authorize() already refused what the principal may not do at all
        if topic is not None and request_type in TOPIC_SCOPED and principal.may(needed, topic):
            return None
        where = f"topic {topic!r}" if topic is not None else "this cluster-wide target"
        return Refusal(ErrorCode.FORBIDDEN,
                       f"principal {principal.name!r} lacks the {needed.value} permission on "
                       f"{where} needed for {request_type!r} requests; its topic grants are "
                       f"{[str(g) for g in principal.grants]}; grant it in the node's auth "
                       f"file (topics = [\"{needed.value}:{topic or '*'}\", ...]) and send "
                       f"SIGHUP", needed.value, topic)

    def visible_topics(self, session: Session, topics: list[str]) -> list[str] | None:
        """The topics `metadata` shows `session` (None: every one)."""
        table = self.table
        if table is None:
            return None
        principal = table.principals.get(session.principal or "")
        return None if principal is None else principal.visible_topics(topics)
