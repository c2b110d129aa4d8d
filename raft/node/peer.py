"""One outgoing connection to one peer: bounded queues, batching, reconnect with backoff.

A link is a pipe between two nodes. It carries messages for all of the node's groups and
knows nothing of Raft: each message comes with its group id, its lane and its sender (one
group's stream to this peer, raft.node.outbox.PeerStream), which the link tells when the message
leaves or is dropped. The rules about one group's stream (which lane, superseded appends,
heartbeat sequence numbers) are the sender's, so they never reach across groups.

One link per node pair, whatever the number of groups: a frame carries the queued messages of
every group (each in its group's envelope, raft.protocol.raft_frames), so the heartbeats that
the node's groups produce in one tick (raft.node.registry ticks them all at once) leave in one
frame per peer, and frames per node pair do not grow with the number of groups.

Why a bounded queue that drops: Raft tolerates lost messages (heartbeats repeat, appends are
retried from the follower's reported position), while an unbounded queue to a dead or slow peer
grows memory without limit. So when the queue is full the newest message is dropped and counted.

Two lanes. Bulk messages (those carrying batches: replication and catch-up data) wait in one
queue and go out in frames of at most BULK_FRAME_BYTES / BULK_FRAME_BATCHES, so the peer decodes
and appends one frame in a bounded step. Control messages (small, and what keeps leadership
alive) wait in the control lane, which is written first whenever both have something: a
heartbeat waits for at most the one bulk frame being written, never behind a catch-up window.
Each lane keeps its order (a follower must see appends in order).

With TLS (raft.node.tls), each link is mutual TLS: we present this node's certificate, and the
peer's must come from the cluster CA and name the node id we dialled, else the link retries
with backoff and says why (the peer does the same check on its side).

Liveness pings. A link that has written nothing for `ping_s` writes a ping: a raft frame with
no messages (`{"t": "raft", "msgs": []}`), which every version decodes as an empty frame and
drops, so it needs no gate. The peer's failure detector (raft.node.liveness) counts it, like
any frame, as hearing from us: an idle node pair exchanges one small frame per direction per
ping interval, whatever the number of groups (their quiesced groups send nothing).

Why one connection per direction: each node dials each peer and only writes on that connection;
replies come back on the peer's own outgoing connection. No request/response pairing on a socket
means a slow peer never blocks our reads, and reconnect logic lives in one place.

A peer we hear from is one we can most likely reach. After a partition heals, the peer's link
to us may connect while ours to it still waits out its backoff (up to `backoff_max_s`, 2 s by
default), and every reply we owe it waits with it (ci17: a healed old leader's replies). So
whatever the node reads from the peer (its handshake, any frame on its link to us) calls
`heard_from_peer`, which cuts a backoff short and redials now; at most once per
HEARD_REDIAL_INTERVAL_S, so a peer that reaches us while we cannot reach it (an asymmetric
partition) costs a few dials a second on this link, not one per frame it sends.
"""

from __future__ import annotations

import enum
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Protocol

import trio

from raft.core.messages import Message
from raft.node import trace
from raft.node.config import parse_address
from raft.node.identity import NOT_MEMBER_MARK, ClusterIdentity
from raft.node.plain_socket import plain_socket, send_rest, write_now
from raft.node.tls import NodeTLS, PeerIdentityError, dial_tls, handshake_failure
from raft.protocol.framing import LEN_SIZE, ConnectionClosed, WireError, encode_frame
from raft.protocol.hello import Hello, HelloReply
from raft.protocol.raft_frames import (BatchEncodings, GroupMessage, encode_raft_frame_pieces,
                                       message_wire_size)
from raft.protocol.streams import FrameReader

log = logging.getLogger("raftlog.peer")

CONNECT_TIMEOUT_S = 5.0
HELLO_TIMEOUT_S = 5.0
# Frames at least this large go out as several writes (encode_raft_frame_pieces) instead
# of being joined by a copy; smaller ones are joined so a heartbeat stays one segment.
SPLIT_WRITE_BYTES = 64 * 1024
# Frames written straight into the socket between two yields of the send loop to the others.
DIRECT_WRITES_PER_CHECKPOINT = 8
# One bulk frame: at most this many bytes and batches (at least one message). The receiver
# decodes (CRC-checks) and appends a whole frame in one event-loop step.
BULK_FRAME_BYTES = 1 << 20
BULK_FRAME_BATCHES = 1024
# A liveness ping: a raft frame with no messages (see the module docstring).
PING_FRAME = encode_frame({"t": "raft", "msgs": []})
# Hearing from the peer cuts the backoff at most this often (the module docstring).
HEARD_REDIAL_INTERVAL_S = 0.25


