"""Elections: pre-vote, votes and the CheckQuorum lease.

Rules held here:
- A vote is granted only to a candidate whose log is at least as up to date as ours (last term,
  then last offset), once per term; the grant marks hard state dirty, and the driver persists it
  before the reply leaves (raft/core/ready.py), so a restart cannot vote twice in one term.
- Whether the candidate is in *our* configuration does not matter (ours may be stale; the Raft
  thesis grants such votes): the candidate counts only votes of its own configuration's voters,
  and the lease below keeps a removed node from disrupting a cluster that has a leader.
- A pre-vote never changes our term or vote: it only asks "would you vote for me?".
- While we heard from a leader within the election timeout, a (non-transfer) vote request is
  ignored (the lease), so a partitioned node rejoining cannot depose a healthy leader.
- A node that is not a member in good standing (it lost its disk and was not re-added yet, or
  it is still checking whether the cluster is new: raft/core/incarnation.py) refuses every vote and
  pre-vote and never campaigns; a node holding damaged batches campaigns only after twice the
  election timeout (raft/core/repair.py).
- A log that lost flushed batches (cut at open: storage's lost_position) still compares as the
  log it held: the node must not vote for a candidate missing entries it counted toward, and
  does not campaign itself until it has them (or entries of a later term) again.

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from raft.core import messages as m
from raft.core.quorum import VoteResult, vote_result
from raft.core.types import Role

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from storage.api import LogStorage


class Campaign(Enum):
    """Why a node campaigns; each kind is one rule about the lease and the term."""

    PRE_VOTE = "pre-vote"  # election timeout, pre-vote on: ask first; no term changes
    ELECTION = "election"  # election timeout, pre-vote off: a real vote, the lease applies
    # A real vote a won pre-vote earned: the peers that granted the pre-vote were out of their
    # lease already (a peer in its lease ignores pre-votes too), so the vote skips the lease.
    AFTER_PRE_VOTE = "after-pre-vote"
    TRANSFER = "transfer"  # TimeoutNow from the leader: a real vote at once, skipping the lease

    @property
    def skips_lease(self) -> bool:
        """Sent on the wire as RequestVote.transfer: the receiver's lease does not apply."""
        return self in (Campaign.AFTER_PRE_VOTE, Campaign.TRANSFER)


