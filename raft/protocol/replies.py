"""Replies: what a node answers a request with, as typed values and as frames.

`{"v":1,"t":"reply","id":id,"ok":true,...}` or `{"v":1,"t":"reply","id":id,"ok":false,
"error":{"code":NAME,"message":"...what to do...",...}}`; an `error` frame (not a reply) is sent
just before the node hangs up on a connection that broke the protocol. Handlers return a
`Reply`; the request id is the connection's business, added when the reply is framed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from raft.protocol.framing import PROTOCOL_VERSION
from raft.core.types import ErrorCode


def error_frame(code: ErrorCode, message: str, request_id: int | None = None) -> dict[str, Any]:
    """The frame sent just before closing a connection that misbehaved."""
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "t": "error", "code": code.name,
                           "message": message}
    if request_id is not None:
        out["id"] = request_id
    return out


def ok_reply(request_id: int, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "t": "reply", "id": request_id, "ok": True, **fields}


def error_map(code: ErrorCode, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    """A reply's `error` map: code name, message, and the details that are known."""
    err: dict[str, Any] = {"code": code.name, "message": message}
    err.update({k: v for k, v in extra.items() if v is not None})
    return err


def error_reply(request_id: int, code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "t": "reply", "id": request_id, "ok": False,
            "error": error_map(code, message, extra)}


@dataclass(slots=True)
class ErrorReply:
    """A refusal: the code, what to do next, and details (the leader's address for NOT_LEADER,
    the log bounds for OFFSET_OUT_OF_RANGE, ...; None values are left out)."""

    ok: ClassVar[bool] = False
    code: ErrorCode
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def error(self) -> dict[str, Any]:
        return error_map(self.code, self.message, self.details)

    def to_frame(self, rid: int) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "t": "reply", "id": rid, "ok": False,
                "error": error_map(self.code, self.message, self.details)}


@dataclass(slots=True)
class OkReply:
    """A success whose fields are a document of their own (a status map, a subscription)."""

    ok: ClassVar[bool] = True
    fields: dict[str, Any] = field(default_factory=dict)

    def to_frame(self, rid: int) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "t": "reply", "id": rid, "ok": True, **self.fields}


@dataclass(slots=True)
class ProduceOk:
    ok: ClassVar[bool] = True
    base_offset: int
    last_offset: int
    duplicate: bool = False

    def to_frame(self, rid: int) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "t": "reply", "id": rid, "ok": True,
                "base_offset": self.base_offset, "last_offset": self.last_offset,
                "duplicate": self.duplicate}


@dataclass(slots=True)
class FetchOk:
    """`batches`: maps {base_offset, count, timestamp_ms, payload}, built once by the reader
    (a fetch reply is encoded exactly once, so they are not wrapped again)."""

    ok: ClassVar[bool] = True
    batches: list[dict[str, Any]]
    high_watermark: int
    start_offset: int
    next_offset: int

    def to_frame(self, rid: int) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "t": "reply", "id": rid, "ok": True,
                "batches": self.batches, "high_watermark": self.high_watermark,
                "start_offset": self.start_offset, "next_offset": self.next_offset}


Reply = ErrorReply | OkReply | ProduceOk | FetchOk
