"""Quiescence: an idle group stops heartbeating and stops its timers; node liveness watches
for it.

With thousands of groups per node, a heartbeat and an election timer per group cost CPU and
peer traffic that grow with the number of groups while nothing happens (CockroachDB measured
about 10% of a core per 1,000 unquiesced replicas). So a group with nothing to do goes quiet, as
CockroachDB's ranges do after a few idle ticks (etcd-io/raft's TickQuiesced, TiKV's hibernated
regions), and a node-level failure detector (one per node pair, not per group) stands in for the
heartbeats it no longer sends.

When a leader quiesces (`_quiesce_blocker` names what stops it):
- the group has been idle for `quiesce_ticks` ticks in a row (0 = never), and
- nothing is moving: its log is flushed and committed to its end (no answer or membership change
  waiting, its no-op committed); no leadership transfer, no learner, no member being re-added,
  no damage in its log, no storage work running; and every follower whose node is not reported
  down has matched and flushed the leader's last offset, with nothing in flight, not probing,
  busy or under repair; and the voters not reported down are a majority.
It then sends `Heartbeat(quiesce=True)` (commit index = its last offset). A follower whose log
ends there, flushed and committed, with no storage work, held reply or damage, goes quiet and
answers `HeartbeatReply(quiesced=True)`; otherwise it answers as usual and the leader asks again
at the next heartbeat. Once every follower not reported down has answered quiesced, the leader
is quiesced too: `core.quiesced` is True and `tick()` does nothing (the runtime may skip it).
Until then it keeps ticking (check-quorum included, counting a follower that answered as
heard from) and re-asks the followers that did not answer; a follower that answered and then
says anything else (a restart's vote request, a woken follower's ping) is asked again, and
heartbeated meanwhile; an older follower that does not know the field never answers quiesced, so its leader
never goes quiet and it never misses a heartbeat it expects.

Wake-ups (the group goes back to ticking as today):
- leader: a proposal, a membership change or a transfer request; any message except a follower's
  quiesced answer, a reply older than the quiescing round (dropped), one of a lower term or a
  vote request from a node that is no voter of ours (both answered as always); a reply that
  shows a follower is no longer caught up; a follower's node reported up again after it was down
  (it may have lost what it had unflushed and must be checked); the live voters no longer being
  a majority (`peer_down`: then check-quorum steps it down as it always does, 2 election
  timeouts later, unless followers answer); `wake()`. A woken leader heartbeats at once and
  starts a fresh check-quorum window.
- follower: any message from its leader newer than the quiescing heartbeat (older ones are
  dropped: the round superseded them); any message from another node of this term or a newer
  one (a voter's vote request, a transfer's TimeoutNow) but a vote request from a non-voter (a
  removed node that still campaigns: the lease ignores it, as always); its leader's node
  reported down; `wake()`. A woken follower starts its normal, randomised election timer
  from zero. Woken by anything but its leader it also pings the leader (a HeartbeatReply with
  seq 0), which wakes the leader, whose heartbeats then keep the follower's timer from running
  out: a spurious wake-up costs one round trip, not an election. A follower whose leader's
  node is reported up again after being reported down (a detector flap) pings it too.
- either: a tick that finds storage recorded new damage since (the scrubber), any role change;
  a member announcing it restarted unseen (below).

A node that restarts faster than the failure detector's down bound never looks down, so no
peer_up wakes its group; and one that came back with less than it had (an empty data directory,
or flushed entries lost: a lost position) may not campaign, so it sends nothing either. Left
alone it stays empty or behind while its group is quiet, and if it led, its quiet followers wait
for it with no leader at all. So a quiet core wakes on a BootstrapProbe from a member when it is
not new itself (the prober lost its disk), and on a ping (HeartbeatReply, seq 0) from a member
of any term (`_announces_itself`; a lower term's ping changes nothing else, the term rules drop
it); and a node whose election timer runs out while it may not campaign and it knows no leader
pings every member (`_announce`). The woken leader's heartbeat makes the node answer with what
it holds (rejoining or behind), so it is re-added or caught up; woken followers ping their
leader, or, when the node was their leader, time out and elect another.
Proposals to a quiesced follower are answered NOT_LEADER as always and wake nothing.

Node liveness enters as inputs, never as a clock: `peer_down(node)` / `peer_up(node)`, called by
the runtime's node-pair failure detector. A quiesced follower whose leader's node is reported down
wakes and runs its election timer as usual: randomised per group and pre-vote first, so the
groups of a dead node do not all campaign in the same tick. A leader told a follower is down stays
quiet while the live voters are still a majority (nothing to do for it: it is caught up on the
others, and it is woken to catch the follower up when the follower comes back).

Interactions:
- CheckQuorum and the lease. A quiesced leader does not count check-quorum windows: the failure
  detector does that job while it is quiet, and a leader told it lost its majority wakes and
  behaves exactly as today (a fresh window, then it steps down unless a majority answers). A
  follower's lease (raft/core/election.py, `_in_lease`: vote requests are ignored while the
  leader was heard from within an election timeout) does not hold for a leader whose node is
  reported down, whatever the follower's frozen election counter says: otherwise a follower that
  was quiesced when its leader died could refuse the legitimate pre-votes of the others forever.
  While the leader's node is up, a woken follower restarts the counter at zero and stays in its
  lease (the detector vouches for the leader), which keeps a node that cannot hear the leader
  from deposing it.
- Leadership transfer blocks quiescence and a transfer request wakes the leader; TimeoutNow
  wakes the follower.
- Repair and scrub. Damage in the leader's log, or a follower under repair, blocks quiescence; a
  tick finding damage newly recorded wakes the core (its damage report then goes to the leader,
  which wakes on it). A runtime that skips ticking quiesced cores calls `wake()` when its
  scrubber records damage.
- Membership, re-adds, learners, retention: a change in progress or a learner blocks
  quiescence; retention only moves the log start, which needs no messages.
- A group that stops alone while its node keeps running (a fail-stop of one group) is invisible
  to node liveness: its restart campaigns or answers and so wakes the others; a runtime that
  keeps such a group down must report it down to the peers' cores itself.

Safety does not depend on quiescence. Election safety, log matching, leader completeness and
"nothing acknowledged is lost" are properties of what the core does when it grants votes,
accepts appends, counts flushed offsets and commits; none of those rules reads whether the group
is quiesced, and quiescence only ever removes actions (heartbeats, timer expiries, campaigns)
that every correct Raft tolerates losing (a lost heartbeat, a slow timer). Waking only adds the
ordinary actions back. The only rule quiescence touches is the lease, which exists for
liveness (it keeps a rejoining node from deposing a healthy leader) and never decides whether a
vote may be granted: the vote rules (one vote per term, log up to date, standing) are unchanged.
A stale quiesced leader (partitioned while quiet) may still believe it leads; it cannot commit
anything without a majority of flushed followers, exactly as a partitioned leader today, and the
detector bounds how long it believes so. So a quiescence bug can cost availability (a group that
does not wake), never data: the simulation checks both sides.

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raft.core import messages as m
from raft.core.progress import ProgressState
from raft.core.quorum import majority
from raft.core.types import Role

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from storage.api import LogStorage


class Quiescence:
    """State lives on RaftCore: `_quiesced`, `_quiesce_seq` (follower: the seq of the
    quiescing heartbeat it obeyed) and `_peers_down` (nodes the failure detector reports down);
    the leader's round is in `self.leader` (idle_ticks, quiesce_seq, quiesce_acked)."""

    cfg: "RaftConfig"
    log: "LogStorage"
    _quiesced: bool
    _quiesce_seq: int
    _peers_down: set[int]

    # -- inputs and what the runtime reads -----------------------------------------------------
    @property
    def quiesced(self) -> bool:
        """True while the group is quiet: tick() is a no-op that emits nothing (the runtime may
        skip ticking it); any input that matters wakes it."""
        return self._quiesced

    def peer_down(self, node_id: int) -> None:
        """The node-pair failure detector reports `node_id`'s node down (heard nothing from it
        for its timeout). A quiesced follower of that node wakes and times out as usual; a
        quiesced leader wakes only if the live voters are no longer a majority."""
        if node_id == self.node_id or node_id in self._peers_down:
            return
        self._peers_down.add(node_id)
        if self._quiesced:
            if self.role == Role.LEADER:
                if not self._live_quorum():
                    self._wake_leader()
            elif node_id == self.leader_id:
                self._wake_follower(ping=False)
        elif self.leader is not None and self.leader.quiesce_seq >= 0:
            self._maybe_quiesced()  # the round no longer waits for its answer
        elif self.role == Role.FOLLOWER and node_id == self.leader_id:
            self._campaign_soon(node_id)

    def _campaign_soon(self, leader: int) -> None:
        """An awake follower's leader is reported down. Its own timer would fire a whole
        election timeout after the leader's last heartbeat; a report that came sooner (the
        leader's process refused a connection: raft/node/liveness.py `refused`) would be
        wasted. Campaign within half a timeout instead, the voters in the order they follow
        the old leader (node ids, wrapping) taking turns: the first in ticks [1, e/2], the
        next in (e/2, e], ..., so two survivors do not split the vote, and the groups a dead
        node led are not all taken over by the same survivor, nor all in one tick. (A quiet
        group keeps the full randomised timeout after it wakes: a node's worth of idle groups
        campaigning at once is a storm, tests/raft/test_quiesce.py.) Timing only: the vote
        decides (a survivor whose log is behind loses it, and the next one campaigns)."""
        others = sorted(v for v in self.config.voters if v != leader)
        if self.node_id not in others:
            return
        ring = sorted(others, key=lambda v: (v - leader) % (max(others + [leader]) + 1))
        half = max(1, self.cfg.election_ticks // 2)
        delay = 1 + ring.index(self.node_id) * half + self.rng.randrange(half)
        self._election_elapsed = max(self._election_elapsed, self._randomized_timeout - delay)

    def peer_up(self, node_id: int) -> None:
        """The failure detector hears from `node_id`'s node again. A quiesced leader wakes to
        check it and catch it up (it may have restarted and lost its unflushed tail)."""
        if node_id not in self._peers_down:
            return
        self._peers_down.discard(node_id)
        if self.leader is not None:
            self.leader.quiesce_acked.discard(node_id)  # (a round under way asks it again)
            if self._quiesced and node_id in self.leader.progress:
                self._wake_leader()
        elif node_id == self.leader_id and self.role == Role.FOLLOWER:
            # Our leader was only thought dead (a detector flap): wake it, so it heartbeats
            # us before our timer, started when it was reported down, runs out.
            self._ping(node_id)

    def peers_down(self) -> frozenset[int]:
        return frozenset(self._peers_down)

    def wake(self) -> None:
        """Something outside the core changed that it must look at (the runtime's scrubber
        recorded damage): back to ticking. A no-op unless quiesced."""
        if not self._quiesced:
            return
        if self.role == Role.LEADER:
            self._wake_leader()
        else:
            self._wake_follower(ping=True)

    # -- leader ------------------------------------------------------------------------------------
    def _quiesce_blocker(self) -> str:
        """Why this leader may not quiesce now ("" when it may)."""
        lead = self.leader
        if lead is None:
            return "not the leader"
        if self.cfg.quiesce_ticks == 0:
            return "quiescence is off (quiesce_ticks = 0)"
        if self._pending:
            return "not a member in good standing"
        if self._storage_running is not None or self._storage_out is not None:
            return "storage work is running"
        if lead.waiting:
            return f"{len(lead.waiting)} answers wait for the commit index"
        if lead.transfer_target is not None:
            return f"leadership is moving to node {lead.transfer_target}"
        if self._configs[-1].offset > self.commit_index:
            return "a membership change is in progress"
        if self.config.learners:
            return f"learners {list(self.config.learners)} wait to be promoted"
        if self._rejoiners:
            return f"members {sorted(self._rejoiners)} are being re-added"
        log = self.log
        last = log.dirty_offset
        if self.commit_index != last:
            return f"offsets {self.commit_index + 1}..{last} are not committed"
        if log.flushed_offset != last:
            return "the leader's own log is not flushed"
        if self._damaged():
            return "the leader's log holds damage"
        if not self._live_quorum():
            return "the voters reported up are not a majority"
        for pr in lead.progress.values():
            if pr.node_id in self._peers_down:
                continue  # woken to catch it up when its node is back (peer_up)
            why = self._follower_not_quiet(pr, last)
            if why:
                return f"follower {pr.node_id} {why}"
        return ""

    @staticmethod
    def _follower_not_quiet(pr, last: int) -> str:  # noqa: ANN001 (FollowerProgress)
        if pr.match_index != last or pr.flushed_offset != last:
            return f"has matched {pr.match_index} and flushed {pr.flushed_offset} of {last}"
        if pr.inflight or pr.probe_sent or pr.state != ProgressState.REPLICATE:
            return "has requests in flight or is being probed"
        # (Not `recovering`: matched and flushed to the leader's last offset, above, is the
        # condition; the flag only says how the next request is planned.)
        if pr.busy or pr.repair_at >= 0:
            return "is busy or under repair"
        return ""

    def _live_quorum(self) -> bool:
        voters = self.config.voters
        live = sum(1 for v in voters if v not in self._peers_down)
        return live >= majority(len(voters))

    def _tick_quiesce(self) -> bool:
        """Leader tick: count idle ticks; True while a quiescing round is under way (the
        heartbeats of this tick ask the followers to go quiet)."""
        lead = self.leader
        assert lead is not None
        if self._quiesce_blocker():
            self._end_round()
            return False
        lead.idle_ticks += 1
        if lead.idle_ticks < self.cfg.quiesce_ticks:
            return False
        if lead.quiesce_seq < 0:
            lead.quiesce_seq = self._seq + 1
            lead.quiesce_acked.clear()
            lead.heartbeat_elapsed = self.cfg.heartbeat_ticks  # ask now
        return True

    def _end_round(self) -> None:
        lead = self.leader
        if lead is not None:
            lead.idle_ticks = 0
            lead.quiesce_seq = -1
            lead.quiesce_acked.clear()

    def _note_quiesce_answer(self, msg: m.HeartbeatReply) -> None:
        """Leader: a heartbeat reply; one saying quiesced, to this round, counts."""
        lead = self.leader
        if lead is None:
            return
        if (msg.quiesced and lead.quiesce_seq >= 0 and msg.seq >= lead.quiesce_seq
                and msg.term == self.term):
            lead.quiesce_acked.add(msg.src)
            self._maybe_quiesced()

    def _maybe_quiesced(self) -> None:
        """Leader: every follower not reported down answered this round quiesced: go quiet."""
        lead = self.leader
        if lead is None or lead.quiesce_seq < 0 or self._quiesced:
            return
        if any(p not in lead.quiesce_acked and p not in self._peers_down
               for p in lead.progress):
            return
        if self._quiesce_blocker():
            self._end_round()
            return
        self._go_quiet()

    def _go_quiet(self) -> None:
        self._quiesced = True
        if self.commit_index > self._saved_commit:
            self._hs_dirty = True  # checkpoint the commit index now: no tick will ask for it

    def _wake_leader(self) -> None:
        lead = self.leader
        self._quiesced = False
        self._end_round()
        if lead is None:
            return
        # A fresh check-quorum window (nobody was asked anything while quiet) and heartbeats
        # now, so a follower that woke first hears from its leader before its timer runs out.
        lead.check_quorum_elapsed = 0
        lead.heartbeat_elapsed = 0
        for pr in lead.progress.values():
            pr.recent_active = False
            self._seq += 1
            self._send(m.Heartbeat(self.node_id, pr.node_id, self.term,
                                   min(self.commit_index, pr.match_index), self._seq))

    # -- follower ----------------------------------------------------------------------------------
    def _quiesce_follower(self, msg: m.Heartbeat) -> bool:
        """Follower: a quiescing heartbeat from our leader (already taken in): go quiet when our
        log ends at its commit index, flushed and committed. Returns whether we are quiet."""
        log = self.log
        last = log.dirty_offset
        ok = (self.cfg.quiesce_ticks > 0 and self.role == Role.FOLLOWER
              and self.leader_id == msg.src and not self._pending
              and self._storage_running is None and not self._held_replies
              and not self._damaged() and msg.commit_index == last
              and self.commit_index == last and log.flushed_offset == last)
        if ok:
            if not self._quiesced:
                self._go_quiet()
            self._quiesce_seq = max(self._quiesce_seq, msg.seq)
        elif self._quiesced:
            self._wake_follower(ping=False)
        return ok

    def _wake_follower(self, *, ping: bool) -> None:
        self._quiesced = False
        self._election_elapsed = 0
        self._reset_randomized_timeout()
        leader = self.leader_id
        if ping and leader is not None and leader not in self._peers_down:
            self._ping(leader)

    # -- messages ----------------------------------------------------------------------------------
    def _quiet_step(self, msg: m.Message) -> bool:
        """Before a quiesced core handles `msg`: wake it unless `msg` changes nothing that
        matters (a lower term's, a probe or probe answer, a quiesced answer, our leader's
        quiescing heartbeat itself, a vote request from a node that is no voter of ours: the
        term rules and the lease answer those as always), except what a member that restarted
        unseen sends to announce itself (`_announces_itself`: its probe, its ping of any
        term), which always wakes. True: drop `msg` unhandled, it is older than the
        quiescing round (a request or reply the round has already superseded; Raft tolerates
        losing any message, and answering it would only make a quiet group send)."""
        if self._announces_itself(msg):
            self._wake_for_announce()
            return False
        if msg.term < self.term or isinstance(msg, (m.BootstrapProbe, m.BootstrapProbeReply)):
            return False
        if isinstance(msg, m.RequestVote) and msg.src not in self.config.voters:
            return False
        same = msg.term == self.term
        lead = self.leader
        if lead is not None:
            if same and isinstance(msg, (m.AppendEntriesReply, m.HeartbeatReply)) and msg.seq:
                if msg.seq < lead.quiesce_seq:
                    return True
                if isinstance(msg, m.HeartbeatReply) and msg.quiesced:
                    return False
            self._wake_leader()
            return False
        if (same and msg.src == self.leader_id
                and isinstance(msg, (m.AppendEntries, m.Heartbeat))):
            if msg.seq < self._quiesce_seq:
                return True
            if not (isinstance(msg, m.Heartbeat) and msg.quiesce):
                self._wake_follower(ping=False)
            return False
        self._wake_follower(ping=True)
        return False

    def _announces_itself(self, msg: m.Message) -> bool:
        """`msg` is a member of our configuration saying it exists and knows no leader, whatever
        its term: a bootstrap probe (it restarted on an empty data directory) or a ping it sent
        for want of a leader (`_announce`). Either way it restarted unseen by the failure
        detector (faster than its down bound) and will not campaign, so nothing else would
        ever wake us to re-add it or catch it up."""
        if msg.src == self.node_id or msg.src not in self.config.members:
            return False
        if isinstance(msg, m.BootstrapProbe):
            return not self._is_fresh()
        return isinstance(msg, m.HeartbeatReply) and msg.seq == 0 and msg.term < self.term

    def _wake_for_announce(self) -> None:
        if self.role == Role.LEADER:
            self._wake_leader()  # its heartbeat makes the node answer with what it holds
        else:
            self._wake_follower(ping=True)  # the ping wakes our leader, which heartbeats it

    def _announce(self) -> None:
        """A node whose election timer ran out that may not campaign (it lost its disk, or
        flushed entries it must get back first) and knows no leader tells every member it
        exists. With every group quiet nobody would otherwise ever send to it: a node that
        restarted faster than the failure detector's down bound never looked down, so no
        peer_up woke its group. A ping (HeartbeatReply, seq 0) wakes a quiet member
        (`_quiet_step`), and a leader's heartbeat then makes it answer with what it holds, so
        the leader catches it up or re-adds it (raft/core/incarnation.py). A ping of a lower
        term than the receiver's changes nothing else (the term rules drop it); one of a higher
        term moves the receiver up as any message of that term would. (Called for a member
        only: a node not added yet, or removed, has nobody to be caught up by; a node still
        checking whether the cluster is new probes instead.)"""
        for node_id in self.config.members:
            if node_id != self.node_id:
                self._ping(node_id)

    def _round_step(self, msg: m.Message) -> None:
        """Leader with a quiescing round under way, not quiet yet: a follower that answered
        quiesced and now says anything else (a restart's vote request, a woken follower's ping)
        is asked again, and heartbeated meanwhile, instead of being left without heartbeats."""
        lead = self.leader
        assert lead is not None
        if msg.src not in lead.quiesce_acked or msg.term < self.term:
            return
        if isinstance(msg, (m.AppendEntriesReply, m.HeartbeatReply)) and msg.seq:
            if msg.seq < lead.quiesce_seq or (isinstance(msg, m.HeartbeatReply)
                                              and msg.quiesced):
                return
        lead.quiesce_acked.discard(msg.src)

    def _after_quiet_step(self) -> None:
        """A quiesced leader that handled a message: still nothing to do, or wake."""
        if self._quiesced and self.leader is not None and self._quiesce_blocker():
            self._wake_leader()
