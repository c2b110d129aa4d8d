"""Write tracing for `raftlog bench trace`: where a quorum write's time goes, hop by hop.

On only when the node starts with RAFTLOG_TRACE=<dir> in its environment (the trace bench sets
it for the clusters it starts). Off, each hook on the hot path is one module-attribute test
(`if trace.ENABLED:`) and nothing else. Why an environment variable and not a flag: it is a
measuring tool for the bench, not a setting an operator keeps.

What is recorded, all on CLOCK_MONOTONIC (`time.monotonic()`), which every process on one
machine shares, so the bench lines up the client's and all nodes' events without clock sync:
- per sampled request (a produce frame carrying `"trace": <id>`): the leader's `recv` (frame
  read), `propose` (core step and append done), `woken` (the handler resumed with its answer)
  and `sent` (the reply written), keyed by the client's trace id;
- per log position, for every write while tracing (the bench matches them to the sampled
  writes' offsets afterwards): a flush's start and end (on the loop, and inside the worker
  thread: the difference is the thread hand-off), frames written to and read from peers
  (appends by their last offset, replies by the flushed offset they report), appends done on
  a follower, and the commit index at every Ready the group processes.

The events stay in memory (bounded: MAX_EVENTS) and are written at exit to
<dir>/trace-<pid>.msgpack, after the bench's clean stop (SIGTERM).
"""

from __future__ import annotations

import atexit
import contextvars
import os
import time

import msgpack

from raft.core.messages import AppendEntries, AppendEntriesReply, HeartbeatReply

_DIR = os.environ.get("RAFTLOG_TRACE") or None
ENABLED: bool = _DIR is not None
MAX_EVENTS = 2_000_000

# (kind, group or trace id, offset or peer, time, extra)
_events: list[tuple[str, int, int, float, int]] = []
# The trace id of the request the current task answers (set per request task).
_request: contextvars.ContextVar[int | None] = contextvars.ContextVar("raftlog_trace",
                                                                     default=None)
now = time.monotonic


def event(kind: str, key: int, offset: int, t: float | None = None, extra: int = 0) -> None:
    """Record one event (only called under `if trace.ENABLED`)."""
    if len(_events) < MAX_EVENTS:
        _events.append((kind, key, offset, now() if t is None else t, extra))


def begin_request(trace_id: int, received: float) -> None:
    """The current task answers sampled request `trace_id`, read at `received`."""
    _request.set(trace_id)
    event("recv", trace_id, 0, received)


def request_hop(kind: str) -> None:
    """A hop of the request the current task answers, if it is sampled."""
    trace_id = _request.get()
    if trace_id is not None:
        event(kind, trace_id, 0)


def frame_written(msgs: list, peer: int) -> None:
    """A frame went to `peer`: appends by their last offset (`net_send`), replies by the
    flushed offset they report (`reply_send`)."""
    t = now()
    for group, msg in msgs:
        kind = type(msg)
        if kind is AppendEntries and msg.batches:
            event("net_send", group, msg.batches[-1].last_offset, t, peer)
        elif kind is AppendEntriesReply or kind is HeartbeatReply:
            event("reply_send", group, msg.flushed_offset, t, peer)


def frame_read(items: list, peer: int, stage: str) -> None:
    """A frame from `peer` was read (`stage` "read") or stepped into its groups ("stepped"):
    appends as `f_read`/`f_stepped`, replies as `reply_read`/`reply_stepped`."""
    t = now()
    for group, msg in items:
        kind = type(msg)
        if kind is AppendEntries and msg.batches:
            event("f_" + stage, group, msg.batches[-1].last_offset, t, peer)
        elif kind is AppendEntriesReply or kind is HeartbeatReply:
            event("reply_" + stage, group, msg.flushed_offset, t, peer)


def _dump() -> None:
    if not _events or _DIR is None:
        return
    path = os.path.join(_DIR, f"trace-{os.getpid()}.msgpack")
    with open(path, "wb") as f:
        f.write(msgpack.packb({"pid": os.getpid(), "events": _events}))


if ENABLED:
    atexit.register(_dump)
