"""Enums and small value types shared by the core, the runtime and the client."""

from __future__ import annotations

from enum import Enum, IntEnum


class Role(str, Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class Acks(str, Enum):
    """Per-request durability, after Redpanda's consistency levels."""

    QUORUM = "quorum"  # answered once a majority has the batch flushed (the commit index covers it)
    LEADER = "leader"  # answered once the leader appended it (not yet flushed anywhere)
    NONE = "none"  # answered on acceptance (fire and forget)


class ErrorCode(IntEnum):
    """Typed errors carried in client answers and on the wire."""

    OK = 0
    NOT_LEADER = 1  # carries the leader's id/address when known
    TIMEOUT = 2
    TOO_LARGE = 3
    OFFSET_OUT_OF_RANGE = 4
    SHUTTING_DOWN = 5
    LEADERSHIP_LOST = 6  # a quorum produce whose entry may or may not commit: retry (idempotent)
    TRUNCATED = 7  # the entry was overwritten by a new leader: it will never commit
    BACKPRESSURE = 8  # the leader's unflushed tail or in-flight window is full: retry later
    BAD_REQUEST = 9
    INTERNAL = 10
    # A staged-load write for a load that is already committed or aborted, or was restarted by a
    # newer run (raft/core/loads.py): the writer stops; nothing it sends could be published.
    LOAD_CLOSED = 11
    # The leader's disk is full: it refuses new writes, keeps serving reads and catch-up from
    # what it has, and takes writes again once a flush succeeds.
    DISK_FULL = 12
    # Subscriptions (raft/core/subscription_table.py): named consumer positions replicated with the log.
    INVALID_SUBSCRIPTION_NAME = 13  # empty, too long, or characters outside [A-Za-z0-9._:-]
    UNKNOWN_SUBSCRIPTION = 14  # no subscription of that name (never created, deleted, expired)
    SUBSCRIPTION_LEASED = 15  # another consumer holds the single-active-consumer lease
    POSITION_PAST_HIGH_WATERMARK = 16  # a position past high watermark + 1: never read
    POSITION_BEHIND = 17  # a commit below the current position (only a reset may move back)
    # Security (raft/node/auth.py). The wire carries names, not numbers; these leave room below
    # for codes other work adds.
    UNAUTHENTICATED = 20  # no valid token or client certificate (or plaintext to a TLS node)
    FORBIDDEN = 21  # authenticated, but the principal lacks the permission the message names
    # Topics (issue 26, raft/controller/): the message names what exists.
    UNKNOWN_TOPIC = 22  # no such topic (names the topics), or no such partition (names them)
    TOPIC_EXISTS = 23  # topic_create of a name that is taken
    # Mirror partitions (issue 30, raft/core/mirror.py, docs/REPLICATION.md).
    # A MIRRORED append at or below the mirror's visible end: mirrored already; the answer
    # carries `visible_end`, where the link resumes (visible_end + 1). Never a duplicate.
    MIRROR_POSITION = 24
    # A client write to a mirror that a link still feeds: run `raftlog topic promote T` first.
    MIRROR_READ_ONLY = 25


class InvariantViolation(AssertionError):
    """A safety invariant failed. Fail-stop: the runtime lets this crash the node rather than
    continue with a log it can no longer trust."""


class DataLost(Exception):
    """Committed entries are damaged on this node and no other voter has a good copy: they
    are lost. Fail-stop: the node stops loudly, naming the range (raft/core/repair.py), rather than
    serve a log with a hole in it."""