class Lane(enum.Enum):
    """Which queue of a link a message waits in."""

    CONTROL = "control"  # small messages, written first
    BULK = "bulk"  # messages carrying batches, in bounded frames


# The members bound once: looking a member up on an Enum class costs ~0.5 us in Python 3.11,
# and the hot path does it for every message.
CONTROL, BULK = Lane.CONTROL, Lane.BULK


class Sender(Protocol):
    """Whoever queued a message on a link (raft.node.outbox.PeerStream)."""

    def leaving(self, msg: Message, lane: Lane) -> Message:
        """`msg` goes into the frame being written now: the message to write in its place
        (itself, or an adjusted copy)."""
        ...

    def dropped(self) -> None:
        """The link dropped every message it held for this sender (a lost connection)."""
        ...


class PeerLink:
    def __init__(self, self_id: int, peer_id: int, address: str, *, max_frame_bytes: int,
                 queue_messages: int, queue_bytes: int, backoff_min_s: float,
                 backoff_max_s: float, rng: random.Random,
                 encodings: BatchEncodings | None = None,
                 tls: Callable[[], NodeTLS | None] = lambda: None,
                 identity: ClusterIdentity | None = None,
                 ping_s: float | None = None, boot: int | None = None,
                 on_boot: Callable[[int, int | None], None] = lambda peer, boot: None,
                 on_refused: Callable[[int], None] = lambda peer: None) -> None:
        self.self_id = self_id
        # This process's boot id, sent in the hello, and who hears the peer's from its answer
        # (the node's failure detector: a new one means the peer restarted).
        self._boot = boot
        self._on_boot = on_boot
        # Told when the peer's address refuses a connection (no process listens there): the
        # failure detector need not wait out its timeout (raft/node/liveness.py `refused`).
        self._on_refused = on_refused
        # Write a ping after this long without writing anything (None: never).
        self._ping_s = ping_s
        # The node's cluster id, sent in the hello and compared with the peer's answer
        # (raft/node/identity.py).
        self._identity = identity or ClusterIdentity(self_id)
        # The node's current TLS material (None: plaintext), read at each dial: SIGHUP may
        # have replaced the certificates.
        self._tls = tls
        # Shared by all of a node's links: a batch sent to every follower is encoded once.
        self._encodings = encodings if encodings is not None else BatchEncodings()
        self.peer_id = peer_id
        self.address = address
        self._max_frame = max_frame_bytes
        # A frame carries several messages; keep each well under the limit.
        self._frame_budget = max(64 * 1024, max_frame_bytes // 2)
        # (group id, message, encoded size, sender), in order.
        self._bulk: deque[tuple[int, Message, int, Sender]] = deque()
        self._control: deque[tuple[int, Message, int, Sender]] = deque()  # first out
        self._queued_bytes = 0  # of the bulk lane (the control lane is bounded in messages)
        self._queue_messages = queue_messages
        self._queue_bytes = queue_bytes
        self._backoff_min = backoff_min_s
        self._backoff_max = backoff_max_s
        self._rng = rng
        self._has_data = trio.Event()
        self._address_changed = trio.Event()
        # Set while the link waits out a backoff: what cuts it short (heard_from_peer,
        # set_address).
        self._cut: trio.Event | None = None
        self._last_cut = float("-inf")
        self._session_scope: trio.CancelScope | None = None
        self.connected = False
        self.sent_messages = 0
        self.sent_frames = 0  # raft frames written (pings too): what coalescing keeps low
        self.sent_pings = 0  # of those, liveness pings (frames with no messages)
        self.dropped_messages = 0
        self.superseded_messages = 0  # queued messages a sender withdrew (see withdraw)
        self.connects = 0
        self.heard_redials = 0  # backoffs cut short because the peer reached us

    # -- called by the node -------------------------------------------------------------------
    def enqueue(self, group: int, msg: Message, lane: Lane, sender: Sender) -> bool:
        """Queue a message of `group` from `sender` on `lane`; False (and counted) when that
        lane is full.
        A full bulk lane never costs a heartbeat or a reply its place. Bounds are the link's,
        whoever the sender: bulk in messages and bytes (one message always fits an empty
        lane), control in messages."""
        size = message_wire_size(msg)
        if lane is BULK:
            queue = self._bulk
            full = (len(queue) >= self._queue_messages
                    or (queue and self._queued_bytes + size > self._queue_bytes))
        else:
            queue = self._control
            full = len(queue) >= self._queue_messages
        if full:
            self.dropped_messages += 1
            if self.dropped_messages in (1, 10, 100) or self.dropped_messages % 1000 == 0:
                log.warning("peer_queue_full node=%d peer=%d dropped=%d queued=%d "
                            "queued_bytes=%d", self.self_id, self.peer_id,
                            self.dropped_messages, len(self._bulk) + len(self._control),
                            self._queued_bytes)
            return False
        queue.append((group, msg, size, sender))
        if lane is BULK:
            self._queued_bytes += size
        self._has_data.set()
        return True

    def withdraw(self, sender: Sender) -> int:
        """Drop (counted as dropped and superseded) every bulk message `sender` has queued:
        it decided they are obsolete (raft.node.outbox: a restarted stream). Only that
        sender's: other groups' messages (other senders) on this link are not its to drop.
        Returns how many."""
        if not self._bulk:
            return 0
        kept = deque(item for item in self._bulk if item[3] is not sender)
        gone = len(self._bulk) - len(kept)
        if gone:
            self._bulk = kept
            self._queued_bytes = sum(item[2] for item in kept)
            self.dropped_messages += gone
            self.superseded_messages += gone
        return gone

    def set_address(self, address: str) -> None:
        """Point the link at a new address (tests bind port 0; membership changes later)."""
        if address != self.address:
            self.address = address
            self._address_changed.set()
            if self._cut is not None:
                self._cut.set()
            if self._session_scope is not None:
                self._session_scope.cancel()

    @property
    def backing_off(self) -> bool:
        """Whether the link waits out a backoff before its next dial."""
        return self._cut is not None

    def heard_from_peer(self) -> None:
        """The peer reached us (its handshake, or a frame on its own link to us): if this link
        waits out a backoff, redial now, unless a cut happened less than
        HEARD_REDIAL_INTERVAL_S ago (the module docstring). Called per frame: cheap when
        connected."""
        cut = self._cut
        if cut is None or cut.is_set():
            return
        now = trio.current_time()
        if now - self._last_cut < HEARD_REDIAL_INTERVAL_S:
            return
        self._last_cut = now
        self.heard_redials += 1
        cut.set()

    def status(self) -> dict:
        return {"address": self.address, "connected": self.connected,
                "queued": len(self._bulk) + len(self._control),
                "queued_bytes": self._queued_bytes, "sent": self.sent_messages,
                "frames": self.sent_frames, "pings": self.sent_pings,
                "dropped": self.dropped_messages, "superseded": self.superseded_messages,
                "connects": self.connects, "heard_redials": self.heard_redials}

    # -- the connection loop ----------------------------------------------------------------------
    async def run(self) -> None:
        failures = 0
        while True:
            address = self.address
            try:
                host, port = parse_address(address, what=f"peer {self.peer_id} address")
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    stream = await trio.open_tcp_stream(host, port)
            except (OSError, trio.TooSlowError, ValueError) as e:
                if refused(e):
                    self._on_refused(self.peer_id)
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.info("peer_connect_failed node=%d peer=%d address=%s failures=%d "
                             "error=%r", self.self_id, self.peer_id, address, failures, e)
                await self._backoff(failures)
                continue
            connects_before = self.connects
            try:
                async with stream:
                    with trio.CancelScope() as self._session_scope:
                        session_stream = await self._secure(stream, host, failures)
                        await self._session(session_stream)
                if self._address_changed.is_set():  # moved: redial at once
                    self._address_changed = trio.Event()
                    failures = 0
                    continue
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    trio.TooSlowError, WireError, ConnectionClosed,
                    PeerIdentityError) as e:
                log.info("peer_disconnected node=%d peer=%d address=%s error=%r", self.self_id,
                         self.peer_id, address, e)
            finally:
                self.connected = False
                self._session_scope = None
            # A session that got through the handshake resets the backoff: the next attempt
            # is quick; only repeated failures wait longer.
            failures = 1 if self.connects > connects_before else failures + 1
            await self._backoff(failures)

    async def _backoff(self, failures: int) -> None:
        """Exponential backoff with full jitter; cut short when the address changes or the
        peer is heard from (heard_from_peer)."""
        # Messages queued for a peer we cannot reach are stale by the time we get through;
        # Raft regenerates what still matters.
        self._drop_queue()
        cap = min(self._backoff_max, self._backoff_min * (2 ** min(failures, 20)))
        delay = self._rng.uniform(self._backoff_min, max(self._backoff_min, cap))
        if not self._address_changed.is_set():  # (moved during the dial: no wait)
            self._cut = trio.Event()
            try:
                with trio.move_on_after(delay):
                    await self._cut.wait()
            finally:
                self._cut = None
        if self._address_changed.is_set():
            self._address_changed = trio.Event()

    def _drop_queue(self) -> None:
        self.dropped_messages += len(self._bulk) + len(self._control)
        for sender in {item[3] for item in self._bulk} | {item[3] for item in self._control}:
            sender.dropped()
        self._bulk.clear()
        self._control.clear()
        self._queued_bytes = 0

    async def _secure(self, stream: trio.SocketStream, host: str,
                      failures: int) -> trio.abc.Stream:
        """With TLS, the handshake and the check that the certificate names our peer."""
        tls = self._tls()
        if tls is None:
            return stream
        try:
            with trio.fail_after(HELLO_TIMEOUT_S):
                secured = await dial_tls(stream, tls.peer, host)
            tls.check_peer(secured, self.peer_id)
        except (trio.BrokenResourceError, PeerIdentityError) as e:
            if failures in (0, 1, 10) or failures % 100 == 0:
                log.warning("peer_tls_failed node=%d peer=%d address=%s reason=%s",
                            self.self_id, self.peer_id, self.address, handshake_failure(e))
            raise
        return secured

    async def _session(self, stream: trio.abc.Stream) -> None:
        reader = FrameReader(stream, self._max_frame)
        identity = self._identity
        hello = Hello.peer(self.self_id, *identity.hello_fields(), boot=self._boot)
        await stream.send_all(encode_frame(hello.to_frame()))
        with trio.fail_after(HELLO_TIMEOUT_S):
            frame = await reader.receive()
        if frame is None:
            raise ConnectionClosed(f"peer {self.peer_id} closed before answering hello")
        if frame.get("t") == "error":
            message = str(frame.get("message"))
            # The peer said why (another cluster, or we are not a member): logged here too
            # and shown by status, since this side is the one whose operator must act.
            identity.refused(self.peer_id, message, by_us=False,
                             not_member=NOT_MEMBER_MARK in message)
            raise WireError(f"peer {self.peer_id} refused us: {message}")
        reply = HelloReply.parse(frame)
        answered = reply.node_id
        if answered != self.peer_id:
            # Misconfiguration (wrong address for this id): keep retrying, loudly.
            log.error("peer_identity_mismatch peer=%d address=%s answered=%r; check --peers",
                      self.peer_id, self.address, answered)
            raise WireError(f"{self.address} is not node {self.peer_id}")
        problem = identity.heard(self.peer_id, reply.cluster_id, reply.cluster_firm)
        if problem is not None:
            identity.refused(self.peer_id, problem, by_us=True)
            raise WireError(problem)
        identity.connected(self.peer_id)
        self._on_boot(self.peer_id, reply.boot)
        self.connected = True
        self.connects += 1
        log.info("peer_connected node=%d peer=%d address=%s", self.self_id, self.peer_id,
                 self.address)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, reader)
                await self._send_loop(stream)
        except BaseExceptionGroup as group:
            raise _first_leaf(group) from None

    async def _watch(self, reader: FrameReader) -> None:
        """Peers never answer on this connection except with an error before closing; notice
        the close promptly so we reconnect instead of writing into a dead socket."""
        while True:
            frame = await reader.receive()
            if frame is None:
                raise ConnectionClosed(f"peer {self.peer_id} closed the connection")
            if frame.get("t") == "error":
                log.warning("peer_error_frame peer=%d code=%s message=%r", self.peer_id,
                            frame.get("code"), frame.get("message"))

    def _next_frame(self) -> list[GroupMessage]:
        """The (group id, message) pairs of the next frame: the queued control messages (up
        to the frame budget) if there are any, else bulk messages up to the bulk frame bounds.
        Each message's sender is told it leaves (and may adjust it) as it goes in."""
        msgs: list[GroupMessage] = []
        used = 0
        if self._control:
            while self._control:
                group, msg, size, sender = self._control[0]
                if msgs and used + size > self._frame_budget:
                    break
                self._control.popleft()
                msgs.append((group, sender.leaving(msg, CONTROL)))
                used += size
            return msgs
        batches = 0
        budget = min(self._frame_budget, BULK_FRAME_BYTES)
        while self._bulk:
            group, msg, size, sender = self._bulk[0]
            n = len(msg.batches)  # type: ignore[attr-defined]  # bulk messages carry batches
            if msgs and (used + size > budget or batches + n > BULK_FRAME_BATCHES):
                break
            self._bulk.popleft()
            self._queued_bytes -= size
            msgs.append((group, sender.leaving(msg, BULK)))
            used += size
            batches += n
        return msgs

    async def _send_loop(self, stream: trio.abc.Stream) -> None:
        last_write = trio.current_time()
        sock = plain_socket(stream)  # None over TLS
        direct = 0
        while True:
            pinged = False
            while not self._control and not self._bulk:
                self._has_data = trio.Event()
                if self._ping_s is None:
                    await self._has_data.wait()
                    continue
                with trio.move_on_at(last_write + self._ping_s):
                    await self._has_data.wait()
                if not self._has_data.is_set():
                    await stream.send_all(PING_FRAME)
                    self.sent_frames += 1
                    self.sent_pings += 1
                    last_write = trio.current_time()
                    pinged = True
                    break
            if pinged:
                continue
            msgs = self._next_frame()
            pieces = encode_raft_frame_pieces(msgs, self._encodings)
            size = sum(len(p) for p in pieces) - LEN_SIZE
            if size > self._max_frame:
                log.error("peer_message_too_large peer=%d bytes=%d limit=%d; raise "
                          "--max-frame-bytes above the raft max_append_bytes", self.peer_id,
                          size, self._max_frame)
                self.dropped_messages += len(msgs)
                continue
            if trace.ENABLED:  # (stamped as the write starts: the peer may read it before
                trace.frame_written(msgs, self.peer_id)  # this task runs again)
            if size < SPLIT_WRITE_BYTES:
                data = b"".join(pieces)  # a heartbeat stays one segment
                if sock is None:
                    await stream.send_all(data)
                else:  # straight into the socket (raft.node.plain_socket); a yield now and then
                    await send_rest(stream, data, write_now(sock, data))
                    direct += 1
                    if direct % DIRECT_WRITES_PER_CHECKPOINT == 0:
                        await trio.lowlevel.checkpoint()
            else:
                # Large encoded batches go out as they are, without a copy into one buffer.
                for piece in pieces:
                    await stream.send_all(piece)
            self.sent_messages += len(msgs)
            self.sent_frames += 1
            last_write = trio.current_time()


def refused(e: BaseException) -> bool:
    """Whether a failed dial was refused by the peer's host (ECONNREFUSED: nothing listens on
    that port, the process is gone), as opposed to a timeout or an unreachable network, which
    say nothing about the process. trio reports a refused dial as an OSError caused by a group
    of the attempts' errors."""
    if isinstance(e, ConnectionRefusedError):
        return True
    cause = e.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return bool(cause.exceptions) and all(
            isinstance(x, ConnectionRefusedError) for x in cause.exceptions)
    return isinstance(cause, ConnectionRefusedError)


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    """The connection failed for one reason, possibly reported twice (reader and writer);
    surface a plain exception so the reconnect loop can classify it. Cancellation wins."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(group)
    for leaf in leaves:
        if not isinstance(leaf, Exception):
            return leaf
    return leaves[0] if leaves else group
