"""The raftlog wire protocol, in one place, for the node, the client, sparkio and the bench.

- framing.py: frames (length + msgpack map), the version, WireError, the sans-IO FrameDecoder;
- streams.py / blocking.py: frames over a trio stream / a blocking socket;
- fields.py: field checks that name what a sender got wrong;
- requests.py, subscription_requests.py: the client requests as typed values (parse, to_frame),
  each addressed to a topic partition (or an explicit Raft group);
- topic_requests.py: `metadata` and the topic admin requests (`topic_create`, `topic_alter`,
  `topic_delete`), the controller's;
- link_requests.py: the cross-cluster link requests (issue 30);
- replies.py: replies as typed values and frames;
- errors.py: the retryable and the certainly-not-written error codes;
- raft_frames.py: the peers' Raft message frames.

Imports nothing from the node, the client, the CLI, the simulation, sparkio or the bench
(an import-linter contract in pyproject.toml), and nothing of trio outside streams.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from raft.protocol.errors import NOT_WRITTEN, RETRYABLE, may_retry
from raft.protocol.framing import (DEFAULT_MAX_FRAME_BYTES, LEN_SIZE, PROTOCOL_VERSION,
                                   ConnectionClosed, FrameDecoder, FrameTooLarge, WireError,
                                   decode_body, encode_frame, encode_frame_parts)
from raft.protocol.link_requests import (LINK_REQUESTS, LINK_TYPES, LinkAlter, LinkCreate,
                                         LinkEventRequest, LinkList, LinkStatus, TopicPromote)
from raft.protocol.load_requests import (LOAD_TYPES, LoadAbort, LoadBegin, LoadCommit,
                                         LoadRefused, LoadRequest, LoadStage, LoadStatus,
                                         parse_load)
from raft.protocol.replies import (ErrorReply, FetchOk, OkReply, ProduceOk, Reply,
                                   error_frame, error_reply, ok_reply)
from raft.protocol.requests import (CONTROLLER_GROUP, DEFAULT_TOPIC, SINGLE_GROUP, AddNode,
                                    Fetch, Limits, Produce, RemoveNode, Status, TransferLeader)
from raft.protocol.subscription_requests import (SUB_TYPES, CommitItem, SubCommitMany, SubList,
                                                 SubRequest)
from raft.protocol.topic_requests import (TOPIC_TYPES, Metadata, TopicAlter, TopicCreate,
                                          TopicDelete, TopicMove, TopicRequest)

Request = (Produce | Fetch | Status | TransferLeader | AddNode | RemoveNode | SubRequest
           | SubList | SubCommitMany | LoadRequest | TopicRequest)

# Request type -> its parser. The staged-load types (LOAD_TYPES) are parsed by parse_load: a bad
# field there is a refusal the load service answers, not a WireError (load_requests.py).
PARSERS: dict[str, Callable[[dict[str, Any], Limits], Any]] = {
    Produce.T: Produce.parse,
    Fetch.T: Fetch.parse,
    Status.T: Status.parse,
    TransferLeader.T: TransferLeader.parse,
    AddNode.T: AddNode.parse,
    RemoveNode.T: RemoveNode.parse,
    **{t: partial(SubRequest.parse_as, t) for t in SUB_TYPES},
    SubList.T: SubList.parse,
    SubCommitMany.T: SubCommitMany.parse,
    Metadata.T: Metadata.parse,
    TopicCreate.T: TopicCreate.parse,
    TopicAlter.T: TopicAlter.parse,
    TopicDelete.T: TopicDelete.parse,
    TopicMove.T: TopicMove.parse,
    **{c.T: c.parse for c in LINK_REQUESTS},
}


def parse_request(t: str, frame: dict[str, Any], limits: Limits) -> Any:
    """The typed request of a frame of a known type `t` (KeyError for other types)."""
    return PARSERS[t](frame, limits)


__all__ = [
    "DEFAULT_MAX_FRAME_BYTES", "LEN_SIZE", "NOT_WRITTEN", "PARSERS", "PROTOCOL_VERSION",
    "RETRYABLE", "SINGLE_GROUP", "CONTROLLER_GROUP", "DEFAULT_TOPIC", "TOPIC_TYPES", "Metadata",
    "TopicAlter", "TopicCreate", "TopicDelete", "TopicMove", "TopicRequest", "AddNode", "CommitItem", "ConnectionClosed", "ErrorReply",
    "Fetch", "FetchOk", "FrameDecoder", "FrameTooLarge", "LOAD_TYPES", "Limits", "LoadAbort",
    "LoadBegin", "LoadCommit", "LoadRefused", "LoadRequest", "LoadStage", "LoadStatus",
    "OkReply", "Produce", "ProduceOk", "RemoveNode", "Reply", "Request", "Status", "SubCommitMany",
    "SubList", "SubRequest", "TransferLeader", "WireError", "decode_body", "encode_frame",
    "encode_frame_parts", "error_frame", "error_reply", "may_retry", "ok_reply", "parse_load",
    "parse_request", "LINK_TYPES", "LinkAlter", "LinkCreate", "LinkEventRequest", "LinkList",
    "LinkStatus", "TopicPromote",
]
