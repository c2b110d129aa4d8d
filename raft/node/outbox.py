"""One group's outgoing messages: what only makes sense within one group's stream to a peer.

A peer link (raft.node.peer) is a pipe between two nodes: it moves whatever it is given, in two
lanes, for all of the node's groups, and knows nothing of Raft. The rules below reason about one
group's messages, so they live here, next to the group (raft.node.group owns one
`GroupOutbox(links, group_id)`), in one `PeerStream` per (peer, group): each stream tags its
messages with its group id (the envelope the peer routes them by) and withdraws or adjusts only
its own messages, never another group's on the same link:

- The lane. AppendEntries (replication and catch-up data) go in the bulk lane, in order;
  everything else (heartbeats, replies, votes, TimeoutNow: small, and what keeps leadership
  alive) in the control lane, which the link writes first.
- Superseded appends. An append that starts before the end of this group's appends still queued
  for the peer is a new stream (the leader reset this follower's progress: a lost request, a
  rejection, a new term); the queued ones are obsolete and would only be decoded and skipped by
  the follower, so they are withdrawn from the link (counted as dropped, as a lost connection
  would). Without this, a follower slow to ack (a slow flush) made the leader resend its window
  again and again, the bulk lane grew to tens of MiB and heartbeats waited behind all of it.
- Heartbeat sequence numbers. A heartbeat that overtakes this group's queued appends leaves with
  a `seq` just below the first of them. The leader echoes that seq back to decide whether a
  follower that answered the heartbeat without holding an append has lost it
  (Inflight.lost_before): it may only compare against appends written before the heartbeat on
  this ordered connection. A lower seq makes the reply count for less (never for more), so this
  can only delay that decision. The link asks (`leaving`) as each message goes into a frame.
- One heartbeat (and one heartbeat reply) queued per stream. A heartbeat or reply sent while
  the stream's previous one is still queued does not queue again: the queued one leaves as the
  newest (`leaving` swaps it in). A heartbeat says "the leader of this term, commit index so
  far"; an older one still waiting says nothing the newer does not. Without this, a link whose
  writer lags (an overloaded loop) queued one heartbeat per group per interval: with 1,000
  awake groups the control lane filled (4,096) in a few hundred milliseconds and dropped votes
  with the stale heartbeats (measured: docs/PERFORMANCE.md). Now the control lane holds at most
  two such messages per group, and what leaves is never older than what was sent.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import Protocol

from raft.core.messages import AppendEntries, Heartbeat, HeartbeatReply, Message
from raft.node.peer import BULK, CONTROL, Lane, PeerLink

log = logging.getLogger("raftlog.node")


class Links(Protocol):
    """The node's peer links (raft.node.transport.PeerTransport), shared by all of its groups."""

    def link(self, node_id: int) -> PeerLink | None:
        """The open link to `node_id`, or None when the node has none."""
        ...


class PeerStream:
    """One group's messages to one peer, on that peer's link."""

    __slots__ = ("link", "group_id", "_queued", "_beats")

    def __init__(self, link: PeerLink, group_id: int) -> None:
        self.link = link
        self.group_id = group_id
        # This group's appends queued on the link, oldest first (each leaves in this order,
        # or all are dropped together).
        self._queued: deque[AppendEntries] = deque()
        # The newest heartbeat / heartbeat reply sent while one of that type is queued (by
        # type; absent: none queued). The queued one leaves as this.
        self._beats: dict[type, Message] = {}

    def send(self, msg: Message) -> bool:
        """Queue `msg` on its lane; False when the link's lane was full (the message is lost,
        as on a lost connection: Raft retries)."""
        if type(msg) is AppendEntries:
            self._withdraw_superseded(msg)
            if not self.link.enqueue(self.group_id, msg, BULK, self):
                return False
            self._queued.append(msg)
            return True
        kind = type(msg)
        if kind is Heartbeat or kind is HeartbeatReply:
            if kind in self._beats:  # one already queued: it will leave as this one
                self._beats[kind] = msg
                return True
            if not self.link.enqueue(self.group_id, msg, CONTROL, self):
                return False
            self._beats[kind] = msg
            return True
        return self.link.enqueue(self.group_id, msg, CONTROL, self)

    def _withdraw_superseded(self, msg: AppendEntries) -> None:
        """See the module docstring: a restarted stream makes the queued appends obsolete."""
        if not self._queued:
            return
        last = self._queued[-1]
        end = last.batches[-1].last_offset if last.batches else last.prev_offset
        if msg.prev_offset < end or msg.term != last.term:
            self.link.withdraw(self)
            self._queued.clear()

    # -- called by the link ----------------------------------------------------------------------
    def leaving(self, msg: Message, lane: Lane) -> Message:
        """`msg` goes into the frame being written now; what to write (see the module docstring
        for the heartbeat rule)."""
        if lane is BULK:
            self._queued.popleft()
            return msg
        kind = type(msg)
        if kind is Heartbeat or kind is HeartbeatReply:
            msg = self._beats.pop(kind, msg)
        if self._queued and kind is Heartbeat:
            first = self._queued[0].seq
            if msg.seq >= first:
                return dataclasses.replace(msg, seq=first - 1)
        return msg

    def dropped(self) -> None:
        """The link dropped everything queued (it lost its connection)."""
        self._queued.clear()
        self._beats.clear()


class GroupOutbox:
    """Where one group's Ready messages go: each to its stream to the destination."""

    def __init__(self, links: Links, group_id: int) -> None:
        self._links = links
        self.group_id = group_id
        self._streams: dict[int, PeerStream] = {}

    def send(self, msg: Message) -> None:
        """Queue one core message for its destination (dropped, as on a lost connection, when
        the node has no link to it: Raft retries)."""
        link = self._links.link(msg.dst)
        stream = self._streams.get(msg.dst)
        if stream is None or stream.link is not link:
            if link is None:  # not (or no longer) a peer: forget our stream to it
                self._streams.pop(msg.dst, None)
                log.debug("message_to_unknown_peer node=%d group=%d dst=%d", msg.src,
                          self.group_id, msg.dst)
                return
            # A new link starts empty.
            stream = self._streams[msg.dst] = PeerStream(link, self.group_id)
        stream.send(msg)
