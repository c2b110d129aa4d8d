"""Membership changes through the log: one server at a time, learners promoted once caught
up, and the history of configurations a node keeps across crashes.

Rules held here:
- A configuration is in force as soon as it is appended (the dissertation's single-server
  rule), so a truncation can take it back; only one change is in flight at a time, and none
  before this leader has committed an entry of its term.
- A learner is promoted once its match index reaches the leader's flushed offset.
- A removed leader hands leadership over first, and steps down once the configuration without
  it commits.

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raft.core.leader_state import Waiting
from raft.core.membership import ClusterConfig, ConfigEntry
from raft.core.progress import FollowerProgress
from raft.core.snapshot_sections import stored_config
from raft.core.types import ErrorCode, Role
from storage.batch import Batch, BatchKind

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from storage.api import LogStorage

# How many recent configuration entries the metadata keeps, so a crash that drops unflushed
# configuration entries can fall back to the one still in the log.
_CONFIG_HISTORY = 4
# Request id of proposals the core makes itself (no-op, promotions): nobody waits for them.
INTERNAL_REQUEST = -1


class ConfChanges:
    """Membership state lives on RaftCore: `_configs` (recent ConfigEntry history, the last in
    force); the leader's no-op offset is in `self.leader` (raft/core/leader_state.py)."""

    cfg: "RaftConfig"
    log: "LogStorage"
    _configs: list[ConfigEntry]

    def propose_config(self, request_id: int, *, add_learner: int | None = None,
                       address: str | None = None, remove: int | None = None) -> None:
        """One membership change: add a learner (promoted to voter automatically once caught
        up) or remove a member. Answered through ready().answers when the entry commits."""
        lead = self.leader
        if lead is None or lead.transfer_target is not None:
            self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=self.leader_id)
            return
        if self._quiesced:
            self._wake_leader()  # raft/core/quiesce.py
        if (add_learner is None) == (remove is None):
            raise ValueError("give exactly one of add_learner or remove")
        cfg = self.config
        readd = None
        if add_learner is not None and add_learner in cfg.members:
            readd, refused = self._readd_for_request(add_learner)
            if refused:
                self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                    f"{refused} ({self._describe(cfg)})"))
                return
            if readd is None:  # the leader re-added it already (raft/core/incarnation.py)
                self._answer(request_id, ErrorCode.OK, base_offset=self._configs[-1].offset,
                             last_offset=self._configs[-1].offset)
                return
        reason = self._config_change_blocked()
        if reason:
            self._answer(request_id, ErrorCode.BACKPRESSURE, message=reason)
            return
        if add_learner is not None:
            # A member that lost its disk comes back as a learner with its new incarnation.
            new = readd if readd is not None else cfg.with_learner(add_learner, address)
        else:
            assert remove is not None
            if remove not in cfg.members:
                self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                    f"node {remove} is not a member ({self._describe(cfg)})"))
                return
            if remove == self.node_id:
                # Removing the leader: hand over first, the new leader does the removal.
                others = [v for v in cfg.voters if v != self.node_id]
                if not others:
                    self._answer(request_id, ErrorCode.BAD_REQUEST, message=(
                        "cannot remove the only voter; add another node first"))
                    return
                self.transfer_leadership(None)
                self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=lead.transfer_target,
                             message="leadership is moving; retry the removal at the new leader")
                return
            if remove in cfg.voters and len(cfg.voters) == 1:
                self._answer(request_id, ErrorCode.BAD_REQUEST,
                             message="cannot remove the only voter")
                return
            new = cfg.without(remove)
        self._propose_config(request_id, new)

    def _config_change_blocked(self) -> str:
        """Why a membership change must wait now ("" when it may go ahead)."""
        lead = self.leader
        if lead is None:
            return "this node is not the leader"
        # Until this leader commits an entry of its term, a change it appends could commit
        # alongside one an earlier leader appended and never committed, on two different
        # majorities (Ongaro, raft-dev 2015; tests/raft/test_membership_safety.py).
        if self.commit_index < lead.noop_offset:
            return "this leader has not committed an entry of its term yet; retry shortly"
        if self._configs[-1].offset > self.commit_index:
            return "another membership change is in progress; retry once it commits"
        return ""

    def _propose_config(self, request_id: int, new: ClusterConfig) -> None:
        new = self._with_known_incarnations(new)
        placed = self._append_as_leader(new.to_batch())
        if placed is None:
            self._answer(request_id, ErrorCode.BACKPRESSURE,
                         message="the leader's unflushed tail is full; retry shortly")
            return
        assert self.leader is not None  # (_append_as_leader placed it: we lead)
        self.leader.waiting.append(Waiting(request_id, placed.base_offset, placed.last_offset))

    def _maybe_promote(self, pr: FollowerProgress) -> None:
        """A learner is promoted once it holds everything the leader has flushed."""
        lead = self.leader
        if (lead is None or not pr.learner or pr.node_id not in self.config.learners
                or self._config_change_blocked() or lead.transfer_target is not None
                or pr.node_id in self._rejoiners or not self._learner_incarnation_known(pr)):
            return  # (a promotion appended during a transfer would leave the target behind)
        if pr.match_index >= self.log.flushed_offset:
            self._propose_config(INTERNAL_REQUEST, self.config.promoted(pr.node_id))

    def _on_commit(self) -> None:
        """A removed leader steps down once the configuration without it commits."""
        if (self.role == Role.LEADER and self.node_id not in self.config.voters
                and self._configs[-1].offset <= self.commit_index):
            self._become_follower(self.term, None)

    def _applied_to_log(self, batch: Batch) -> None:
        """Bookkeeping for every batch that enters our log (leader or follower)."""
        if batch.kind == BatchKind.DATA:
            self.producers.record(batch)
        elif batch.kind == BatchKind.MIRRORED:
            self.producers.record(batch)
            self._mirror_applied(batch)
        elif batch.kind == BatchKind.CONFIG:
            self._configs.append(ConfigEntry(batch.base_offset, batch.term,
                                              ClusterConfig.from_batch(batch)))
            keep = max(_CONFIG_HISTORY, 1)
            self._configs = self._configs[-keep:]
            self._hs_dirty = True
            self._config_changed()

    def _config_changed(self) -> None:
        cfg = self.config
        lead = self.leader
        if lead is None:
            return
        progress = lead.progress
        for node_id in cfg.members:
            if node_id != self.node_id and node_id not in progress:
                progress[node_id] = self._new_progress(node_id)
        for node_id in list(progress):
            if node_id not in cfg.members:
                del progress[node_id]
            else:
                progress[node_id].learner = node_id in cfg.learners

    def _bootstrap_config(self) -> ConfigEntry:
        return ConfigEntry(-1, 0, ClusterConfig(tuple(sorted(self.cfg.voters)),
                                                 tuple(sorted(self.cfg.learners))))

    def _config_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "history": [{"offset": c.offset, "term": c.term, "config": c.config.to_dict()}
                        for c in self._configs],
            "commit": self.commit_index}
        if self._pending:
            out["pending"] = True  # not yet a member in good standing (raft/core/incarnation.py)
        if self._founders:  # whom this node counted when it founded the cluster (ditto)
            out["founders"] = sorted(self._founders.items())
        return out

    def _load_configs(self, meta: dict | None) -> list[ConfigEntry]:
        """The latest configuration entry still in the log (a crash may have dropped newer,
        unflushed ones), else the one stored with the log start, else the bootstrap one.

        Below the log start only the configuration stored with the start counts: the saved
        history may predate a state transfer and name entries of a log this node no longer
        has (a node must never vote with a configuration older than its log start)."""
        at_start = stored_config(self.log.snapshot)
        out = [at_start or self._bootstrap_config()]
        if not meta or "history" not in meta:
            return out
        for item in meta["history"]:
            off, term = int(item["offset"]), int(item["term"])
            if at_start is not None and off < self.log.start_offset:
                continue
            if off < 0:
                out = [ConfigEntry(-1, 0, ClusterConfig.from_dict(item["config"]))]
                continue
            if off < self.log.start_offset or (off <= self.log.dirty_offset
                                                and self.log.term_at(off) == term):
                out.append(ConfigEntry(off, term, ClusterConfig.from_dict(item["config"])))
        return out[-_CONFIG_HISTORY:]

    def _rebuild_from_log(self) -> None:
        """Producer table and any configuration entries past the saved metadata, from the log.
        Reads the whole log once at start (the table must know every remembered producer)."""
        log = self.log
        offset = log.start_offset
        known = {c.offset for c in self._configs}
        while offset <= log.dirty_offset:
            batches, skip_to = self._read_or_skip(offset, 8 << 20)
            if not batches:  # damaged: repaired later from the leader (raft/core/repair.py)
                self.producers.mark_unread(offset, skip_to - 1)  # (it cannot tell retries)
                offset = skip_to
                continue
            for b in batches:
                if b.kind == BatchKind.DATA:
                    self.producers.record(b)
                elif b.kind == BatchKind.MIRRORED:
                    self.producers.record(b)
                    self._mirror_applied(b)
                elif b.kind == BatchKind.CONFIG and b.base_offset not in known \
                        and b.base_offset > self._configs[-1].offset:
                    self._configs.append(ConfigEntry(b.base_offset, b.term,
                                                      ClusterConfig.from_batch(b)))
            offset = batches[-1].last_offset + 1

    @staticmethod
    def _describe(cfg: ClusterConfig) -> str:
        return f"voters {list(cfg.voters)}, learners {list(cfg.learners)}"
