"""Incarnations: a node that forgot must not vote, and the leader takes it back by itself.

Raft assumes a node never forgets its term, its vote and the flushed entries that counted toward
a commit. A node whose data directory was lost (deleted, replaced, its metadata damaged) does
forget: voting again it could elect a second leader in a term, or a leader missing a committed
entry. So every data directory has an identity created with it (storage's incarnation), and:

- A node whose metadata is empty (a new or lost directory) starts *pending*. It becomes a
  member in good standing only when (a) the cluster turns out to be brand new: every voter of
  its bootstrap configuration (--peers) answers a BootstrapProbe saying it never saved a term, a
  vote or an entry, or sends it one (a node probes only while it is that new itself); or (b) the
  configuration in force records its own incarnation (the leader re-added it, and promoted it
  once caught up). Until then it never votes (not even a
  pre-vote), never campaigns, and its replies say `rejoining`, so no leader counts them toward
  a commit.
  Why (a) is safe: every decision (an election won, an entry committed) involved a majority,
  every member of which saved a term; with less than a majority of disks lost at once, one of
  them still remembers and answers "not fresh". (So a brand-new cluster elects its first leader
  once every node of --peers has started.)
  (c) The founders rule: a node that founded the cluster by (a) remembers, in its metadata,
  the incarnation each voter it counted had (`founders`). A node that is still as new as when
  it was counted (never saved a term, a vote or an entry) with that same incarnation is told so
  in the answer to its probe, and is a member: it was one of the founders, and an incarnation
  changes whenever a directory loses its metadata, so nothing it ever did was forgotten (it
  did nothing). Without it, a founder cut off before its own answers came (its probe was
  counted, the answers it needed were lost) hears "not fresh" and takes itself for a node that
  lost its disk: with one real disk loss after that, two of three nodes may not vote and no
  leader is ever elected to re-add them (the simulation's diskloss seed 112). A founder
  answers that node's announce (a ping of term 0: it knows no leader) the same way, so a
  vouch lost on the way is given again.
- The configuration records the incarnation a member was added with (ClusterConfig.
  incarnations). A member whose message carries another incarnation than the one recorded, or
  than the new one the leader is re-adding it with, is not the member the configuration knows:
  a leader ignores its replies, a voter its vote request, a candidate its vote.
- The leader re-adds such a member by itself as soon as it hears from it: as a learner with its
  new incarnation (one voter fewer, a single-server change), caught up by recovery, promoted
  once caught up. `raftlog add-node` for that member does the same on request.

Members added before incarnations were recorded (the bootstrap members) get theirs recorded
whenever the leader makes a configuration change anyway; until then the `rejoining` flag alone
tells the leader which of them lost their disk.

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from raft.core import messages as m
from raft.core.confchange import INTERNAL_REQUEST
from raft.core.membership import ClusterConfig
from raft.core.types import Role

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from raft.core.progress import FollowerProgress
    from storage.api import LogStorage, Meta


class Standing(str, Enum):
    """Whether this node may vote and count, and if not, why (shown by `status`)."""

    MEMBER = "member"
    LOST_DISK = "rejoining: lost its disk"
    CATCHING_UP = "rejoining: re-added as a learner, catching up"
    CHECKING = "starting: checking whether the cluster is new"
    JOINING = "joining: waiting to be added or promoted"


class Incarnations:
    """State lives on RaftCore: `incarnation`, `_pending`, `_fresh_from` (voter -> the
    incarnation it was counted with), `_founders` (what `_fresh_from` was when this node
    founded the cluster, itself included; durable), `_not_fresh`, `_probe_elapsed`,
    `votes_refused`; leader side `_rejoiners` (member -> the new incarnation it
    is being re-added with), `_incarnation_heard` (member -> the incarnation its accepted
    replies carry) and `_retired` (member -> incarnations it had before, whose late messages
    are ignored)."""

    cfg: "RaftConfig"
    log: "LogStorage"
    config: ClusterConfig

    def _init_incarnation(self, meta: "Meta") -> None:
        self.incarnation = self.log.incarnation
        self._pending = meta.is_empty() or bool((meta.config or {}).get("pending"))
        self._fresh_from: dict[int, int] = {}
        self._founders: dict[int, int] = {
            int(k): int(v) for k, v in (meta.config or {}).get("founders", ())}
        self._not_fresh = False
        self._probe_elapsed = 0
        self.votes_refused = 0
        self._rejoiners: dict[int, int] = {}
        self._incarnation_heard: dict[int, int] = {}
        self._retired: dict[int, list[int]] = {}
        if self._pending:
            self._hs_dirty = True  # so a restart before it is settled still knows
            self._check_new_cluster()
            if self.standing() == Standing.CHECKING:
                self._send_probes()

    # -- this node's standing -----------------------------------------------------------------
    def standing(self) -> Standing:
        if not self._pending:
            # Its term, vote and log are its own (a first start, or its re-add committed):
            # a configuration here that records an older incarnation is a stale view (a log
            # cut at open can leave one in force), not news.
            return Standing.MEMBER
        cfg = self.config
        recorded = cfg.incarnations.get(self.node_id)
        if recorded is not None:
            if recorded != self.incarnation:
                return Standing.LOST_DISK
            # Re-added: a member again once promoted (a learner catching up does not vote).
            return Standing.MEMBER if self.node_id in cfg.voters else Standing.CATCHING_UP
        if self.node_id not in cfg.voters:
            return Standing.JOINING  # (--join, or added as a learner: not a voter yet)
        if self._is_fresh() and self.node_id in self.cfg.voters:
            return Standing.CHECKING
        return Standing.LOST_DISK

    def may_vote(self) -> bool:
        """Only a member in good standing votes (pre-votes included)."""
        return self.standing() == Standing.MEMBER

    def _is_fresh(self) -> bool:
        """Never saved a term, a vote or an entry, and never heard that anyone did."""
        return self._never_saved() and not self._not_fresh

    def _never_saved(self) -> bool:
        """This data directory never saved a term, a vote or an entry (nor learnt of a
        configuration entry): it never took part in any decision."""
        log = self.log
        return (self.term == 0 and self.voted_for is None
                and log.dirty_offset == -1 and log.start_offset == 0
                and self._configs[-1].offset == -1 and not self.config.incarnations)

    def _tick_incarnation(self) -> None:
        if (self._pending and self._configs[-1].offset <= self.commit_index
                and self.config.incarnations.get(self.node_id) == self.incarnation
                and self.node_id in self.config.voters):
            # Re-added, and that is committed: a member for good, whatever later happens to
            # its log (a cut at open must not make it forget it was re-added).
            self._pending = False
            self._hs_dirty = True
        if self._pending and self.standing() == Standing.CHECKING:
            self._probe_elapsed += 1
            if self._probe_elapsed >= self.cfg.election_ticks:
                self._probe_elapsed = 0
                self._send_probes()  # a probe or its answer may have been lost

    def _send_probes(self) -> None:
        for v in self.cfg.voters:
            if v != self.node_id and v not in self._fresh_from:
                self._send(m.BootstrapProbe(self.node_id, v, self.term, self.incarnation))

    def _vouches_for(self, node_id: int, incarnation: int) -> bool:
        """The founders rule's answer: only for the very directory counted at founding, and
        only for a voter still (a founder removed since is no member to be made one again)."""
        return self._founders.get(node_id) == incarnation and node_id in self.config.voters

    def _handle_probe(self, msg: m.BootstrapProbe) -> None:
        self._send(m.BootstrapProbeReply(self.node_id, msg.src, self.term, self.incarnation,
                                         self._is_fresh(), msg.incarnation,
                                         self._vouches_for(msg.src, msg.incarnation)))
        if self._pending and self.standing() == Standing.CHECKING and \
                msg.src in self.cfg.voters:
            # A probe says its sender is fresh as surely as a fresh answer does: a node
            # probes only while CHECKING, which needs it fresh. Counting it matters to a
            # replica that started before the others (a new partition's, created first by
            # the controller leader's node): its own probes were dropped by nodes not running
            # the group yet, and their answers to its next ones come after they elected
            # ("not fresh"), which would leave it a node that lost its disk, with no vote.
            self._fresh_from[msg.src] = msg.incarnation
            self._check_new_cluster()

    def _handle_probe_reply(self, msg: m.BootstrapProbeReply) -> None:
        if msg.prober_incarnation and msg.prober_incarnation != self.incarnation:
            return  # an answer to another incarnation of this node (before a disk loss)
        if msg.founder and self._counted_as_founder():
            self._pending = False  # the founders rule (module docstring, (c))
            self._hs_dirty = True
            return
        if not self._pending or self.standing() != Standing.CHECKING:
            return
        if not msg.fresh:
            self._not_fresh = True  # the cluster has a history this node lost: rejoin
            return
        self._fresh_from[msg.src] = msg.incarnation
        self._check_new_cluster()

    def _vouch_for_announce(self, msg: m.Message) -> None:
        """A founder answers the ping of a node announcing itself (raft/core/quiesce.py,
        `_announce`: it may not vote and knows no leader) as it would its probe when that node
        never saved a term and is a voter it counted, with that directory: one whose vouch was
        lost stops probing at its first "not fresh", and with no leader to re-add it only its
        announce is left to answer."""
        if (isinstance(msg, m.HeartbeatReply) and msg.seq == 0 and msg.rejoining
                and self._vouches_for(msg.src, msg.incarnation)):
            self._send(m.BootstrapProbeReply(self.node_id, msg.src, self.term, self.incarnation,
                                             self._is_fresh(), msg.incarnation, True))

    def _counted_as_founder(self) -> bool:
        """A founder vouched for this incarnation (the answer echoes it): a member, if this
        directory is still as new as it was then (whatever it did since would be saved here:
        its identity would have changed had it lost that) and the configuration it knows
        still has it as a voter with no other incarnation recorded."""
        return (self._pending and self._never_saved() and self.node_id in self.cfg.voters
                and self.node_id in self.config.voters
                and self.config.incarnations.get(self.node_id) is None)

    def _check_new_cluster(self) -> None:
        others = {v for v in self.cfg.voters if v != self.node_id}
        if self.standing() == Standing.CHECKING and others <= self._fresh_from.keys():
            self._pending = False  # every voter is new too: this is the cluster's first start
            self._hs_dirty = True
            # Who was counted, with which directory: a founder cut off before its own answers
            # came is recognised by it later (the founders rule).
            self._founders = {v: self._fresh_from[v] for v in others}
            self._founders[self.node_id] = self.incarnation

    # -- screening messages from members ---------------------------------------------------------
    def _screen(self, msg: m.Message) -> bool:
        """False: ignore `msg`, it comes from a data directory the configuration does not know
        for its sender (a member that lost its disk, or an old incarnation of one)."""
        src = msg.src
        cfg = self.config
        if (src not in cfg.voters and src not in cfg.learners) or src == self.node_id:
            return True
        if isinstance(msg, (m.AppendEntriesReply, m.HeartbeatReply)):
            return self.role != Role.LEADER or self._screen_reply(msg)
        if isinstance(msg, (m.RequestVote, m.RequestVoteReply)):
            expected = self._rejoiners.get(src, cfg.incarnations.get(src))
            return expected is None or msg.incarnation == expected
        return True

    def _screen_reply(self, msg: m.AppendEntriesReply | m.HeartbeatReply) -> bool:
        src, inc = msg.src, msg.incarnation
        cfg = self.config
        recorded = cfg.incarnations.get(src)
        readding = self._rejoiners.get(src)
        if readding is not None and recorded == readding:
            del self._rejoiners[src]  # the re-add is in force: it is the member we know now
            readding = None
        if readding is not None:
            if inc != readding and msg.rejoining and inc not in self._retired.get(src, ()):
                self._new_disk(src, inc)  # it lost its disk again
            else:
                self._maybe_readd()
            self._note_rejoiner_answer(msg)
            return False  # not re-added yet, or an older incarnation
        if recorded is not None and inc != recorded:
            if msg.rejoining and inc not in self._retired.get(src, ()):
                self._new_disk(src, inc)
            self._note_rejoiner_answer(msg)
            return False  # not the member the configuration knows
        if recorded is None and msg.rejoining and src in cfg.voters:
            self._new_disk(src, inc)  # a voter that forgot: it must not count
            self._note_rejoiner_answer(msg)
            return False
        if self._incarnation_heard.get(src, inc) != inc:
            self._forget_progress(src)  # another disk than the one we heard: start it over
        self._incarnation_heard[src] = inc
        return True

    def _note_rejoiner_answer(self, msg: m.AppendEntriesReply | m.HeartbeatReply) -> None:
        """A voter answering from the new disk it is being re-added with does not count, but
        what its log lacks is still evidence for a damaged batch of ours (raft/core/repair.py)."""
        if self._rejoiners.get(msg.src) == msg.incarnation:
            self._note_copy_answer(msg)

    def _new_disk(self, node_id: int, incarnation: int) -> None:
        """`node_id` answers from a data directory the configuration does not know: whatever
        the leader knew of its log is void; re-add it with its new incarnation."""
        old = self._rejoiners.get(node_id, self.config.incarnations.get(node_id))
        if old is not None:
            retired = self._retired.setdefault(node_id, [])
            retired.append(old)
            del retired[:-8]  # a bounded memory of superseded incarnations
        self._rejoiners[node_id] = incarnation
        self._incarnation_heard.pop(node_id, None)
        self._forget_progress(node_id)
        if self.leader is not None and self.leader.transfer_target == node_id:
            self.leader.transfer_target = None
        self._maybe_readd()

    def _forget_progress(self, node_id: int) -> None:
        if self.leader is not None and node_id in self.leader.progress:
            self.leader.progress[node_id] = self._new_progress(node_id)

    # -- the leader re-adds members that lost their disk ------------------------------------------
    def _maybe_readd(self) -> None:
        if self.leader is None or not self._rejoiners:
            return
        if self._config_change_blocked() or self.leader.transfer_target is not None:
            return  # one change at a time: a later tick or reply tries again
        cfg = self.config
        for node_id, inc in sorted(self._rejoiners.items()):
            if node_id not in cfg.members:
                del self._rejoiners[node_id]
            elif cfg.incarnations.get(node_id) != inc and cfg.voters != (node_id,):
                self._propose_config(INTERNAL_REQUEST, cfg.rejoined(node_id, inc))
                return

    def _readd_for_request(self, node_id: int) -> tuple[ClusterConfig | None, str]:
        """`add-node` for a member: (the configuration that re-adds it, "") when it lost its
        disk, (None, "") when that is already done, (None, why not) otherwise."""
        cfg = self.config
        inc = self._rejoiners.get(node_id)
        if inc is not None:
            return (None, "") if cfg.incarnations.get(node_id) == inc else (
                cfg.rejoined(node_id, inc), "")
        if node_id in cfg.learners and cfg.incarnations.get(node_id) is not None:
            return None, ""  # re-added already: a learner catching up, promoted once caught up
        return None, (f"node {node_id} is already a member and answers from the data "
                      f"directory the configuration knows; nothing to re-add (start it on an "
                      f"empty data directory first if you mean to replace its disk)")

    def _with_known_incarnations(self, cfg: ClusterConfig) -> ClusterConfig:
        """Record the incarnations the leader knows (its own, its followers' accepted ones)
        for members that have none yet: a configuration change is being made anyway."""
        known = {k: v for k, v in self._incarnation_heard.items() if k not in self._rejoiners}
        known[self.node_id] = self.incarnation
        return cfg.with_recorded(known)

    def _learner_incarnation_known(self, pr: "FollowerProgress") -> bool:
        """A learner is promoted with its incarnation recorded: the leader must have heard it."""
        return (self.config.incarnations.get(pr.node_id) is not None
                or bool(self._incarnation_heard.get(pr.node_id)))
