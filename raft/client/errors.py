"""The client's typed errors: every error answer from the cluster becomes a `RaftlogError`
subclass chosen by its code, carrying the server's code, message and details (the leader's
address for NOT_LEADER, the log bounds for OFFSET_OUT_OF_RANGE)."""

from __future__ import annotations

from typing import Any

# Which of these codes Client.call retries is the protocol's to say (raft.protocol.errors:
# RETRYABLE, NOT_WRITTEN, may_retry), so the client, sparkio and the bench agree.


class RaftlogError(Exception):
    """An error answer from the cluster (code = raft.core.types.ErrorCode name) or from the client
    itself (UNAVAILABLE when no node could be reached)."""

    code = "INTERNAL"

    def __init__(self, message: str, *, code: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details = details or {}


class NotLeaderError(RaftlogError):
    code = "NOT_LEADER"

    @property
    def leader_id(self) -> int | None:
        return self.details.get("leader_id")

    @property
    def leader_addr(self) -> str | None:
        return self.details.get("leader_addr")


class RequestTimeout(RaftlogError):
    code = "TIMEOUT"


class TooLargeError(RaftlogError):
    code = "TOO_LARGE"


class OffsetOutOfRangeError(RaftlogError):
    code = "OFFSET_OUT_OF_RANGE"

    @property
    def start_offset(self) -> int | None:
        return self.details.get("start_offset")

    @property
    def high_watermark(self) -> int | None:
        return self.details.get("high_watermark")


class SubscriptionPositionRemoved(OffsetOutOfRangeError):
    """A subscription's position is below the log start (retention removed what it had not
    read) and its reset policy is none: the message names the commands that move it on
    (`raftlog consume --subscription NAME --auto-reset earliest`, `raftlog subscriptions
    reset`). Raised by the client's Consumer, not by a node."""

    @property
    def position(self) -> int | None:
        return self.details.get("position")


class ShuttingDownError(RaftlogError):
    code = "SHUTTING_DOWN"


class LeadershipLostError(RaftlogError):
    code = "LEADERSHIP_LOST"


class BackpressureError(RaftlogError):
    code = "BACKPRESSURE"


class DiskFullError(RaftlogError):
    """The leader's disk is full: it refuses writes (reads go on) until space is freed."""

    code = "DISK_FULL"


class BadRequestError(RaftlogError):
    code = "BAD_REQUEST"


class SubscriptionError(RaftlogError):
    """Base class of the subscription errors; `subscription` is the subscription as the
    cluster has it, when the error concerns one that exists."""

    @property
    def subscription(self) -> dict[str, Any] | None:
        return self.details.get("subscription")


class InvalidSubscriptionName(SubscriptionError):
    """A name that is empty, longer than 128 characters, or has characters outside letters,
    digits and '.', '_', ':', '-'."""

    code = "INVALID_SUBSCRIPTION_NAME"


class UnknownSubscription(SubscriptionError):
    """No subscription of that name (never created, deleted, or expired)."""

    code = "UNKNOWN_SUBSCRIPTION"


class SubscriptionLeased(SubscriptionError):
    """Another consumer holds the subscription's single-active-consumer lease."""

    code = "SUBSCRIPTION_LEASED"

    @property
    def lease_holder(self) -> str | None:
        return self.details.get("lease_holder")

    @property
    def lease_until_ms(self) -> int | None:
        return self.details.get("lease_until_ms")


class PositionPastHighWatermark(SubscriptionError):
    """A position past high watermark + 1: nothing there can have been read."""

    code = "POSITION_PAST_HIGH_WATERMARK"

    @property
    def high_watermark(self) -> int | None:
        return self.details.get("high_watermark")


class PositionBehind(SubscriptionError):
    """A commit below the subscription's position; only a reset moves it back."""

    code = "POSITION_BEHIND"

    @property
    def position(self) -> int | None:
        return self.details.get("position")


class AuthenticationError(RaftlogError):
    """UNAUTHENTICATED: no valid token or client certificate (or plaintext to a TLS node).
    Not retried: fix the credentials."""

    code = "UNAUTHENTICATED"


class PermissionDeniedError(RaftlogError):
    """FORBIDDEN: authenticated, but the principal lacks the permission `permission` names.
    The connection stays usable for the requests it may send."""

    code = "FORBIDDEN"

    @property
    def permission(self) -> str | None:
        """The missing permission: produce, consume or admin."""
        return self.details.get("permission")


class UnknownTopicError(RaftlogError):
    """UNKNOWN_TOPIC: no topic of that name (the message and `topics` name those that exist),
    or no such partition of it (`partitions`: how many it has). Clients refresh their metadata
    once before raising it: a topic just created may not have reached the node asked."""

    code = "UNKNOWN_TOPIC"

    @property
    def topic(self) -> str | None:
        return self.details.get("topic")

    @property
    def topics(self) -> list[str] | None:
        return self.details.get("topics")

    @property
    def partitions(self) -> int | None:
        return self.details.get("partitions")


class TopicExistsError(RaftlogError):
    """TOPIC_EXISTS: topic_create of a name already taken; `topic` is the existing topic's
    map when known."""

    code = "TOPIC_EXISTS"

    @property
    def topic(self) -> dict[str, Any] | None:
        return self.details.get("topic")


class UndecodableBatchError(RaftlogError):
    """Raised by a Consumer (client side; no node sends it) at a committed batch whose payload
    is not valid records. The records before it were handed out; iterating again reads on
    after it (`last_offset + 1`). `details` holds first_offset, last_offset and reason."""

    code = "UNDECODABLE_BATCH"

    @property
    def first_offset(self) -> int:
        return int(self.details["first_offset"])

    @property
    def last_offset(self) -> int:
        return int(self.details["last_offset"])

    @property
    def reason(self) -> str:
        return str(self.details.get("reason", ""))


class UnavailableError(RaftlogError):
    """No node could be reached (or none answered) within the timeout."""

    code = "UNAVAILABLE"


_BY_CODE: dict[str, type[RaftlogError]] = {
    c.code: c for c in (NotLeaderError, RequestTimeout, TooLargeError, OffsetOutOfRangeError,
                        ShuttingDownError, LeadershipLostError, BackpressureError,
                        DiskFullError, BadRequestError, UnavailableError,
                        InvalidSubscriptionName, UnknownSubscription, SubscriptionLeased,
                        PositionPastHighWatermark, PositionBehind, AuthenticationError,
                        PermissionDeniedError, UnknownTopicError, TopicExistsError)}


def error_from_reply(err: dict[str, Any]) -> RaftlogError:
    code = str(err.get("code", "INTERNAL"))
    cls = _BY_CODE.get(code, RaftlogError)
    return cls(str(err.get("message", code)), code=code, details=err)


__all__ = [
    "AuthenticationError", "BackpressureError", "BadRequestError", "DiskFullError",
    "LeadershipLostError", "NotLeaderError", "PermissionDeniedError",
    "OffsetOutOfRangeError", "RaftlogError", "SubscriptionPositionRemoved", "RequestTimeout", "ShuttingDownError",
    "TooLargeError", "UnavailableError", "UndecodableBatchError", "error_from_reply",
    "InvalidSubscriptionName", "PositionBehind", "PositionPastHighWatermark",
    "SubscriptionError", "SubscriptionLeased", "UnknownSubscription", "TopicExistsError",
    "UnknownTopicError",
]
