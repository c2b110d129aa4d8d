"""Error codes on the wire, and the two sets every client decides retries by.

The wire carries a code's name (`raft.core.types.ErrorCode`), never its number; clients also make a
few codes of their own (`CLIENT_CODES`) for failures no node answered. A retry decision needs two
facts about a code, kept here once for the Python client, sparkio and the bench alike:

RETRYABLE: the failure is transient; the same request, sent again (to the leader it names, or
after a backoff), may succeed without anyone changing anything.
  - NOT_LEADER: an election ran or the client picked a follower; the reply names the leader.
  - BACKPRESSURE: the leader's tail, in-flight window or queue of writes waiting for
    replication is full; it drains by itself.
  - SHUTTING_DOWN: this node is stopping; another node (or the next leader) serves it.
  - TIMEOUT, LEADERSHIP_LOST: the node gave up waiting, or lost leadership, before the entry
    committed; a later attempt meets a settled cluster.
  - TRUNCATED: a new leader overwrote the entry on this node (reserved: no node answers it
    today, but every client has always retried it).
  - UNAVAILABLE (the client's own): no node answered; one may be starting.
  Not retryable: codes that another attempt would meet again (BAD_REQUEST, TOO_LARGE, the
  subscription verdicts, UNAUTHENTICATED, FORBIDDEN), or that need an operator (DISK_FULL), or
  that say the request's purpose is gone (LOAD_CLOSED, OFFSET_OUT_OF_RANGE), and INTERNAL.

NOT_WRITTEN: the node refused the request before anything of it reached the log, so it can never
commit. Only these make it safe to resend a request that is not idempotent (a produce without a
producer id): any other failure may come after the batch was appended, and a resend could write
it twice.
  - NOT_LEADER and BACKPRESSURE are answered by the core's propose step before it appends; a
    leader that loses leadership while a write waits answers LEADERSHIP_LOST, never NOT_LEADER.
  - The refusals of a malformed or forbidden request (BAD_REQUEST, TOO_LARGE, UNAUTHENTICATED,
    FORBIDDEN), of a node with a full disk (DISK_FULL), of a closed load (LOAD_CLOSED), and of
    a topic or partition the node's metadata does not have (UNKNOWN_TOPIC: not retryable as
    such; a client refreshes its metadata and tries again if the topic appeared), and of a
    mirror's writes (MIRROR_POSITION: mirrored already; MIRROR_READ_ONLY: not promoted yet).
  Deliberately not in it: SHUTTING_DOWN (a node stopping while a write waits answers it after
  the append: "may or may not commit"), TIMEOUT and LEADERSHIP_LOST (the entry may commit
  later), and TRUNCATED: one node's copy being overwritten does not prove the entry cannot
  commit, since another node may hold it and win a later election (the Raft paper's figure 8
  shape).

So a request may be retried when its code is in RETRYABLE and, unless it is idempotent (reads,
subscription operations, idempotent produces, staged-load writes tagged with their sequence),
also in NOT_WRITTEN: for a plain produce that leaves NOT_LEADER and BACKPRESSURE.

A connection that fails (no answer arrives) follows the same two facts: it is transient (a
node restarting, a leader moving), and it is "certainly not written" when it failed before the
request's first byte was handed to it (the connection was refused, the hello failed, the node
had already hung up on it). After the write nobody can tell, as after TIMEOUT: only an
idempotent request may be resent (`may_retry_lost_connection`).
"""

from __future__ import annotations

from raft.core.types import ErrorCode

# Codes a client makes itself (they never arrive in a node's reply).
UNAVAILABLE = "UNAVAILABLE"  # no node could be reached, or none answered, in time
TLS_ERROR = "TLS_ERROR"  # the TLS handshake failed (an untrusted certificate, a TLS mismatch)
CLIENT_CODES = frozenset({UNAVAILABLE, TLS_ERROR})

RETRYABLE: frozenset[str] = frozenset({
    ErrorCode.NOT_LEADER.name, ErrorCode.BACKPRESSURE.name, ErrorCode.SHUTTING_DOWN.name,
    ErrorCode.TIMEOUT.name, ErrorCode.LEADERSHIP_LOST.name, ErrorCode.TRUNCATED.name,
    UNAVAILABLE,
})

NOT_WRITTEN: frozenset[str] = frozenset({
    ErrorCode.NOT_LEADER.name, ErrorCode.BACKPRESSURE.name, ErrorCode.BAD_REQUEST.name,
    ErrorCode.TOO_LARGE.name, ErrorCode.DISK_FULL.name, ErrorCode.LOAD_CLOSED.name,
    ErrorCode.UNAUTHENTICATED.name, ErrorCode.FORBIDDEN.name, ErrorCode.UNKNOWN_TOPIC.name,
    ErrorCode.MIRROR_POSITION.name, ErrorCode.MIRROR_READ_ONLY.name,
})


def may_retry(code: str, *, idempotent: bool) -> bool:
    """Whether a request that failed with `code` may be sent again (see the module docstring)."""
    return code in RETRYABLE and (idempotent or code in NOT_WRITTEN)


def may_retry_lost_connection(*, written: bool, idempotent: bool) -> bool:
    """Whether a request whose connection failed may be sent again: always when nothing of it
    was written, else only when it is idempotent (see the module docstring)."""
    return idempotent or not written


def code_name(code: ErrorCode | str) -> str:
    return code if isinstance(code, str) else code.name
