"""Node-pair liveness: one failure detector per node, watching each peer node, whatever the
number of Raft groups they share.

Why: a quiesced group (raft/core/quiesce.py) sends no heartbeats, so nothing per group would
notice its leader's node dying. One detector per node pair stands in for all of them, and its
verdicts enter every group's core as inputs (`peer_down` / `peer_up`), never as a clock, as
the simulation models it (raft/sim/liveness.py):

- Anything heard from a peer node counts: every peer frame it sends us, for any group, with
  any messages, or none (GroupRegistry.deliver_frame calls `heard`), and again once we have
  finished stepping it (raft.node.server): a frame of a thousand groups' messages is stepped
  in slices behind our run queue, and at load 26-29 that took over 2 s, so the peer's next
  frame waited unread and the hard cap below reported a live peer down (measured:
  docs/PERFORMANCE.md).
- A link that has written nothing for `ping_s` writes a ping (raft.node.peer.PeerLink: a raft
  frame with no messages, which any node decodes as an empty frame), so an idle pair still
  hears from each other every `ping_s` without a message per group.
- A peer heard from nothing for `down_s` is reported down (`on_change(peer, False)`); the first
  frame heard from it again reports it up (`on_change(peer, True)`). A node starts with every
  peer presumed up and heard from now, as a restarted process does: its peers see it down
  while it was gone, then up when its first frame arrives.
- A stall of our own event loop (GC, a long step, a run queue longer than the CPU we get) is
  not the peers' silence: what they sent may wait unread in our sockets behind our backlog.
  The check's own lateness measures that backlog (the reader tasks wait in the same queue), so
  a peer is reported down only after `down_s` plus the largest lateness of the last few
  checks; and when one check runs later than half the timeout, every peer counts as heard
  from now. Without this an overloaded node reports healthy peers down, every group they
  share wakes, and the extra work overloads it further (the storm TiKV #19070 describes).
  Neither may postpone a verdict for ever (a node overloaded for good would then never see a
  dead peer go down): a peer with no frame for MAX_SLACK_FACTOR x `down_s` is down, whatever
  our lateness.
- A stall on the PEER's side (its loop lagging behind its run queue, its link's queue behind a
  burst) is a silence our lateness cannot see. Each peer's recent silences that ended with a
  frame (it was alive all along), longer than two ping intervals, are remembered for GAP_MEMORY_S, and the longest of them,
  less the ping interval, is added to that peer's timeout: a peer that went quiet for 0.9 s
  and came back a few seconds ago is not reported down after 0.5 s of the same. On a quiet
  machine the gaps are the ping interval and the timeout is what it was; under load it grows
  with what the peer has shown, up to the MAX_SLACK_FACTOR cap above. (Measured: at load 13-16
  on this 2-core machine, peers' silences of 0.56-1.1 s against 0.5 s gave a false down every
  few seconds per pair, and each woke every group the pair shares: docs/PERFORMANCE.md.)
  Safety never rests on the detector: it only decides when quiet groups wake and campaign.
- A peer that restarted faster than the timeout never looked silent, yet everything its
  groups were doing is gone (leaderships, what was not flushed; after a disk loss its data).
  Every process has a random boot id (`boot_id`), sent in the hello of each peer connection
  it opens and in the answer to each one it accepts (raft.protocol.hello); a peer whose boot
  id changes is reported down and at once up again (`peer_booted`), so its groups' quiet
  followers wake, ping their leader and elect another if it does not answer, and quiet
  leaders check on it, at once rather than at the core's own fallback (a node that may not
  campaign pings its members each election timeout: raft/core/quiesce.py). The simulation
  models the same (raft/sim/liveness.py, `restart_is_down`). A reconnect to the same process
  (a network blip) carries the same boot id and reports nothing.

The peers watched are the node's links (`peers()`: the union of its groups' members), read at
each check, so links opened and closed by membership changes need no bookkeeping here. A peer
no longer watched keeps its last verdict until it is watched again and heard from.
"""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import Callable, Collection
from typing import Any

import trio

log = logging.getLogger("raftlog.node")

