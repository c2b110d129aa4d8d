"""Error replies to clients: every error code comes with advice on what to do next."""

from __future__ import annotations

from typing import Any

from raft.protocol.replies import ErrorReply
from raft.core.types import ErrorCode

ERROR_ADVICE: dict[ErrorCode, str] = {
    ErrorCode.NOT_LEADER: "this node is not the leader; send the request to leader_addr (or "
                          "retry shortly if no leader is known yet: an election is running)",
    ErrorCode.BACKPRESSURE: "the leader's unflushed tail, in-flight window or queue of writes "
                            "waiting for replication is full; retry after a short backoff",
    ErrorCode.TOO_LARGE: "the batch exceeds the leader's limit; split it into smaller batches",
    ErrorCode.LEADERSHIP_LOST: "leadership changed before the write committed; it may or may "
                               "not be in the log: retry (idempotent producers make the retry "
                               "safe)",
    ErrorCode.TRUNCATED: "a new leader overwrote the write; it will never commit: retry it",
    ErrorCode.SHUTTING_DOWN: "this node is shutting down; retry on another node",
    ErrorCode.TIMEOUT: "no answer within timeout_ms; the write may still commit: retry with "
                       "the same producer_id/sequence (idempotent) or check with fetch",
    ErrorCode.BAD_REQUEST: "the request was refused as malformed",
    ErrorCode.INTERNAL: "internal error on the node; see its log",
    ErrorCode.DISK_FULL: "the leader's disk is full: it refuses writes until space is freed "
                         "(reads go on); free disk space on the leader (or set retention), then "
                         "retry",
    ErrorCode.INVALID_SUBSCRIPTION_NAME: "a subscription name is 1-128 characters of letters, "
                                         "digits and '.', '_', ':', '-'; pick another name",
    ErrorCode.UNKNOWN_SUBSCRIPTION: "no subscription of that name (never created, deleted or "
                                    "expired); open it to create it, or list them with "
                                    "`raftlog subscriptions`",
    ErrorCode.SUBSCRIPTION_LEASED: "another consumer holds this subscription's lease; stop it "
                                   "(it releases the lease on close) or wait until the lease "
                                   "expires (lease_until_ms)",
    ErrorCode.POSITION_PAST_HIGH_WATERMARK: "a position may be at most high_watermark + 1 (the "
                                            "next offset to deliver); commit the offset after "
                                            "the last record processed",
    ErrorCode.POSITION_BEHIND: "a commit may not move a subscription back; to re-read, reset it "
                               "(`raftlog subscriptions reset NAME --to OFFSET`)",
    ErrorCode.UNAUTHENTICATED: "authenticate: send a valid token (--token or RAFTLOG_TOKEN) or "
                               "a client certificate signed by the cluster CA, over TLS",
    ErrorCode.MIRROR_POSITION: "the mirror holds these visible offsets already; resume from "
                               "visible_end + 1",
    ErrorCode.MIRROR_READ_ONLY: "this topic is a mirror a link still feeds: it takes no client "
                                "writes; promote it first (`raftlog topic promote TOPIC`)",
    ErrorCode.FORBIDDEN: "the principal lacks the permission this request needs; ask an "
                         "operator to grant it in the node's auth file",
}


class NodeFailed(Exception):
    """The node can no longer trust its own state (a storage fault, or an unexpected exception
    while stepping the core, flushing or saving its metadata). Fail-stop: it stops at once,
    without flushing, and the process exits with code 3; a restart recovers from the flushed
    log, which the storage layer changes on disk first and in memory only after."""


def advised_error(code: ErrorCode, message: str | None = None, **extra: Any) -> ErrorReply:
    """An error reply; without a message, the code's advice (or its name) stands in."""
    return ErrorReply(code, message or ERROR_ADVICE.get(code, code.name), extra)
