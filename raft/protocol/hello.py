"""The handshake: the first frame of every connection (`hello`) and the node's answer, as
typed values parsed once.

A connection's first frame says who is talking: a client (with a bearer token when the node
requires authentication) or a peer node (with its id). The node answers with its own id, its
frame limit (so a client can refuse an oversized request itself instead of having it cut off
mid-send) and, when authenticated, the principal. `hello` carries no request id: it is not a
request, and a bad one ends the connection (WireError).

Whether a token is *valid* is the node's authenticator's business; its shape (a non-empty
string of at most MAX_TOKEN_CHARS) is the protocol's, and a malformed one is refused as
UNAUTHENTICATED, as a wrong one is, without echoing it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from raft.protocol.fields import get_int, get_str
from raft.protocol.framing import PROTOCOL_VERSION, WireError
from raft.core.types import ErrorCode

HELLO = "hello"
MAX_TOKEN_CHARS = 512
CLIENT_HELLO_EXAMPLE = '{"v":1,"t":"hello","role":"client"}'


class Speaker(enum.StrEnum):
    """Who opened the connection (a str, so it doubles as a metrics label)."""

    CLIENT = "client"
    PEER = "peer"


_SPEAKERS = [s.value for s in Speaker]


@dataclass(slots=True, frozen=True)
class Hello:
    """The first frame a connection sends."""

    T: ClassVar[str] = HELLO
    role: Speaker = Speaker.CLIENT
    node_id: int | None = None  # a peer's own id
    # A client's bearer token: a secret, so never in a repr (a log line or an error).
    token: str | None = field(default=None, repr=False)
    # A peer's cluster id (raft/node/identity.py; None: it has none yet, or an older version)
    # and whether it is firm (a tentative one is only a founder's proposal).
    cluster_id: str | None = None
    cluster_firm: bool = False
    # A peer's boot id: random for each process start, so a peer that restarted faster than
    # the failure detector's timeout is still seen to have restarted (raft/node/liveness.py).
    # None: an older version.
    boot: int | None = None

    @classmethod
    def client(cls, token: str | None = None) -> Hello:
        return cls(Speaker.CLIENT, None, token or None)

    @classmethod
    def peer(cls, node_id: int, cluster_id: str | None = None,
             cluster_firm: bool = False, boot: int | None = None) -> Hello:
        return cls(Speaker.PEER, node_id, None, cluster_id, cluster_firm, boot)

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> Hello:
        if frame.get("t") != HELLO:
            raise WireError(f"the first frame must be {CLIENT_HELLO_EXAMPLE}, got type "
                            f"{frame.get('t')!r}")
        role = Speaker(get_str(frame, "role", choices=_SPEAKERS, where=HELLO))
        if role is Speaker.PEER:
            cid, firm = _cluster_fields(frame)
            return cls(role, get_int(frame, "node_id", where=HELLO), None, cid, firm,
                       _boot_field(frame))
        token = frame.get("token")
        if token is not None and (not isinstance(token, str) or not token
                                  or len(token) > MAX_TOKEN_CHARS):
            raise WireError(f'hello field "token" must be a non-empty string of at most '
                            f'{MAX_TOKEN_CHARS} characters', code=ErrorCode.UNAUTHENTICATED)
        return cls(role, None, token)

    def to_frame(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": HELLO, "role": self.role.value}
        if self.node_id is not None:
            out["node_id"] = self.node_id
        if self.token:
            out["token"] = self.token
        _put_cluster_fields(out, self.cluster_id, self.cluster_firm)
        if self.boot is not None:
            out["boot"] = self.boot
        return out


@dataclass(slots=True, frozen=True)
class HelloReply:
    """The node's answer to a hello. Parsed leniently where an older node may say less:
    no frame limit (None: unknown) and no principal."""

    T: ClassVar[str] = HELLO
    node_id: int
    max_frame_bytes: int | None = None
    principal: str | None = None
    cluster_id: str | None = None  # the answering node's (peer connections only)
    cluster_firm: bool = False
    boot: int | None = None  # the answering node's boot id (peer connections only)

    @classmethod
    def parse(cls, frame: dict[str, Any]) -> HelloReply:
        """The answer in `frame`; WireError when it is not a hello (an error frame included:
        callers that act on the error's code look at it first)."""
        if frame.get("t") != HELLO:
            raise WireError(f"the node did not answer the hello ({frame!r})")
        limit = frame.get("max_frame_bytes")
        principal = frame.get("principal")
        cid, firm = _cluster_fields(frame)
        return cls(get_int(frame, "node_id", default=0, where="hello reply"),
                   limit if type(limit) is int and limit > 0 else None,
                   principal if isinstance(principal, str) else None, cid, firm,
                   _boot_field(frame))

    def to_frame(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": HELLO, "node_id": self.node_id}
        if self.max_frame_bytes is not None:
            out["max_frame_bytes"] = self.max_frame_bytes
        if self.principal is not None:
            out["principal"] = self.principal
        _put_cluster_fields(out, self.cluster_id, self.cluster_firm)
        if self.boot is not None:
            out["boot"] = self.boot
        return out


MAX_CLUSTER_ID_CHARS = 64


def _cluster_fields(frame: dict[str, Any]) -> tuple[str | None, bool]:
    """Lenient: an older node sends neither field; anything malformed counts as no id."""
    cid = frame.get("cluster_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CLUSTER_ID_CHARS:
        return None, False
    return cid, frame.get("cluster_firm") is True


def _boot_field(frame: dict[str, Any]) -> int | None:
    """Lenient, like the cluster id: an older node sends none; a malformed one counts as none
    (it only makes a restart be noticed later, by silence)."""
    boot = frame.get("boot")
    return boot if type(boot) is int and boot > 0 else None


def _put_cluster_fields(out: dict[str, Any], cid: str | None, firm: bool) -> None:
    if cid:
        out["cluster_id"] = cid
        out["cluster_firm"] = firm