class Elections:
    """Election state lives on RaftCore: `term`, `voted_for`, `_votes`, `_election_elapsed`."""

    cfg: "RaftConfig"
    log: "LogStorage"

    def _campaign(self, kind: Campaign) -> None:
        """Start a campaign of `kind`: a pre-vote asks without changing our term; the other
        kinds are real elections in the next term."""
        if kind == Campaign.PRE_VOTE:
            self._become_pre_candidate()
            term = self.term + 1
        else:
            self._become_candidate()
            term = self.term
        if vote_result(self.config.voters, self._votes) == VoteResult.WON:
            self._won(kind)
            return
        last_offset, last_term = self.log.dirty_offset, self.log.last_term()
        for v in self.config.voters:
            if v != self.node_id:
                self._send(m.RequestVote(self.node_id, v, term, last_offset, last_term,
                                         pre_vote=kind == Campaign.PRE_VOTE,
                                         transfer=kind.skips_lease,
                                         incarnation=self.incarnation))

    def first_election(self, preferred: bool) -> None:
        """A brand-new group (term 0, no leader heard of) whose runtime knows which replica
        should lead first (a partition's preferred replica): that one campaigns at its next
        tick, the others wait two election timeouts longer than usual before they would.
        Why: a topic create starts hundreds of groups on every node at once; with equal random
        timeouts their replicas campaign together, and when messages take about as long as the
        timeout spread (an overloaded loop) the pre-votes all pass and the votes split, term
        after term (measured at 1,000 partitions: docs/PERFORMANCE.md). Liveness only: any
        replica still campaigns when its own (longer) timeout runs out."""
        if self.term != 0 or self.leader_id is not None or self.role != Role.FOLLOWER:
            return
        if preferred:
            self._election_elapsed = max(self._election_elapsed, self._randomized_timeout - 1)
        else:
            self._election_elapsed = -2 * self.cfg.election_ticks

    def _won(self, kind: Campaign) -> None:
        """A majority granted: a won pre-vote earns the real vote, a real vote leadership."""
        if kind == Campaign.PRE_VOTE:
            self._campaign(Campaign.AFTER_PRE_VOTE)
        else:
            self._become_leader()

    def _in_lease(self, msg: m.RequestVote) -> bool:
        """CheckQuorum's lease: while we heard from a leader within the election timeout, a
        vote request (not a transfer) is ignored, so a partitioned node rejoining cannot depose
        a healthy leader. A leader whose node the failure detector reports down holds no lease,
        whatever our election counter says (it stood still while we were quiesced:
        raft/core/quiesce.py)."""
        return (self.cfg.check_quorum and not msg.transfer and self.leader_id is not None
                and self._election_elapsed < self.cfg.election_ticks
                and self.leader_id not in self._peers_down)

    def _may_campaign(self) -> bool:
        """A node that forgot, or lost flushed entries it has not got back yet, does not
        campaign: as leader it would serve (and overwrite) a log missing them. (A node with
        damaged batches may: its log is whole in terms, and as leader it hands over to a voter
        holding the range, raft/core/repair.py; it only waits longer, so a whole node leads first.)"""
        if self._storage_running is not None:
            return False  # the log is changing (raft/core/ready.py StorageWork): after it is done
        lost = self.log.lost_position
        return self.may_vote() and (lost is None or (lost[1], lost[0]) <= (
            self.log.last_term(), self.log.dirty_offset))

    def _log_up_to_date(self, last_offset: int, last_term: int) -> bool:
        my_term, my_last = self.log.last_term(), self.log.dirty_offset
        lost = self.log.lost_position  # (offset, term) it held before losing flushed batches
        if lost is not None and (lost[1], lost[0]) > (my_term, my_last):
            my_last, my_term = lost
        return last_term > my_term or (last_term == my_term and last_offset >= my_last)

    def _handle_pre_vote(self, msg: m.RequestVote) -> None:
        granted = self.may_vote() and self._log_up_to_date(msg.last_offset, msg.last_term)
        if not self.may_vote():
            self.votes_refused += 1
        self._send(m.RequestVoteReply(self.node_id, msg.src, msg.term if granted else self.term,
                                      granted, pre_vote=True, incarnation=self.incarnation))

    def _handle_vote(self, msg: m.RequestVote) -> None:
        if msg.pre_vote:  # same term as ours: a pre-candidate of our own term cannot win
            self._send(m.RequestVoteReply(self.node_id, msg.src, self.term, False, True,
                                          self.incarnation))
            return
        if not self.may_vote():
            # It forgot (or never had) what a vote stands on: its term, its vote, its log.
            self.votes_refused += 1
            self._send(m.RequestVoteReply(self.node_id, msg.src, self.term, False, False,
                                          self.incarnation))
            return
        can_vote = (self.voted_for in (None, msg.src) and self.leader_id is None
                    and self.role != Role.LEADER) or self.voted_for == msg.src
        granted = (can_vote and self._log_up_to_date(msg.last_offset, msg.last_term))
        if granted:
            self.voted_for = msg.src
            self._hs_dirty = True  # durable before the reply leaves (driver contract)
            self._election_elapsed = 0
        self._send(m.RequestVoteReply(self.node_id, msg.src, self.term, granted, False,
                                      self.incarnation))

    def _handle_vote_reply(self, msg: m.RequestVoteReply) -> None:
        if msg.pre_vote != (self.role == Role.PRE_CANDIDATE):
            return
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            return
        if msg.pre_vote and msg.granted and msg.term != self.term + 1:
            return  # a reply to an older pre-campaign
        self._votes[msg.src] = msg.granted
        result = vote_result(self.config.voters, self._votes)
        if result == VoteResult.WON:
            # (The kind of a real vote no longer matters once it is won.)
            self._won(Campaign.PRE_VOTE if self.role == Role.PRE_CANDIDATE
                      else Campaign.ELECTION)
        elif result == VoteResult.LOST:
            self._become_follower(self.term, None)