# How often the detector looks for silent peers, as a fraction of the down timeout.
CHECKS_PER_TIMEOUT = 5
# The lateness of this many recent checks (the largest) is added to the timeout.
LATENESS_WINDOW = 3 * CHECKS_PER_TIMEOUT
# However late we are, a peer silent this many timeouts (by its last frame) is down.
MAX_SLACK_FACTOR = 4
# A peer's silences (gaps between its frames that ended with a frame) count this long.
GAP_MEMORY_S = 30.0
GAP_HISTORY = 32


def derived_timeouts(tick_ms: int, election_ticks: int, down_ms: int | None) -> tuple[float,
                                                                                        float]:
    """(ping interval, down timeout) in seconds. The down timeout defaults to one election
    timeout (election_ticks x tick_ms): a peer silent that long would have made a follower
    campaign anyway. A link pings after a fifth of it with nothing written, so a down verdict
    needs about five pings in a row lost."""
    down = (down_ms if down_ms is not None else election_ticks * tick_ms) / 1000
    return down / CHECKS_PER_TIMEOUT, down


class NodeLiveness:
    """The detector; see the module docstring."""

    def __init__(self, node_id: int, *, ping_s: float, down_s: float,
                 peers: Callable[[], Collection[int]] = lambda: ()) -> None:
        if ping_s <= 0 or down_s <= ping_s:
            raise ValueError(f"liveness: the ping interval ({ping_s} s) must be above 0 and "
                             f"below the down timeout ({down_s} s)")
        self.node_id = node_id
        self.ping_s = ping_s
        self.down_s = down_s
        self.peers = peers
        # Who hears the verdicts (the group registry: every group's core).
        self.on_change: Callable[[int, bool], None] = lambda peer, up: None
        self._last_heard: dict[int, float] = {}  # moved forward by our own stalls
        self._last_frame: dict[int, float] = {}  # when a frame really came
        self._up_since: dict[int, float] = {}  # when it was last reported (or presumed) up
        # Per peer: (when, seconds) of its recent silences longer than two ping intervals.
        self._gaps: dict[int, collections.deque[tuple[float, float]]] = {}
        self.down: set[int] = set()
        self.reported_down = 0
        self.reported_up = 0
        self.refusals = 0  # downs reported on a refused connection, not on silence
        self._framed: set[int] = set()  # peers a frame came from since we started
        self.stalls = 0
        self._lateness: collections.deque[float] = collections.deque(maxlen=LATENESS_WINDOW)
        # This process's boot id (module docstring), and the last one each peer sent.
        self.boot_id = random.SystemRandom().getrandbits(62) + 1
        self._boots: dict[int, int] = {}
        self.restarts_seen = 0

    def peer_booted(self, peer: int, boot: int | None) -> None:
        """A peer connection's handshake said `peer` runs as process `boot` (None: a version
        that does not say). Another boot id than the last one: it restarted, seen or not."""
        if boot is None or peer == self.node_id:
            return
        known = self._boots.get(peer)
        self._boots[peer] = boot
        if known is None or known == boot:
            return
        self.restarts_seen += 1
        now = trio.current_time()
        # Its old process's silences (and this restart's) say nothing about the new one.
        self._gaps.pop(peer, None)
        self._last_frame[peer] = now
        if peer not in self.down:
            self.down.add(peer)
            self.reported_down += 1
            log.warning("peer_down node=%d peer=%d: it restarted (a new boot id in its "
                        "handshake) before it looked silent; its groups here check on it",
                        self.node_id, peer)
            self.on_change(peer, False)
        self.heard(peer)  # and up: it is talking to us

    def heard(self, peer: int) -> None:
        """A frame from `peer` arrived (any group, any messages, or a ping)."""
        now = trio.current_time()
        frame = self._last_frame.get(peer)
        if frame is not None and 2 * self.ping_s < now - frame <= MAX_SLACK_FACTOR * self.down_s:
            # It was silent and came back: lag on its side (or the link's), not an outage.
            gaps = self._gaps.get(peer)
            if gaps is None:
                gaps = self._gaps[peer] = collections.deque(maxlen=GAP_HISTORY)
            gaps.append((now, now - frame))
        self._last_heard[peer] = now
        self._last_frame[peer] = now
        self._framed.add(peer)
        if peer in self.down:
            self.down.discard(peer)
            self._up_since[peer] = now
            self.reported_up += 1
            log.warning("peer_up node=%d peer=%d: heard from it again", self.node_id, peer)
            self.on_change(peer, True)

    def refused(self, peer: int) -> None:
        """Dialing `peer` was refused: nothing listens at its address, its process is gone
        (killed, crashed, stopping), which silence would only show after the timeout. Down
        now; its first frame reports it up again, as after any down. (Only a refusal counts:
        a dial that times out, or a network that is unreachable, may be a partition, and the
        timeout judges those.) The groups it led elect at once: their followers campaign
        within half an election timeout (raft/core/quiesce.py `_campaign_soon`), which is
        what bounds the failover after a crash (docs/PERFORMANCE.md)."""
        if (peer == self.node_id or peer in self.down or peer not in self.peers()
                or peer not in self._framed):
            return  # (never heard from: not started yet, which the timeout judges as before)
        self.down.add(peer)
        self.reported_down += 1
        self.refusals += 1
        log.warning("peer_down node=%d peer=%d: its address refused a connection (the process "
                    "is not running); its groups here elect new leaders", self.node_id, peer)
        self.on_change(peer, False)

    def is_up(self, peer: int) -> bool:
        return peer not in self.down

    def peer_slack(self, peer: int, now: float) -> float:
        """What `peer`'s own recent silences add to its timeout: the longest in the last
        GAP_MEMORY_S, less the ping interval (0 when it has shown none)."""
        gaps = self._gaps.get(peer)
        if not gaps:
            return 0.0
        while gaps and now - gaps[0][0] > GAP_MEMORY_S:
            gaps.popleft()
        return max((g for _, g in gaps), default=self.ping_s) - self.ping_s

    def up_for(self, peer: int, now: float) -> float:
        """Seconds since `peer` was last reported up (or presumed up, at our start or when
        first watched); -1 while it is down. The leader balancer gives leaderships only to
        nodes up for a while (raft.node.leader_balance)."""
        if peer in self.down:
            return -1.0
        return now - self._up_since.setdefault(peer, now)

    def status(self) -> dict[str, Any]:
        """Per watched peer: up or down, and seconds since we last heard from it."""
        now = trio.current_time()
        out: dict[str, Any] = {}
        for peer in sorted(self.peers()):
            heard = self._last_heard.get(peer)
            out[str(peer)] = {"up": peer not in self.down,
                              "silent_s": None if heard is None else round(now - heard, 3)}
        return out

    def check(self, now: float, slack: float = 0.0) -> None:
        """Report down every watched peer silent for longer than the timeout plus `slack` (our
        own recent lateness) plus the peer's own recent silences (peer_slack)."""
        for peer in self.peers():
            if peer == self.node_id:
                continue
            heard = self._last_heard.get(peer)
            if heard is None:  # newly watched: presumed up, as at a start
                self._last_heard[peer] = now
                self._last_frame[peer] = now
                self._up_since.setdefault(peer, now)
                continue
            frame = self._last_frame.get(peer, heard)
            limit = self.down_s + slack + self.peer_slack(peer, now)
            if peer not in self.down and (now - heard > limit
                                          or now - frame > MAX_SLACK_FACTOR * self.down_s):
                self.down.add(peer)
                self.reported_down += 1
                log.warning("peer_down node=%d peer=%d silent_s=%.3f: nothing heard from it "
                            "for longer than the liveness timeout (%.3f s); its groups here "
                            "elect new leaders", self.node_id, peer, now - heard, self.down_s)
                self.on_change(peer, False)

    async def run(self) -> None:
        """Check every ping interval until cancelled (the node's nursery)."""
        interval = self.ping_s
        now = trio.current_time()
        for peer in self.peers():
            self._last_heard.setdefault(peer, now)
            self._last_frame.setdefault(peer, now)
            self._up_since.setdefault(peer, now)
        due = now + interval
        while True:
            await trio.sleep_until(due)
            now = trio.current_time()
            late = now - due
            self._lateness.append(late)
            if late > self.down_s / 2:
                # Our own loop stalled: the peers' frames may sit unread in our sockets.
                self.stalls += 1
                for peer in list(self._last_heard):
                    self._last_heard[peer] = now
            self.check(now, max(self._lateness))
            due = max(due + interval, now)
