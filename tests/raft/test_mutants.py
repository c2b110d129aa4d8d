"""Mutation tests: every safety rule of the core, switched off one at a time, must make a test
fail. A rule that can be removed while the suite stays green is a rule nobody checks.

Each mutant is a textual change to one function of the core: `old` must occur exactly once in
that function's source (so a refactor that moves the rule breaks this test loudly instead of
silently testing nothing), the changed function is compiled in its module's namespace and
patched in for the duration of the test. The killers are ordinary tests of tests/raft, tried in
order; the first that fails kills the mutant. Scripted scenarios kill them in well under a
second each, so the whole module stays cheap in CI.

`python -m pytest tests/raft/test_mutants.py -v` lists each mutant with the test that killed it.
"""

from __future__ import annotations

import __future__
import functools
import importlib
import inspect
import pathlib
import sys
import tempfile
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from raft.core.types import Acks
import test_core
import test_backlog
import test_merging
import test_quiesce
import test_quiet_rejoin
import test_recovering_flag
import test_retention
import test_disk_loss_rules
import test_force_new_cluster
import test_heartbeat_accounting
import test_membership_safety
import test_safety_rules
import test_state_transfer
import test_subscriptions
import test_first_election
import test_late_founder
import test_founders
import test_mirror
import test_index_log_moved
import test_probe_resets

# The runtime's fail-stop rule is killed by a node test.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "node"))
import test_failstop  # noqa: E402
import test_flush_thread  # noqa: E402
import test_malformed_records  # noqa: E402
import test_subscriptions_inproc  # noqa: E402
import test_topic_subscriptions_inproc  # noqa: E402
import test_protocol_types  # noqa: E402
import test_client_retry  # noqa: E402
import test_commit_waits_for_watermark  # noqa: E402  (a new leader's watermark is waited for)
import test_client_hub  # noqa: E402
import test_client_topics  # noqa: E402
import test_cluster_identity  # noqa: E402
import test_group_wire  # noqa: E402
import test_retention_config  # noqa: E402  (retention's round driven by bytes too)
import test_multigroup_inproc  # noqa: E402
# The record rule's fast path is killed by the record tests (tests/storage).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "storage"))
import test_records  # noqa: E402
import test_lmdb_heads  # noqa: E402  (the heads DB follows every cut of the records)
import test_quiesce_inproc  # noqa: E402
import test_peer_restart  # noqa: E402  (tests/node: a peer restarted unseen)
# The security rules' killers live with the security tests (tests/security).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "security"))
import test_security_unit  # noqa: E402
import test_topic_grants  # noqa: E402
import test_link_gap_secured  # noqa: E402  (a puller's gap report on a token-secured sink)
# The staged-load service's rules are killed by its own tests (tests/spark, no Spark needed).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "spark"))
import test_load_service  # noqa: E402
# The controller's rules (group ids, placement, the planner's bounds) are killed by its tests.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "controller"))
import test_controller_state  # noqa: E402
import test_placement  # noqa: E402
import test_shards  # noqa: E402  (partitions on (node, shard): docs/SHARDS.md)
import test_links_controller  # noqa: E402  (cross-cluster links: docs/REPLICATION.md)
import test_link_manager  # noqa: E402  (tests/node, on the path above)
import test_link_puller  # noqa: E402  (tests/node)
import test_link_anchor  # noqa: E402  (tests/node: a source that lost data is not copied)
import test_link_restore  # noqa: E402  (tests/node: link create --restore)
import test_request_order  # noqa: E402  (tests/node: pipelined requests keep their order)
import test_produce_callbacks  # noqa: E402  (tests/node: produces answered without a task)
import test_reply_write  # noqa: E402  (tests/node: replies go out whole)
import test_links_inproc  # noqa: E402  (tests/node: a link holds its source's retention)
# The store's group commit across logs is killed by the storage tests (tests/storage).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "storage"))
import test_store  # noqa: E402
import test_lmdb_edges  # noqa: E402  (tests/storage, on the path above)
import test_unpersisted_start  # noqa: E402  (tests/storage: a cut below an unpersisted start)
import test_cold_reads  # noqa: E402  (tests/storage: reads without the log's lock)
import test_read_heads  # noqa: E402  (tests/storage: the recent headers held in memory)
import test_flusher  # noqa: E402  (tests/node, on the path above)
import test_reconciler  # noqa: E402  (tests/node: the node's topics)
import test_topic_settings_inproc  # noqa: E402  (tests/node: per-topic settings in force)
import test_replica_moves_inproc  # noqa: E402  (tests/node: replica moves)
import test_controller_retention  # noqa: E402  (tests/node: the controller log's retention)
# The node's recovery budget is killed by its own tests (tests/recovery).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "recovery"))
import test_budget  # noqa: E402
import test_liveness_lag  # noqa: E402  (tests/node: the detector under a peer's lag)
import test_peer_lanes  # noqa: E402  (tests/node: a link's lanes and a stream's rules)
import test_meta_checkpoint  # noqa: E402  (tests/node: checkpoints off the Ready loop)
import test_scrub_scheduler  # noqa: E402  (tests/node: the node's one scrub task)
# The many-group simulation's routing and reconciling rules are killed by its seeds (tests/sim).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sim"))
import test_topics_sim  # noqa: E402
import test_link_sim  # noqa: E402  (two clusters and a link: the mirror's position rule)


def _in_tmp(test: Callable[..., None], *args: object) -> Callable[[], None]:
    """A killer that takes a fresh temporary directory (as pytest's tmp_path) on every run."""
    def run() -> None:
        with tempfile.TemporaryDirectory(prefix="raftlog-mutant-") as d:
            test(*args, pathlib.Path(d))
    run.__name__ = test.__name__
    return run


def _with_memory_store(test: Callable[..., None], *args: object) -> Callable[[], None]:
    """A killer that takes a fresh MemoryStore (as its `store` fixture) on every run."""
    def run() -> None:
        test(test_flusher.open_store(None), *args)
    run.__name__ = test.__name__
    return run


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # where the function is defined
    qualname: str  # "Class.method" or "function"
    old: str
    new: str
    killers: tuple[Callable[[], None], ...]


MUTANTS = [
    Mutant("a mirror's leader appends a MIRRORED batch at or below its visible end",
           "raft.core.mirror", "Mirror._mirror_propose",
           "if base <= self.visible_end:  # the position rule",
           "if False:",
           (functools.partial(test_mirror.test_the_position_rule,
                              test_mirror.POSITION_CASES[1], None),)),
    Mutant("a mirror's visible end at the log start (the `mirror` section) is not read back",
           "raft.core.mirror", "Mirror._mirror_open",
           "self.visible_end = end_at_start(self.log.snapshot)",
           "self.visible_end = -1",
           (_in_tmp(test_mirror.test_the_mirror_section_survives_a_retention_cut_and_a_state_transfer,
                    None),)),
    Mutant("a suffix truncation keeps the dropped MIRRORED batches' visible end",
           "raft.core.mirror", "Mirror._mirror_truncated",
           "self.visible_end = run_sync(visible_end_upto(self.log, after))",
           "pass",
           (functools.partial(test_mirror.test_a_suffix_truncation_recomputes_the_visible_end,
                              test_mirror.TRUNCATION_CASES[0], None),)),
    Mutant("a batched scrub call hands each log's findings to a neighbour's group",
           "raft.node.scrub_scheduler", "NodeScrubber._call",
           "for target, res in zip(picked, results):",
           "for target, res in zip(picked[1:] + picked[:1], results):",
           (test_scrub_scheduler.test_damage_found_in_a_batched_call_goes_to_its_own_group,)),
    Mutant("a read error in a batched scrub call is dropped instead of fail-stopping its group",
           "raft.node.scrub_scheduler", "scrub_batch",
           "out.append(e)",
           "out.append(None)",
           (test_scrub_scheduler.test_a_read_error_in_a_batched_call_fail_stops_its_own_group_only,)),
    Mutant("a store flush credits a log with its dirty offset, not what its transaction held",
           "storage.lmdb_log", "LmdbLog._flush_apply",
           "self._flushed = part.end",
           "self._flushed = self._dirty",
           (_in_tmp(test_store.test_a_store_flush_credits_each_log_only_what_its_transaction_held),)),
    Mutant("a store flush credits one log with another log's flushed offset",
           "storage.lmdb_store", "LmdbStore._flush",
           "out[part.log.group_id] = part.log._flush_apply(part)",
           "out[parts[-1].log.group_id] = part.log._flush_apply(part)",
           (_in_tmp(test_store.test_a_store_flush_credits_each_log_only_what_its_transaction_held),)),
    Mutant("the node's flusher tells every group the highest offset of its flush",
           "raft.node.flusher", "NodeFlusher._flush_round",
           "g.on_flushed(flushed[g.log.group_id])",
           "g.on_flushed(max(flushed.values()))",
           (_with_memory_store(test_flusher.test_groups_asking_together_share_one_fsync, 8),)),
    Mutant("the in-memory store flush credits one log with another log's flushed offset",
           "storage.memory", "MemoryStore.flush",
           "out[log.group_id] = log._flush_apply(plan)",
           "out[plans[-1][0].group_id] = log._flush_apply(plan)",
           (_in_tmp(test_store.test_a_store_flush_gives_every_log_its_own_flushed_offset,
                    "memory"),)),
    # A crash loses exactly what is past the flushed offset: the in-memory twin's durable cut
    # keeps the flushed batches an unpersisted advance_start left below the live start.
    Mutant("the in-memory log's durable suffix cut drops the batches below an unpersisted start",
           "storage.memory", "MemoryLog.truncate_suffix",
           "self._d_batches = [b for b in self._d_batches if b.last_offset <= after_offset]",
           "self._d_batches = list(self._batches)",
           (test_unpersisted_start
            .test_the_contract_example_keeps_the_flushed_batch_below_an_unpersisted_start,)),
    # A cold read must not hold up the owner (issue 28's produce stall), and a read that goes on
    # past its snapshot must not splice a cut log's new end onto the old one.
    Mutant("a read holds the log's lock while it reads LMDB",
           "storage.lmdb_reads", "LmdbReads.read",
           "                used, more, bad = self._read_stored(snap, offset, flushed, out, used, max_bytes,\n"
           "                                                    limit, full, known)",
           "                with self._lock:\n"
           "                    used, more, bad = self._read_stored(snap, offset, flushed, out, used,\n"
           "                                                        max_bytes, limit, full, known)",
           (_in_tmp(test_cold_reads
                    .test_a_read_of_flushed_batches_leaves_the_log_free_while_it_reads),)),
    Mutant("a flush far past the size limit leaves retention's next round to the timer",
           "raft.node.retention", "RetentionTask.on_flushed",
           "if now > limit + over and now - self._bytes_after_round >= over:",
           "if False:",
           (test_retention_config.test_a_flush_far_past_the_size_limit_starts_the_next_round_now,)),
    Mutant("an ended read keeps its transaction, and with it a reader slot, while alive",
           "storage.lmdb_reads", "LmdbReads._end_snapshot",
           "txn, snap.txn = snap.txn, None",
           "txn = snap.txn",
           (_in_tmp(test_cold_reads.test_a_failed_read_kept_alive_holds_no_reader_slot),)),
    Mutant("a read goes on into the new end of a log cut since its first pass",
           "storage.lmdb_reads", "LmdbReads.read",
           "if cuts is not None and cuts != self._cuts:",
           "if False:",
           (_in_tmp(test_cold_reads
                    .test_a_read_begun_before_a_suffix_cut_returns_a_prefix_of_the_old_log),)),
    Mutant("a suffix cut leaves the recent headers it cut",
           "storage.lmdb_log", "LmdbLog.truncate_suffix",
           "self._recent.cut_after(after_offset)",
           "pass",
           (_in_tmp(test_read_heads.test_the_recent_headers_follow_cuts_new_starts_and_resets),)),
    Mutant("a commit past the watermark of a leader yet to commit in its term is refused at once",
           "raft.node.api.subscribe", "_hw_reaching",
           "            await group.wait_hw_change()",
           "            return hw",
           (test_commit_waits_for_watermark
            .test_a_new_leader_is_waited_for_until_its_term_commits,)),
    Mutant("a scrub holds the log's lock while it checks",
           "storage.lmdb_damage", "LmdbDamage.scrub",
           "            used, nxt, bad = self._scrub_pass(snap, offset, flushed, max_bytes, known)",
           "            with self._lock:\n"
           "                used, nxt, bad = self._scrub_pass(snap, offset, flushed, max_bytes, known)",
           (_in_tmp(test_cold_reads.test_a_scrub_leaves_the_log_free_while_it_checks),)),
    Mutant("commit entries of an earlier term directly (no current-term rule)",
           "raft.core.leader", "LeaderSide._maybe_commit",
           "candidate <= self.log.dirty_offset and \\\n"
           "                self.log.term_at(candidate) == self.term:",
           "candidate <= self.log.dirty_offset:",
           (test_safety_rules.test_figure8_an_old_term_entry_commits_only_through_one_of_the_current_term,)),
    Mutant("a vote granted in an already-known term is not persisted",
           "raft.core.election", "Elections._handle_vote",
           "self._hs_dirty = True  # durable before the reply leaves (driver contract)",
           "pass",
           (test_safety_rules.test_a_vote_granted_in_a_known_term_survives_a_crash,)),
    Mutant("a follower's flushed offset counts without the term check",
           "raft.core.leader", "LeaderSide._note_offsets",
           "if self._matches_our_log(flushed, flushed_term):",
           "if True:",
           (test_safety_rules.test_a_stale_flushed_report_of_another_term_does_not_count,)),
    Mutant("commit on match instead of min(match, flushed)",
           "raft.core.progress", "FollowerProgress.durable_offset",
           "return min(self.match_index, self.flushed_offset)",
           "return self.match_index",
           (test_core.test_dirty_offsets_never_count_towards_commit,)),
    Mutant("the leader counts its dirty offset",
           "raft.core.leader", "LeaderSide._maybe_commit",
           "durable = {self.node_id: self._reportable_flushed()}",
           "durable = {self.node_id: self.log.dirty_offset}",
           (test_safety_rules.test_the_leader_counts_only_its_own_flushed_offset,)),
    Mutant("a follower's commit index is not bounded by its own flushed offset",
           "raft.core.follower", "FollowerSide._advance_follower_commit",
           "new = min(self._leader_commit, self._matched_upto, self.log.flushed_offset)",
           "new = min(self._leader_commit, self._matched_upto)",
           (test_core.test_follower_commit_is_bounded_by_its_own_flush,)),
    Mutant("a vote is granted without the log up-to-date check",
           "raft.core.election", "Elections._handle_vote",
           "granted = (can_vote and self._log_up_to_date(msg.last_offset, msg.last_term))",
           "granted = can_vote",
           (test_safety_rules.test_a_candidate_with_a_stale_log_gets_no_vote,)),
    Mutant("a pre-candidate bumps its own term",
           "raft.core.election", "Elections._campaign",
           "            term = self.term + 1\n",
           "            self.term += 1\n            term = self.term\n",
           (test_core.test_prevote_keeps_a_rejoining_node_from_disrupting,)),
    Mutant("a pre-vote request bumps the receiver's term",
           "raft.core.raft", "RaftCore._step",
           "                if msg.pre_vote:\n                    self._handle_pre_vote(msg)",
           "                if msg.pre_vote:\n                    self._become_follower(msg.term, None)\n"
           "                    self._handle_pre_vote(msg)",
           (test_safety_rules.test_a_pre_vote_request_changes_no_term,)),
    Mutant("a majority off by one",
           "raft.core.quorum", "majority",
           "return n_voters // 2 + 1",
           "return n_voters // 2",
           (test_core.test_dirty_offsets_never_count_towards_commit,
            test_safety_rules.test_the_leader_counts_only_its_own_flushed_offset)),
    Mutant("a follower truncates at or below its commit index",
           "raft.core.follower", "FollowerSide._truncate_suffix",
           "if after < self.commit_index:",
           "if False:",
           (test_core.test_truncating_below_commit_is_an_invariant_violation,)),
    Mutant("a follower takes appends while its log is being truncated",
           "raft.core.follower", "FollowerSide._handle_append",
           "        if self._storage_running is not None:\n            return  # the log is changing",
           "        if False:\n            return  # the log is changing",
           (test_core.test_a_truncation_is_the_drivers_work_and_the_log_waits_for_it,)),
    Mutant("a follower answers a flush while its log is being truncated",
           "raft.core.raft", "RaftCore.flushed",
           "        if self._storage_running is not None:\n            self._flushed_after_storage",
           "        if False:\n            self._flushed_after_storage",
           (functools.partial(
               test_core.test_a_flush_completing_during_a_truncation_is_answered_once_the_log_is_stored,
               True),)),
    Mutant("a follower pings while its log is being truncated",
           "raft.core.follower", "FollowerSide._ping",
           "if self._storage_running is not None:",
           "if False:",
           (test_core.test_a_ping_asked_for_during_a_truncation_is_sent_once_the_log_is_stored,)),
    Mutant("a stale success reply raises match_index",
           "raft.core.leader", "LeaderSide._handle_append_reply",
           "            if fresh:\n",
           "            if fresh or msg.last_appended > pr.match_index:\n",
           (test_safety_rules.test_a_stale_success_reply_does_not_raise_match,)),
    Mutant("a probe resent after a later heartbeat's answer keeps the old reset_seq",
           "raft.core.leader", "LeaderSide._handle_heartbeat_reply",
           "if fresh and pr.probe_sent and pr.inflight.sent_before(msg.seq):",
           "if False:",
           (functools.partial(test_probe_resets.test_a_resent_probe_is_a_reset,
                              test_probe_resets.ROWS[0]),)),
    Mutant("a follower a reply showed at the leader's tail stays recovering",
           "raft.core.leader", "LeaderSide._send_append",
           "pr.settle_recovering(log.dirty_offset, self.commit_index)",
           "pass",
           (functools.partial(
               test_recovering_flag.test_a_follower_that_matches_the_leaders_tail_is_not_recovering,
               *test_recovering_flag.row(test_recovering_flag.RESENT_CHUNK_REPLY)),)),
    Mutant("a follower lacking only uncommitted entries gets deferred-flush chunks",
           "recovery.stream", "next_chunk",
           "in_step = at_tail or (commit_index is not None and last >= commit_index)",
           "in_step = at_tail",
           (test_recovering_flag.
            test_a_follower_lacking_only_uncommitted_entries_is_replicated_in_step,)),
    Mutant("a follower lacking only uncommitted entries counts as recovering",
           "raft.core.leader", "LeaderSide._send_append",
           "pr.recovering = not chunk.in_step",
           "pr.recovering = not chunk.at_tail",
           (test_recovering_flag.
            test_a_follower_lacking_only_uncommitted_entries_is_replicated_in_step,)),
    Mutant("a heartbeat reply that shows nothing lost does not stop the ack clock",
           "raft.core.leader", "LeaderSide._heartbeat_accounts",
           "            pr.ticks_since_ack = 0\n",
           "            pass\n",
           (test_heartbeat_accounting.
            test_appends_queued_behind_other_groups_are_not_resent_while_heartbeats_answer,)),
    Mutant("a heartbeat reply does not free the window of what the follower holds",
           "raft.core.leader", "LeaderSide._heartbeat_accounts",
           "pr.acked_bytes += pr.inflight.release_upto(pr.match_index)",
           "pass",
           (test_heartbeat_accounting.
            test_heartbeat_replies_free_the_window_of_a_follower_slow_to_flush,)),
    Mutant("a node runs on after a storage fault (no fail-stop)",
           "raft.node.group", "RaftGroup.fail",
           "            self.on_fatal()\n",
           "            pass\n",
           (functools.partial(
               test_failstop.test_a_storage_fault_stops_the_node_and_a_restart_recovers,
               op="flush"),)),
    Mutant("a node runs on after a fault while the runtime steps its core",
           "raft.node.group", "RaftGroup.deliver",
           "                self.fail(e, \"step\")\n                return\n",
           "                continue\n",
           (functools.partial(
               test_failstop.test_a_fault_while_the_runtime_steps_the_core_stops_the_node,
               fault="step"),)),
    Mutant("a node runs on after the storage work its core asked for failed",
           "raft.node.group", "RaftGroup._run_storage",
           "            self.fail(e, f\"storage {work.op.value}\")\n            raise\n",
           "            pass\n",
           (functools.partial(
               test_failstop.test_a_fault_while_the_runtime_steps_the_core_stops_the_node,
               fault="storage work"),)),
    Mutant("a learner is promoted during a leadership transfer",
           "raft.core.confchange", "ConfChanges._maybe_promote",
           " or lead.transfer_target is not None\n",
           "\n",
           (test_safety_rules.test_no_promotion_is_appended_during_a_leadership_transfer,)),
    Mutant("a leader changes membership before committing an entry of its term",
           "raft.core.confchange", "ConfChanges._config_change_blocked",
           "if self.commit_index < lead.noop_offset:",
           "if False:",
           (test_membership_safety
            .test_a_leader_makes_no_membership_change_before_committing_in_its_term,)),
    # Cluster identity (raft/node/identity.py): the runtime's connect-time rule.
    Mutant("a node accepts a peer of another cluster",
           "raft.node.identity", "ClusterIdentity.heard",
           "            if firm and cid != self.cluster_id:",
           "            if False:",
           (test_cluster_identity.test_a_node_refuses_a_peer_hello_of_another_cluster,
            test_cluster_identity.test_firm_ids_that_differ_refuse_each_other_naming_both)),
    # Disk loss and corruption (raft/core/incarnation.py, raft/core/repair.py).
    Mutant("a node that lost its disk votes before it is re-added",
           "raft.core.election", "Elections._handle_vote",
           "        if not self.may_vote():\n            # It forgot",
           "        if False:\n            # It forgot",
           (test_disk_loss_rules.test_a_node_that_lost_its_disk_does_not_vote,)),
    Mutant("a voter that forgot counts toward a commit before it is re-added",
           "raft.core.incarnation", "Incarnations._screen_reply",
           "            return False  # not re-added yet, or an older incarnation",
           "            return True",
           (test_disk_loss_rules
            .test_a_voter_that_forgot_does_not_count_while_a_change_blocks_its_re_add,)),
    Mutant("a reply from an incarnation the configuration does not know counts",
           "raft.core.incarnation", "Incarnations._screen_reply",
           "            return False  # not the member the configuration knows",
           "            return True",
           (test_disk_loss_rules.test_a_reply_from_another_incarnation_is_ignored,)),
    Mutant("a node counts and reports its flushed offset past damage",
           "raft.core.repair", "Repairs._reportable_flushed",
           "return flushed if first is None else min(flushed, first - 1)",
           "return flushed",
           (test_disk_loss_rules
            .test_a_leader_does_not_count_its_own_damaged_batch_and_hands_over,)),
    Mutant("a leader gives up committed data nobody else holds (steps down) instead of stopping",
           "raft.core.repair", "Repairs._leader_damaged",
           "if d.first > self.commit_index:",
           "if True:",
           (test_disk_loss_rules.test_committed_data_nobody_holds_stops_the_leader_loudly,)),
    Mutant("a node that lost flushed batches votes as if it never held them",
           "raft.core.election", "Elections._log_up_to_date",
           "if lost is not None and",
           "if False and",
           (test_disk_loss_rules
            .test_a_node_that_lost_flushed_batches_votes_as_the_log_it_held,)),
    Mutant("a node that lost flushed entries campaigns before it has them again",
           "raft.core.election", "Elections._may_campaign",
           "return self.may_vote() and (lost is None or",
           "return self.may_vote() and (True or",
           (test_disk_loss_rules
            .test_a_node_that_lost_flushed_entries_does_not_lead_before_it_has_them_again,)),
    Mutant("a producer table that could not read a damaged batch takes a retry of it as new",
           "raft.core.producers", "ProducerTable.lookup",
           "if self._unread:",
           "if False:",
           (test_disk_loss_rules
            .test_a_leader_whose_producer_table_missed_a_damaged_batch_does_not_take_its_retry_as_new,)),
    Mutant("committed data is declared lost before every voter answered without a good copy",
           "raft.core.repair", "Repairs._leader_damaged",
           "waiting = self._damage_waiting_for()",
           "waiting = []",
           (test_disk_loss_rules
            .test_committed_data_is_not_declared_lost_while_a_voter_that_may_hold_it_is_down,)),
    # -- subscriptions (raft/core/subscription_table.py, raft/core/subscription_batcher.py) ---
    Mutant("retention deletes what a subscription has not read, although told to respect it",
           "raft.node.subscription_service", "SubscriptionService.retention_holds",
           "holds.extend((holder, offset, True) for holder, offset in chosen)",
           "pass",
           (test_subscriptions_inproc
            .test_retention_keeps_what_the_lowest_subscription_still_needs,)),
    Mutant("a follower drops its damaged prefix with a state made for another start",
           "raft.core.repair", "Repairs._drop_damaged_prefix",
           "if state.start_offset != prev + 1 or state.states[TERM][0] != msg.prev_term:",
           "if False:",
           (test_state_transfer
            .test_damage_below_the_leaders_log_start_is_dropped_with_the_prefix_and_the_state_there,)),
    Mutant("a subscription commit below the position is accepted",
           "raft.core.subscription_table", "SubscriptionTable._commit",
           "if op.position < sub.position:",
           "if False:",
           (test_subscriptions.test_open_creates_once_then_commits_move_forward_only,)),
    Mutant("a read done elsewhere applies past the commit index it began at",
           "raft.core.subscription_index", "SubscriptionIndex.apply_read",
           "done, _, _ = self._apply(batches, read.commit_index, on_applied, mine)",
           "done, _, _ = self._apply(batches, self.log.dirty_offset, on_applied, mine)",
           (test_subscriptions.test_a_read_applies_only_what_was_committed_when_it_began,)),
    Mutant("a subscription commit past the log is accepted",
           "raft.core.subscription_table", "SubscriptionTable._commit",
           "if op.position > offset:",
           "if False:",
           (test_subscriptions.test_open_creates_once_then_commits_move_forward_only,)),
    Mutant("another consumer's unexpired lease is ignored",
           "raft.core.subscription_table", "SubscriptionTable._lease_conflict",
           "if sub.leased_to_other(consumer, self.clock_ms):",
           "if False:",
           (test_subscriptions.test_a_lease_refuses_other_consumers_until_it_expires_by_entry_stamps,)),
    Mutant("the table's clock follows each entry's stamp, even backwards",
           "raft.core.subscription_table", "SubscriptionTable.apply",
           "self.clock_ms = max(self.clock_ms, batch.timestamp_ms)",
           "self.clock_ms = batch.timestamp_ms",
           (test_subscriptions.test_a_new_leader_with_a_clock_behind_cannot_revive_an_expired_lease,)),
    Mutant("a reset forward does not record the offsets it skipped",
           "raft.core.subscription_table", "SubscriptionTable._reset",
           "sub.skipped_offsets += max(0, op.position - sub.position)",
           "pass",
           (test_subscriptions.test_a_reset_forward_records_the_offsets_it_skipped_and_back_does_not,)),
    Mutant("a reset back counts as skipping",
           "raft.core.subscription_table", "SubscriptionTable._reset",
           "max(0, op.position - sub.position)",
           "abs(op.position - sub.position)",
           (test_subscriptions.test_a_reset_forward_records_the_offsets_it_skipped_and_back_does_not,)),
    Mutant("a consumer's conditional reset applies although the subscription moved",
           "raft.core.subscription_table", "SubscriptionTable._reset",
           "if op.expect >= 0 and sub.position != op.expect:",
           "if False:",
           (test_subscriptions.test_a_conditional_reset_applies_only_at_the_position_it_saw,)),
    Mutant("an open's reset policy is not stored",
           "raft.core.subscription_table", "SubscriptionTable._open",
           "sub.auto_reset = op.auto_reset",
           "pass",
           (test_subscriptions.test_an_open_that_names_a_reset_policy_stores_it,)),
    Mutant("an expiry delete removes a subscription used since",
           "raft.core.subscription_table", "SubscriptionTable._delete",
           "if op.arg >= 0 and sub.last_used_ms != op.arg:",
           "if False:",
           (test_subscriptions.test_expiry_spares_used_and_leased_subscriptions,)),
    Mutant("expiry picks a leased subscription",
           "raft.core.subscription_table", "SubscriptionTable.expired",
           "\n                      and not (s.lease_holder and now < s.lease_until_ms)",
           "",
           (test_subscriptions.test_expiry_spares_used_and_leased_subscriptions,)),
    Mutant("a pin moves before a commit reaches it",
           "raft.core.subscription_table", "SubscriptionTable._pin",
           "if sub.pin_end <= sub.position:",
           "if True:",
           (test_subscriptions.test_a_pin_holds_until_a_commit_reaches_it,)),
    Mutant("the subscription table applies batches out of order",
           "raft.core.subscription_table", "SubscriptionTable.apply",
           "if batch.base_offset != self.applied + 1:",
           "if False:",
           (test_subscriptions.test_entries_apply_in_order_and_foreign_control_is_ignored,)),
    # -- subscriptions over a topic (raft/core/subscription_members.py) ------------------------
    Mutant("a member never releases the partitions above its quota",
           "raft.core.subscription_members", "plan",
           "keep, release = mine[:quota], mine[quota:]",
           "keep, release = mine, []",
           (test_topic_subscriptions_inproc
            .test_members_share_a_topic_rebalance_and_fence_a_member_that_stops,
            test_subscriptions.test_member_rounds_share_a_topic_fairly_and_stickily)),
    Mutant("a member's take ignores another member's running lease",
           "raft.core.subscription_table", "SubscriptionTable._member",
           "if op.member == Member.TAKE and not sub.leased_to_other(op.consumer, self.clock_ms):",
           "if op.member == Member.TAKE:",
           (test_subscriptions.test_members_watch_take_and_leave_a_partition_by_entry_stamps,)),
    Mutant("a member that stopped renewing still counts as a member",
           "raft.core.subscription_table", "SubscriptionTable._member",
           "sub.members[op.consumer] = self.clock_ms + min(op.arg, MAX_LEASE_MS)",
           "sub.members[op.consumer] = 2 ** 62",
           (test_subscriptions.test_members_watch_take_and_leave_a_partition_by_entry_stamps,)),
    Mutant("the accumulator folds a commit into a slot with a later position",
           "raft.core.subscription_batcher", "CommitBatcher.add",
           "if i is not None and self._slots[i].op.position <= op.position:",
           "if i is not None:",
           (test_subscriptions.test_batcher_coalesces_a_consumers_commits_and_bounds_everything,)),
    # The wire protocol (raft/protocol/).
    Mutant("true passes as protocol version 1 (Python's True == 1)",
           "raft.protocol.framing", "decode_body",
           "if type(v) is not int or v != PROTOCOL_VERSION:",
           "if v != PROTOCOL_VERSION:",
           (test_protocol_types.test_true_is_not_protocol_version_1,)),
    Mutant("a follower answers a malformed load request's field error, not NOT_LEADER",
           "raft.node.load_service", "LoadService.handle",
           "        if not host.is_leader():\n            return host.refuse_not_leader()\n"
           "        if isinstance(req, LoadRefused):\n            return ErrorReply(req.code, "
           "req.message)\n",
           "        if isinstance(req, LoadRefused):\n            return ErrorReply(req.code, "
           "req.message)\n        if not host.is_leader():\n            return "
           "host.refuse_not_leader()\n",
           (test_load_service.test_the_leader_check_comes_before_the_field_checks,)),
    # Security (raft/node/auth.py, raft/node/tls.py, raft/node/gate.py, raft/node/server.py).
    Mutant("a peer's hello is accepted with another node's certificate",
           "raft.node.gate", "Gate.check_peer",
           "if identity is None or identity.node_id != claimed:",
           "if identity is None:",
           (test_security_unit.test_a_peer_hello_must_match_its_certificate,)),
    Mutant("a dialled peer may present another node's certificate",
           "raft.node.tls", "NodeTLS.check_peer",
           "if ident is None or ident.node_id != expected:",
           "if ident is None:",
           (test_security_unit.test_a_dialled_peer_must_present_the_expected_node_id,)),
    Mutant("any authenticated principal may send any request",
           "raft.node.auth", "Authenticator.authorize",
           "if principal is not None and needed in principal.permissions:",
           "if principal is not None:",
           (test_security_unit.test_permissions_per_principal_and_request_type,)),
    Mutant("request types missing from the permission table are open to all",
           "raft.node.auth", "Authenticator.authorize",
           "needed = required_permission(request_type)",
           "needed = REQUIRED.get(request_type)",
           (test_security_unit.test_permissions_per_principal_and_request_type,)),
    Mutant("a revoked token keeps working on an open connection",
           "raft.node.auth", "Authenticator.authorize",
           'if session.method == "token" and table.by_digest.get(session.digest or "") != name:',
           "if False:",
           (test_security_unit.test_a_revoked_token_stops_working_on_an_open_connection,)),
    Mutant("an unknown token authenticates",
           "raft.node.auth", "Authenticator.authenticate",
           "            if name is None:\n",
           "            if False:\n",
           (test_security_unit.test_an_unknown_token_is_refused,)),
    Mutant("requests are dispatched without the permission check",
           "raft.node.client_requests", "ClientRequests._route",
           "refusal = conn.auth.authorize(conn.session, t) if conn.auth.enabled else None",
           "refusal = None",
           (test_security_unit
            .test_a_node_refuses_a_revoked_tokens_next_request_on_its_open_connection,)),
    # -- what a node appends for a client -------------------------------------------------------
    Mutant("a payload holding other than `count` records is appended",
           "storage.records", "check_records",
           "if count is not None and n != count:",
           "if False:",
           (test_malformed_records.test_a_malformed_produce_is_refused_and_nothing_is_appended,)),
    Mutant("a payload with bytes after its records is appended",
           "storage.records", "check_records",
           "    if i != size:\n",
           "    if False:\n",
           (test_malformed_records.test_a_malformed_produce_is_refused_and_nothing_is_appended,)),
    Mutant("the record rule's fast path accepts records of 2 or 4 items",
           "storage.records", "_plainly_valid",
           "zip(*items, strict=True)",
           "zip(*items)",
           (test_records.test_the_fast_path_accepts_no_near_miss,)),
    Mutant("the record rule's fast path accepts values that are no bin",
           "storage.records", "_plainly_valid",
           "if set(map(type, values)) != _BYTES:",
           "if False:",
           (test_records.test_the_fast_path_accepts_no_near_miss,)),
    Mutant("the record rule's uniform path checks the first record's layout only",
           "storage.records", "_uniform",
           "if column.count(p[i0 + m]) != n:",
           "if False:",
           (functools.partial(test_records.test_the_uniform_path_accepts_no_near_miss,
                              *test_records.UNIFORM_NEAR_MISSES[0]),)),
    Mutant("the record rule's uniform path does not compare the value's bin header",
           "storage.records", "_uniform",
           "marks.extend(range(j - i0, j - i0 + head))",
           "pass",
           (functools.partial(test_records.test_the_uniform_path_accepts_no_near_miss,
                              *test_records.UNIFORM_NEAR_MISSES[0]),)),
    # -- retention and state transfer ---------------------------------------------------------
    Mutant("retention is not bounded by the commit index",
           "raft.core.retention", "core_holds",
           'holds = [Hold("commit index", status.commit_index, False),\n'
           '             Hold("flushed offset", status.flushed_offset + 1, False)]',
           'holds = [Hold("flushed offset", status.flushed_offset + 1, False)]',
           (test_retention.test_retention_never_passes_the_commit_index,
            test_retention.test_a_follower_never_deletes_past_its_commit_index)),
    Mutant("retention deletes the newest committed batch (the commit index holds from one "
           "past itself)",
           "raft.core.retention", "core_holds",
           'Hold("commit index", status.commit_index, False)',
           'Hold("commit index", status.commit_index + 1, False)',
           (test_retention.test_time_retention_keeps_the_newest_committed_batch,
            test_retention.test_retention_never_passes_the_commit_index)),
    Mutant("size retention deletes while the log is over the limit (and overshoots below it)",
           "raft.core.retention", "Planner._keep_reason",
           "self._remaining - b.size >= p.max_bytes",
           "self._remaining > p.max_bytes",
           (test_retention.test_size_retention_keeps_at_least_the_limit_in_whole_batches,)),
    Mutant("the leader deletes what a member matched but has not flushed",
           "raft.core.retention", "core_holds",
           "min(f.match_index, f.flushed_offset) + 1, True))",
           "f.match_index + 1, True))",
           (test_retention.test_the_leader_keeps_what_a_member_has_not_flushed,)),
    Mutant("a valve releases a hold no valve may release (commit index, open load)",
           "raft.core.retention", "Planner._keep_reason",
           "if not h.valve or valve is None:",
           "if valve is None:",
           (test_retention.test_an_open_load_holds_its_staged_data,)),
    Mutant("an open Spark load does not hold its staged data",
           "raft.core.retention", "load_holds",
           '        holds.append(Hold(f"load {lid!r}", gen, False))',
           "        pass",
           (test_retention.test_an_open_load_holds_its_staged_data,)),
    Mutant("a follower resets to the leader's start without storing the state with it",
           "raft.core.follower", "FollowerSide._state_transfer",
           "StorageWork.reset(prev + 1, msg.prev_term, msg.snapshot)",
           "StorageWork.reset(prev + 1, msg.prev_term)",
           (test_state_transfer.test_the_state_survives_a_crash_right_after_the_reset,)),
    Mutant("a follower accepts batches after a reset without taking the state there",
           "raft.core.follower", "FollowerSide._after_reset",
           "        if state is not None:\n            self._restore_start_state(state)",
           "        if False:\n            self._restore_start_state(state)",
           (test_state_transfer.test_a_follower_behind_the_log_start_gets_the_state_there,)),
    Mutant("a follower takes a state for another start",
           "raft.core.follower", "FollowerSide._state_transfer",
           "if state.start_offset != prev + 1 or state.states[TERM][0] != msg.prev_term:",
           "if False:",
           (test_state_transfer.test_a_malformed_state_is_rejected_not_applied,)),
    Mutant("a restarted node votes with a configuration older than its log start",
           "raft.core.confchange", "ConfChanges._load_configs",
           "at_start = stored_config(self.log.snapshot)",
           "at_start = None",
           (test_state_transfer.test_the_state_survives_a_crash_right_after_the_reset,)),
    Mutant("a restarted leader forgets the producers of its retained-away prefix",
           "raft.core.raft", "RaftCore.__init__",
           "        if raw is not None:\n            self.producers.load(raw)",
           "        if False:\n            self.producers.load(raw)",
           (test_state_transfer.test_the_leader_keeps_its_producer_table_across_retention_and_a_restart,)),
    Mutant("a produce without a producer id is resent after an answer that may follow its append",
           "raft.protocol.errors", "may_retry",
           "return code in RETRYABLE and (idempotent or code in NOT_WRITTEN)",
           "return code in RETRYABLE",
           (test_protocol_types.test_one_retry_rule_for_every_client,)),
    Mutant("a produce without a producer id is resent after its connection was lost once written",
           "raft.protocol.errors", "may_retry_lost_connection",
           "return idempotent or not written",
           "return True",
           (test_protocol_types.test_one_retry_rule_for_every_client,)),
    Mutant("a client writes a request into an idle connection the node has hung up on",
           "raft.client.connection", "_Connection.peer_closed",
           "return bool(poller.poll(0))",
           "return False",
           (test_client_retry.test_first_contact_fails_at_once_but_a_client_that_reached_a_node_waits_for_it,)),
    Mutant("a client that has reached the cluster gives up at once while every node restarts",
           "raft.client.client", "Client.call",
           "and (not self.reached or server is not None)",
           "and True",
           (test_client_retry.test_first_contact_fails_at_once_but_a_client_that_reached_a_node_waits_for_it,)),
    # Many groups per node (raft/protocol/raft_frames.py, raft/node/peer.py, raft/node/registry.py,
    # raft/node/server.py): the group id in each message's envelope routes it, and one group's
    # stream rules never reach another group's messages on the shared link.
    Mutant("a peer message's group id is ignored when decoding (everything is group 0)",
           "raft.protocol.raft_frames", "group_message_from_wire",
           "    group = obj.get(GROUP_KEY, 0)\n",
           "    group = 0\n",
           (test_group_wire.test_group_ids_round_trip_through_both_encoders_in_order,)),
    Mutant("a restarted stream withdraws the queued appends of every group on the link",
           "raft.node.peer", "PeerLink.withdraw",
           "kept = deque(item for item in self._bulk if item[3] is not sender)",
           "kept = deque(item for item in self._bulk if False)",
           (test_group_wire.test_a_restarted_stream_withdraws_only_its_own_groups_appends,)),
    Mutant("peer messages of any group are delivered to group 0",
           "raft.node.registry", "GroupRegistry.deliver_frame",
           "            entry = self._entries.get(group_id)\n",
           "            entry = self._entries.get(0)\n",
           (test_group_wire
            .test_a_frame_is_routed_to_each_group_in_order_and_unknown_groups_are_counted,)),
    Mutant("a client request for a group the node does not run is served by the default topic",
           "raft.node.client_requests", "ClientRequests._route",
           "        ctx = self._node.registry.api(group_id)\n",
           "        ctx = self._node.registry.api(1)  # the default topic's group\n",
           (test_multigroup_inproc
            .test_a_request_for_a_group_the_node_does_not_run_names_the_groups_it_runs,)),
    # The client hub (raft/node/client_hub.py): a connection over its in-flight budget is not
    # read on; a hang-up reported with the last bytes is read to its EOF (no edge follows it).
    Mutant("the client hub reads a connection over its in-flight budget",
           "raft.node.client_hub", "ClientHub._serve",
           "if conn.budget <= 0:",
           "if False:",
           (test_client_hub
            .test_a_connection_over_its_budget_is_not_read_and_does_not_block_others,)),
    Mutant("the client hub drops a hang-up that came with the last bytes",
           "raft.node.client_hub", "ClientHub._poll",
           "if events & _HANGUP:",
           "if False:",
           (test_client_hub.test_bad_frames_and_eof_end_only_their_connection,)),
    # The partition-aware client (raft/client/producer.py, raft/client/client.py): a key's
    # records go to the partition Kafka's murmur2 names, all of them; sequences are counted per
    # partition; a NOT_LEADER that names no leader refreshes the metadata.
    Mutant("a producer hashes keys with another function than Kafka's murmur2",
           "raft.client.producer", "Producer.partition_for",
           "return self._partitioner.partition(record.key)",
           "return self._partitioner.partition(None) if record.key is None "
           "else sum(record.key) % self.partitions",
           (test_client_topics
            .test_keyed_records_land_in_their_keys_partition_in_the_order_produced,)),
    Mutant("a producer spreads a key's records across partitions (sticky, as if keyless)",
           "raft.client.producer", "Producer.partition_for",
           "return self._partitioner.partition(record.key)",
           "return self._partitioner.partition(None)",
           (test_client_topics
            .test_keyed_records_land_in_their_keys_partition_in_the_order_produced,)),
    Mutant("a producer numbers its batches across partitions, not per partition",
           "raft.client.producer", "Producer._send_batch",
           "        seq = lane.sequence\n",
           "        seq = sum(other.sequence for other in self._lanes.values())\n",
           (test_client_topics
            .test_idempotent_sequences_are_per_partition_and_a_retry_is_written_once,)),
    Mutant("a NOT_LEADER naming no leader does not refresh the metadata",
           "raft.client.client", "Client.call",
           "await self.refresh_metadata(deadline)  # who leads it now?",
           "pass",
           (test_client_topics
            .test_not_leader_without_a_hint_refreshes_the_metadata_and_finds_the_leader,)),
    Mutant("a forced new cluster writes its configuration in a term it already knows",
           "raft.core.force_new", "plan_force_new_cluster",
           "term = max(facts.term, facts.last_term, lost_term) + 1",
           "term = max(facts.term, facts.last_term, lost_term)",
           (test_force_new_cluster.test_forcing_a_new_cluster_from_a_survivor_elects_it_and_the_others_rejoin,
            test_force_new_cluster.test_the_forced_entry_outranks_every_term_the_node_knows)),
    Mutant("a forced new cluster keeps its damaged batch (which nobody can repair) in its log",
           "raft.core.force_new", "plan_force_new_cluster",
           "keep = facts.first_damaged - 1",
           "keep = keep",
           (test_force_new_cluster.test_a_damaged_batch_and_what_follows_it_are_dropped_loudly,)),
    # Quiescence (raft/core/quiesce.py): liveness rules, killed by scripted scenarios.
    Mutant("a quiesced follower never wakes when its leader's node is reported down",
           "raft.core.quiesce", "Quiescence.peer_down",
           "            elif node_id == self.leader_id:",
           "            elif False:",
           (test_quiesce.test_a_follower_whose_leaders_node_is_down_elects_a_new_leader,)),
    Mutant("a leader quiesces with a lagging follower",
           "raft.core.quiesce", "Quiescence._follower_not_quiet",
           "if pr.match_index != last or pr.flushed_offset != last:",
           "if False:",
           (functools.partial(test_quiesce.test_each_condition_alone_keeps_the_leader_awake,
                              *test_quiesce.CONDITIONS[0]),)),
    Mutant("a follower keeps its lease for a leader reported down",
           "raft.core.election", "Elections._in_lease",
           "\n                and self.leader_id not in self._peers_down)",
           ")",
           (test_quiesce.test_a_follower_whose_leader_is_reported_down_grants_a_pre_vote,)),
    Mutant("a leader goes quiet before every live follower answered quiesced",
           "raft.core.quiesce", "Quiescence._maybe_quiesced",
           "        if any(p not in lead.quiesce_acked and p not in self._peers_down\n"
           "               for p in lead.progress):\n            return\n",
           "",
           (test_quiesce.test_a_follower_that_never_answers_quiesced_keeps_its_leader_heartbeating,)),
    Mutant("a quiet leader that lost its majority stays quiet",
           "raft.core.quiesce", "Quiescence.peer_down",
           "                if not self._live_quorum():",
           "                if False:",
           (test_quiesce.test_a_quiet_leader_that_lost_its_majority_wakes_and_steps_down,)),
    # A node that restarted faster than the failure detector noticed (tests/raft/test_quiet_rejoin.py).
    Mutant("a quiesced group ignores the bootstrap probe of a member that lost its disk",
           "raft.core.quiesce", "Quiescence._announces_itself",
           "            return not self._is_fresh()",
           "            return False",
           (test_quiet_rejoin.test_a_wiped_followers_probe_wakes_its_quiet_leader_which_re_adds_it,)),
    Mutant("a node that may not campaign and knows no leader stays silent",
           "raft.core.raft", "RaftCore._tick_follower",
           "            self._announce()",
           "            pass",
           (functools.partial(
               test_quiet_rejoin.test_a_node_that_lost_flushed_entries_and_restarted_unseen_is_caught_up,
               "follower"),)),
    Mutant("a quiesced follower ignores a lower term's ping from a member",
           "raft.core.quiesce", "Quiescence._announces_itself",
           "msg.seq == 0 and msg.term < self.term",
           "False",
           (functools.partial(test_quiet_rejoin.test_what_a_node_that_restarted_unseen_sends_wakes_a_quiet_core,
                              *test_quiet_rejoin.CASES[3]),)),
    Mutant("a link is created with some of its mirror topics when another name is taken",
           "raft.controller.links_apply", "LinkApply._create_link",
           "            if m.name in self.topics:",
           "            if False:",
           (test_links_controller.test_a_refused_link_creates_none_of_its_topics,)),
    Mutant("a bootstrap moves past the source's gap without recording it",
           "raft.node.links.puller", "Puller._out_of_range",
           "await self.report_gap(self.spec, pos, int(start) - 1)",
           "pass",
           (test_link_puller.test_a_bootstrap_records_the_gap_before_going_past_it,)),
    Mutant("a log's last term is looked up for a dirty offset read outside its lock",
           "storage.lmdb_log", "LmdbLog.last_term",
           "        with self._lock:  # reading dirty_offset and looking up its term (a fail-stop, bench produce)\n            return self._last_term_locked()",
           "        return self.term_at(self.dirty_offset)",
           (_in_tmp(test_lmdb_edges
                    .test_the_last_term_is_read_with_its_dirty_offset_across_a_truncation),)),
    Mutant("a link bootstraps on a follower's log start while the source's leader holds the position",
           "raft.node.links.puller", "Puller._out_of_range",
           "                start = await self._leaders_start(pos)",
           "                pass",
           (test_link_puller
            .test_a_followers_further_cut_is_no_gap_while_the_leader_holds_the_position,)),
    Mutant("a puller appends a reply fetched ahead after an append that did not continue it",
           "raft.node.links.puller", "Puller._pull_from",
           "break  # the fetcher's continuation is not where the mirror goes on",
           "pass",
           (test_link_puller.test_a_resync_drops_the_reply_fetched_ahead,)),
    Mutant("a puller appends after a source batch that differs from the mirror's last one",
           "raft.node.links.puller", "Puller._check_anchor",
           "        if theirs == ours:",
           "        if True:",
           (test_link_anchor.test_a_source_recreated_past_the_mirrors_end_is_diverged_and_never_copied,)),
    Mutant("a puller does not check the source's history again after a failure",
           "raft.node.links.puller", "Puller.run",
           "                self._anchored = False  # check the source's history again",
           "                pass  # check the source's history again",
           (test_link_anchor.test_a_source_recreated_while_the_puller_runs_is_caught_before_an_append,)),
    Mutant("a puller's fetch is served by whatever incarnation of the source topic exists",
           "raft.node.links.puller", "Puller._fetch_ahead",
           "LONG_POLL_MS, group=self._source_group,",
           "LONG_POLL_MS, group=None,",
           (test_link_anchor.test_a_source_recreated_between_two_fetches_is_caught_before_an_append,)),
    Mutant("a link reports the source offsets it saw hold no data as its position",
           "raft.node.links.puller", "Puller._report_position",
           "position = visible_hw(self.group) + 1",
           "position = max(visible_hw(self.group), self.seen_to) + 1",
           (test_link_anchor.test_the_reported_position_is_the_mirrors_committed_end_not_the_offsets_seen,)),
    Mutant("a restore deletes a topic that still holds records to recreate it from the mirror",
           "raft.cli.link_restore", "_leftover_refusal",
           "    if where is None:",
           "    if True:",
           (test_link_restore.test_restore_refuses_records_replaces_an_empty_leftover_and_the_survivor_follows,)),
    Mutant("a node certificate authenticates any request, not only node-internal ones",
           "raft.node.auth", "Authenticator.authorize",
           "if request_type in NODE_REQUESTS:",
           "if True:",
           (test_link_gap_secured.test_a_node_certificate_authenticates_node_internal_requests_only,)),
    Mutant("a node certificate naming a node id outside this cluster opens a node session",
           "raft.node.auth", "Authenticator.authorize",
           "if members is not None and session.node_id not in members:",
           "if False:",
           (test_link_gap_secured.test_a_node_certificate_of_a_node_not_in_this_cluster_is_refused,)),
    Mutant("a gap report from a node not leading the controller carries no credential",
           "raft.node.links.manager", "LinkManager._own_client",
           "if cfg.tls_cert is None:",
           "if True:",
           (test_link_gap_secured
            .test_a_gap_report_from_a_node_not_leading_the_controller_is_recorded_on_a_secured_sink,)),
    Mutant("a new leader of a mirror partition waits for the manager's next scan to pull",
           "raft.node.links.manager", "LinkManager.group_state_changed",
           "if group_id in self._mirror_groups:",
           "if False:",
           (test_link_manager.test_a_new_leader_of_a_mirror_partition_pulls_at_once_on_the_virtual_clock,)),
    Mutant("the link manager looks every SCAN_S with nothing to retry (idle nodes pay for it)",
           "raft.node.links.manager", "LinkManager.run",
           "SCAN_S if self._retry else math.inf",
           "SCAN_S",
           (test_link_manager.test_the_manager_sleeps_until_an_event_and_retries_only_what_failed,)),
    Mutant("a link whose source client could not be made is not looked at again",
           "raft.node.links.manager", "LinkManager.reconcile_once",
           "self._retry = True",
           "pass",
           (test_link_manager.test_the_manager_sleeps_until_an_event_and_retries_only_what_failed,)),
    Mutant("every group's leadership change wakes the link manager (not only a mirror's)",
           "raft.node.links.manager", "LinkManager.group_state_changed",
           "if group_id in self._mirror_groups:",
           "if True:",
           (test_link_manager.test_a_new_leader_of_a_mirror_partition_pulls_at_once_on_the_virtual_clock,)),
    Mutant("the registry does not pass a group's state change on",
           "raft.node.registry", "GroupRegistry.add",
           "group.on_state_change = lambda: self._state_changed(group_id)",
           "pass",
           (test_link_manager.test_the_registry_passes_a_groups_state_change_on_with_its_id,)),
    Mutant("a promoted mirror keeps following its old source's partition count",
           "raft.node.links.grow", "feeds",
           "if origin is None or not topic.mirror_active:",
           "if origin is None:",
           (test_link_manager.test_a_promoted_mirror_does_not_follow_its_old_source,)),
    Mutant("a paused link's mirror grows with its source",
           "raft.node.links.grow", "feeds",
           "link.state is LinkState.ACTIVE",
           "True",
           (test_link_manager.test_a_paused_links_mirror_does_not_grow,)),
    Mutant("a mirror does not follow its source topic's growth",
           "raft.node.links.grow", "MirrorGrower.check_once",
           "for name, partitions in grows(runtime.metadata, counts):",
           "for name, partitions in []:",
           (test_links_inproc.test_a_mirror_grows_when_its_source_topic_grows,)),
    Mutant("a link pulls a mirror topic another link (of the same name) created",
           "raft.node.links.manager", "_feeds",
           "link.topics.get(origin.source_topic) == topic",
           "True",
           (test_link_manager.test_a_new_link_of_the_same_name_does_not_inherit_the_old_mirror_same_source,)),
    Mutant("a link's position does not hold the source's retention",
           "raft.node.subscription_service", "SubscriptionService.retention_holds",
           "chosen = [(h, o) for h, o in chosen if h.startswith(LINK_HOLDER)]",
           "chosen = []",
           (test_links_inproc.test_a_paused_link_holds_the_sources_retention_and_resumes_without_a_gap,)),
    Mutant("a replicated subscription is set ahead of what the mirror holds (a skip on failover)",
           "raft.node.links.subscriptions", "planned",
           "position = min(int(row[\"position\"]), cap)",
           "position = int(row[\"position\"])",
           (test_link_puller.test_replicated_subscriptions_never_ahead_of_the_mirror,)),
    Mutant("an active mirror takes client writes",
           "raft.node.links.manager", "LinkManager.wanted",
           "refusal = read_only_message(topic.name, origin) if topic.mirror_active else None",
           "refusal = None",
           (test_link_manager.test_a_promoted_topic_clears_the_refusal_set_before,)),
    Mutant("the controller reuses a deleted topic's group ids",
           "raft.controller.state", "ClusterMetadata._allocate_group",
           "gid = self.next_group_id",
           "gid = max(self.groups, default=0) + 1",
           (test_controller_state.test_group_ids_are_never_reused_after_a_delete,)),
    Mutant("a group id the node's metadata has not allocated yet counts as deleted",
           "raft.controller.state", "ClusterMetadata.is_deleted",
           "FIRST_DATA_GROUP <= group < self.next_group_id and ",
           "FIRST_DATA_GROUP <= group and ",
           (test_controller_state.test_reconcile_starts_stops_and_deletes_only_what_the_metadata_says,)),
    Mutant("placement ignores the replicas nodes already hold",
           "raft.controller.placement", "current_load",
           "                replicas[n] += 1",
           "                pass",
           (test_placement.test_placement_counts_the_replicas_nodes_already_hold,)),
    Mutant("a partition is placed on a shard one of its replicas does not run",
           "raft.controller.state", "ClusterMetadata._shard_error",
           "if n in self.nodes and self.nodes[n].shards <= shard]",
           "if False]",
           (test_shards.test_a_shard_beyond_a_replicas_count_is_refused,)),
    Mutant("a reconciler starts the partitions of every shard in each shard process",
           "raft.controller.state", "ClusterMetadata.groups_of",
           "and (shard is None or p.shard == shard)}",
           "}",
           (test_shards.test_a_shard_process_reconciles_only_its_own_partitions,)),
    Mutant("the per-shard admission limit is not enforced",
           "raft.controller.placement", "place_shards",
           "load.replicas.get((n, s), 0) < shard_limit",
           "True",
           (test_shards.test_the_per_shard_admission_limit_refuses_a_full_node,)),
    Mutant("the rebalance planner moves replicas without bound",
           "raft.controller.rebalance", "plan_rebalance",
           "while len(moves) < max_moves:",
           "while True:",
           (test_placement.test_the_rebalance_plan_is_bounded,)),
    Mutant("the rebalance planner transfers leadership without bound",
           "raft.controller.rebalance", "_transfers",
           "if len(out) >= limit:",
           "if False:",
           (test_placement.test_the_rebalance_plan_is_bounded,
            test_placement.test_a_returning_node_gets_leadership_back_a_few_at_a_time)),
    Mutant("the node's reconciler never drops a deleted topic's data",
           "raft.node.reconciler", "Reconciler.reconcile_once",
           "await self._io(host.store.drop_log, group_id)",
           "pass",
           (test_reconciler.test_the_reconciler_starts_stops_and_drops_what_the_metadata_says,)),
    Mutant("the reconciler stops (and drops) a moved-away replica the group's configuration "
           "still names",
           "raft.node.reconciler", "Reconciler.reconcile_once",
           "if host.still_named(group_id):",
           "if False:",
           (test_replica_moves_inproc
            .test_a_partition_moves_to_a_new_node_while_a_producer_writes,)),
    Mutant("a partition's leader adds a moved-in replica as a voter, not a learner",
           "raft.node.replica_moves", "ReplicaMover._act",
           "core.propose_config(INTERNAL_REQUEST, add_learner=n, address=address)",
           "core._propose_config(INTERNAL_REQUEST, type(core.config)(tuple(sorted("
           "core.config.voters + (n,))), core.config.learners, {**core.config.addresses, "
           "n: address}))",
           (test_replica_moves_inproc
            .test_a_partition_moves_to_a_new_node_while_a_producer_writes,)),
    Mutant("the leader balancer asks for every transfer the planner would make at once",
           "raft.node.leader_balance", "LeaderBalancer.once",
           "max_transfers=room)",
           "max_transfers=1_000)",
           (test_replica_moves_inproc
            .test_leadership_goes_back_to_preferred_replicas_a_few_at_a_time,)),
    Mutant("the leader balancer does not count its transfers still under way",
           "raft.node.leader_balance", "LeaderBalancer.once",
           "room = min(self.settings.max_transfers, self.settings.max_in_flight - in_flight)",
           "room = self.settings.max_transfers",
           (test_replica_moves_inproc
            .test_the_balancer_bounds_transfers_under_way_and_waits_for_a_settled_node,)),
    Mutant("the leader balancer gives leaderships to a node the moment it is seen up",
           "raft.node.leader_balance", "LeaderBalancer._live",
           "if liveness.up_for(p, now) >= settle}",
           "}",
           (test_replica_moves_inproc
            .test_the_balancer_bounds_transfers_under_way_and_waits_for_a_settled_node,)),
    Mutant("a request for (topic, partition) is routed ignoring the partition",
           "raft.node.topics", "resolve",
           "p = t.partitions[partition]",
           "p = t.partitions[0]",
           (test_reconciler.test_resolve_sends_a_partition_to_its_own_group,)),
    Mutant("a partition runs the node's default retention instead of its topic's",
           "raft.node.topic_settings", "SettingsInForce._resolve",
           "settings = meta.settings_of(group_id, self.defaults)",
           "settings = self.defaults",
           (test_topic_settings_inproc.
            test_each_partition_keeps_what_its_topic_says_and_an_alter_applies_at_once,)),
    Mutant("a token's topic grants are not checked against the request's topic",
           "raft.node.auth", "Authenticator.authorize_topic",
           "if topic is not None and request_type in TOPIC_SCOPED and principal.may(needed, topic):",
           "if True:",
           (test_topic_grants.test_a_prefix_grant_produces_to_its_topics_only_and_sees_only_them,)),
    Mutant("a node routes a peer message to another group than its envelope names",
           "raft.sim.topics_node", "TopicsNode.receive",
           "replica = self.replicas.get(group)",
           "replica = self.replicas.get(sorted(self.replicas)[min(group, len(self.replicas) - 1)])",
           (test_topics_sim.test_messages_reach_their_own_group,)),
    Mutant("a node runs a partition on another shard index than the metadata places it on",
           "raft.sim.topics_node", "TopicsNode._reconcile",
           "self._start_replica(p.group, p.founders or p.replicas, p.shard)",
           "self._start_replica(p.group, p.founders or p.replicas, "
           "(p.shard + self.node_id) % self.sim.cfg.shards)",
           (test_topics_sim.test_partitions_are_placed_on_shards_and_traffic_stays_shard_to_shard,)),
    Mutant("the reconciler keeps a deleted topic's groups and logs",
           "raft.controller.reconcile", "reconcile",
           "delete = tuple(sorted(g for g in held if meta.is_deleted(g)))",
           "delete = ()",
           (test_topics_sim.test_a_deleted_topics_groups_stop_and_their_logs_are_dropped,)),
    Mutant("the failure detector misses a peer that restarted within its down bound",
           "raft.sim.liveness", "NodeLiveness.heard",
           "if known is not None and epoch > known and (observer, peer) not in self.down:",
           "if False:",
           (test_topics_sim.test_a_peer_that_restarted_unseen_wakes_its_quiet_followers,)),
    # Retention of the controller log (raft/node/controller.py, raft/controller/state.py).
    Mutant("group 0's snapshots do not carry the controller's metadata",
           "raft.node.server", "Node.__init__",
           "self.controller_group.snapshot_sections = (controller_section.SECTION,)",
           "self.controller_group.snapshot_sections = ()",
           (_in_tmp(test_controller_retention.
                    test_a_cut_controller_log_keeps_the_metadata_and_a_restart_restores_it,
                    "memory"),)),
    Mutant("a log's append ignores the node-wide dirty-tail limit",
           "storage.lmdb_log", "LmdbLog.append",
           "self._tail_share.budget.check(size)",
           "pass",
           (_in_tmp(test_store.test_the_dirty_tails_of_all_logs_share_one_node_wide_limit,
                    "lmdb"),)),
    Mutant("a recovering stream ignores the node's recovery slots",
           "raft.core.leader", "LeaderSide._send_append",
           "not budget.may_send(pr.node_id, self.cfg.recovery_chunk_bytes):",
           "False:",
           (test_budget.test_a_second_partitions_lagging_follower_waits_for_the_only_slot,)),
    Mutant("a follower the commit quorum needs waits for a recovery slot",
           "raft.core.leader", "LeaderSide._quorum_needs",
           "return healthy < majority(len(voters))",
           "return False",
           (test_budget.test_a_follower_the_quorum_needs_is_never_held_back,)),
    Mutant("the simulation's controller log is cut without its metadata",
           "raft.sim.topics_node", "TopicsNode._start_replica",
           "sections = (controller_section.SECTION,) if group == CONTROLLER else ()",
           "sections = ()",
           (test_topics_sim.
            test_the_controller_log_is_cut_and_a_node_behind_its_start_restores_the_metadata,)),
    Mutant("the controller's snapshot forgets which replicas founded each partition",
           "raft.controller.state", "_from_snapshot",
           "p = Partition(name, index, group, tuple(replicas), tuple(founders), shard)",
           "p = Partition(name, index, group, tuple(replicas), tuple(replicas), shard)",
           (test_controller_state.test_founders_survive_a_move_and_the_snapshot,)),
    Mutant("retention cuts controller entries this node has not applied yet",
           "raft.node.controller", "ControllerService.open",
           'retention.holders.register("metadata", self._retention_holds)',
           "pass",
           (_in_tmp(test_controller_retention.
                    test_a_cut_controller_log_keeps_the_metadata_and_a_restart_restores_it,
                    "memory"),)),
    Mutant("a stream queues every heartbeat while one is still waiting",
           "raft.node.outbox", "PeerStream.send",
           "if kind in self._beats:  # one already queued: it will leave as this one",
           "if False:",
           (test_peer_lanes
            .test_a_heartbeat_sent_while_one_is_queued_replaces_it_and_leaves_in_its_place,)),
    Mutant("a queued heartbeat leaves as it was, not as the newest sent after it",
           "raft.node.outbox", "PeerStream.leaving",
           "msg = self._beats.pop(kind, msg)",
           "self._beats.pop(kind, msg)",
           (test_peer_lanes
            .test_a_heartbeat_sent_while_one_is_queued_replaces_it_and_leaves_in_its_place,)),
    Mutant("a new partition's other replicas do not hold back their first election",
           "raft.core.election", "Elections.first_election",
           "self._election_elapsed = -2 * self.cfg.election_ticks",
           "pass",
           (test_first_election
            .test_held_back_replicas_still_campaign_and_an_older_group_is_left_alone,)),
    Mutant("a new partition's preferred replica waits out a full timeout for its first election",
           "raft.core.election", "Elections.first_election",
           "max(self._election_elapsed, self._randomized_timeout - 1)",
           "self._election_elapsed",
           (test_first_election
            .test_the_preferred_replica_campaigns_first_and_wins_the_first_term,)),
    Mutant("a replica late to its new group's founding counts a probe as no sign of freshness",
           "raft.core.incarnation", "Incarnations._handle_probe",
           "            self._fresh_from[msg.src] = msg.incarnation\n            self._check_new_cluster()",
           "            pass",
           (test_late_founder
            .test_a_replica_late_to_its_groups_founding_is_a_member_and_votes,)),
    # The founders rule (raft/core/incarnation.py, (c)).
    Mutant("a founder cut off before its answers is never vouched for (diskloss seed 112)",
           "raft.core.incarnation", "Incarnations._handle_probe_reply",
           "if msg.founder and self._counted_as_founder():",
           "if False:",
           (functools.partial(
               test_founders
               .test_a_founder_cut_off_before_its_answers_is_a_member_after_a_real_disk_loss,
               False),)),
    Mutant("a founder vouches for a prober by its id, whatever directory it answers from",
           "raft.core.incarnation", "Incarnations._vouches_for",
           "return self._founders.get(node_id) == incarnation and",
           "return node_id in self._founders and",
           (test_founders.test_a_founder_that_really_lost_its_disk_is_not_vouched_for,)),
    Mutant("a prober takes answers meant for an earlier directory of its own",
           "raft.core.incarnation", "Incarnations._handle_probe_reply",
           "if msg.prober_incarnation and msg.prober_incarnation != self.incarnation:",
           "if False:",
           (test_founders
            .test_answers_meant_for_an_earlier_directory_of_the_prober_count_for_nothing,)),
    Mutant("a founder vouches for a member removed since",
           "raft.core.incarnation", "Incarnations._vouches_for",
           "== incarnation and node_id in self.config.voters",
           "== incarnation",
           (test_founders.test_a_founder_removed_since_is_not_vouched_for,)),
    Mutant("a founder leaves unanswered the announce of a founder whose vouch was lost",
           "raft.core.raft", "RaftCore._step",
           "if msg.term == 0 and self._founders:",
           "if False:",
           (test_founders
            .test_a_founder_whose_vouch_was_lost_is_vouched_for_when_it_announces_itself,)),
    Mutant("failed campaigns do not widen the election timeout's spread",
           "raft.core.raft", "RaftCore._reset_randomized_timeout",
           "spread = e << min(self._failed_campaigns, MAX_BACKOFF_DOUBLINGS)",
           "spread = e",
           (test_first_election
            .test_failed_campaigns_widen_the_timeout_spread_until_a_leader_is_known,)),
    # Quiescence in the runtime (raft/node/liveness.py, raft/node/registry.py).
    Mutant("the node's failure detector never reports a silent peer down",
           "raft.node.liveness", "NodeLiveness.check",
           "if peer not in self.down and (now - heard > limit",
           "if False and (now - heard > limit",
           (test_liveness_lag.test_a_peer_that_showed_no_silence_is_down_after_the_plain_timeout,)),
    Mutant("the node's failure detector takes a peer's new boot id for a reconnect",
           "raft.node.liveness", "NodeLiveness.peer_booted",
           "if known is None or known == boot:",
           "if True:",
           (test_peer_restart.test_a_new_boot_id_is_a_restart_and_the_same_one_a_reconnect,
            test_peer_restart
            .test_quiet_groups_led_by_a_node_that_restarted_unseen_wake_at_once)),
    Mutant("the node's failure detector ignores the peer's own recent silences",
           "raft.node.liveness", "NodeLiveness.check",
           "limit = self.down_s + slack + self.peer_slack(peer, now)",
           "limit = self.down_s + slack",
           (test_liveness_lag
            .test_a_peer_that_came_back_from_a_long_silence_gets_that_silence_as_slack,)),
    Mutant("the node's ticker skips awake groups",
           "raft.node.registry", "GroupRegistry.tick_awake",
           "            group.tick()\n",
           "            pass\n",
           (test_quiesce_inproc.test_a_follower_catches_up_and_quiesces_only_with_ticks,)),
    Mutant("an input that wakes a group does not wake the sleeping ticker",
           "raft.node.registry", "GroupRegistry._woke",
           "self._any_awake.set()",
           "pass",
           (test_quiesce_inproc.test_killing_the_leader_of_50_quiesced_groups_fails_over_without_a_herd,)),
    # The position rule again, killed end to end: the link simulation's at-least-once link
    # hands the sink leaders the same batches twice, and its checker finds the duplicate.
    Mutant("a mirror's leader appends a MIRRORED batch whatever its tag (the link simulation)",
           "raft.core.mirror", "Mirror._mirror_propose",
           "if base <= self.visible_end:  # the position rule",
           "if False:",
           (test_link_sim
            .test_retried_fetches_are_refused_by_the_position_rule_and_the_mirror_stays_exact,)),
    # The fetch-ahead's rule in the link simulation: a reply fetched at the end of one that
    # was not placed whole would leave out what that one did not place.
    Mutant("a link appends a reply fetched ahead of one not placed whole (the link simulation)",
           "raft.sim.link_actor", "Link._on_reply",
           "if fid in p.continues and not p.continues[fid]:",
           "if False:",
           (test_link_sim.test_a_reply_fetched_ahead_of_one_not_placed_whole_is_dropped,)),
    # Replicated subscriptions: the link copies a source position capped at the mirror's
    # committed visible end + 1; uncapped, a position past the mirror's end is refused by the
    # sink's bound and the copy is lost (the checker: every copy is set).
    Mutant("a link copies subscription positions uncapped (the link simulation)",
           "raft.sim.link_subscriptions", "Subscriptions._on_rows",
           "position = min(source_position, cap)  # the cap",
           "position = source_position",
           (test_link_sim.test_mirrored_subscription_positions_are_capped_at_the_mirror_end,)),
    # `link pause` and `topic promote` (raft/sim/link_admin.py): a paused link's pullers stop,
    # a promoted partition's for good.
    Mutant("a paused link keeps pulling (the link simulation)",
           "raft.sim.link_actor", "Link.runs",
           "self.stopped or self.paused or group in self.promoted",
           "self.stopped or group in self.promoted",
           (test_link_sim
            .test_a_paused_link_appends_nothing_and_a_promoted_mirror_takes_writes_not_the_link,)),
    Mutant("a promoted mirror's link keeps pulling (the link simulation)",
           "raft.sim.link_actor", "Link.runs",
           "self.stopped or self.paused or group in self.promoted",
           "self.stopped or self.paused",
           (test_link_sim
            .test_a_paused_link_appends_nothing_and_a_promoted_mirror_takes_writes_not_the_link,)),
    # The mirror section, end to end: a sink cluster restarted with no MIRRORED batch left in
    # its logs starts from visible end -1 and the link appends the source's batches again.
    Mutant("a mirror's visible end at the log start is not read back (the link simulation)",
           "raft.core.mirror", "Mirror._mirror_open",
           "self.visible_end = end_at_start(self.log.snapshot)",
           "self.visible_end = -1",
           (test_link_sim.test_a_sink_restarted_idle_takes_its_visible_end_from_its_log_start,)),
    # A puller serves one leadership: a reply fetched before this node lost and regained it
    # could start past the new term's visible end and leave a hole the position rule allows.
    Mutant("a link's puller appends a reply fetched under an earlier term",
           "raft.node.links.puller", "Puller._leads",
           "and (self.term is None or core.term == self.term))",
           ")",
           (test_link_puller.test_a_reply_fetched_under_an_earlier_leadership_is_dropped,)),
    # Pipelined requests of one connection start their handlers in the order they were read.
    Mutant("a connection's pipelined requests start in whatever order trio runs their tasks",
           "raft.node.client_requests", "ClientRequests._answer",
           "if before is not None and not before.is_set():",
           "if False:",
           (test_request_order.test_pipelined_writes_land_in_the_order_sent,)),
    Mutant("a produce without a task is proposed ahead of a request read before it",
           "raft.node.client_requests", "ClientRequests._dispatch",
           "incoming.trace is None and (order.before is None or order.before.is_set()):",
           "incoming.trace is None:",
           (test_request_order.test_pipelined_writes_land_in_the_order_sent,)),
    # Produces answered by callbacks (raft/node/reply_writer.py, raft/node/propose_then.py).
    Mutant("a client that half-closes is hung up on before its pending produces are answered",
           "raft.node.client_requests", "ClientRequests._serve_from_hub",
           "await order.replies.all_answered()",
           "pass",
           (test_produce_callbacks.test_a_client_that_half_closes_gets_every_pending_reply,)),
    Mutant("a produce answered by a callback never gives back its place in the node's count",
           "raft.node.client_requests", "ClientRequests._start_produce",
           "replies.answered()\n                self._ended()",
           "replies.answered()",
           (test_produce_callbacks.test_a_connection_closed_with_answers_pending_leaves_the_node_serving,)),
    Mutant("a reply is written into the socket while an earlier one is still queued",
           "raft.node.reply_writer", "ReplyWriter.write",
           "if not self._draining:",
           "if True:",
           (test_reply_write.test_the_reply_writer_finishes_a_partly_taken_reply_before_the_next,)),
    Mutant("a produce's callback is dropped at its deadline",
           "raft.node.pending", "PendingAnswers._release",
           "pending.callback(pending.answer)",
           "pass",
           (test_produce_callbacks.test_a_client_that_half_closes_gets_every_pending_reply,)),
    # The flush thread (raft/node/flush_thread.py): a flush that started is waited for, and its
    # outcome goes to the one task that asked for it.
    Mutant("a cancelled flusher goes on before the flush it started has finished",
           "raft.node.flush_thread", "FlushThread.run",
           "with trio.CancelScope(shield=True):",
           "with trio.CancelScope(shield=False):",
           (test_flush_thread.test_a_cancelled_caller_waits_for_the_call_it_started,)),
    Mutant("a second flush call shares the first one's result slot",
           "raft.node.flush_thread", "FlushThread.run",
           "if self._busy:",
           "if False:",
           (test_flush_thread
            .test_a_second_concurrent_call_is_refused_and_the_first_is_answered,)),
    # acks=leader/none paced by replication (raft/core/backlog.py, issue 28).
    Mutant("a leader takes acks=none writes however far its log runs ahead of the commit index",
           "raft.core.raft", "RaftCore.propose",
           "if lead.backlog.must_wait(acks, limit):",
           "if False:",
           (functools.partial(
               test_backlog.test_writes_that_do_not_wait_for_the_quorum_wait_past_the_backlog_bound,
               Acks.NONE),)),
    Mutant("the backlog never shrinks as the commit index passes it",
           "raft.core.leader", "LeaderSide._maybe_commit",
           "lead.backlog.committed(candidate)",
           "pass",
           (test_backlog.test_a_quorum_write_waits_behind_them_in_order_and_commits,)),
    Mutant("a quorum write overtakes the writes waiting for room (the log loses their order)",
           "raft.core.backlog", "Backlog.must_wait",
           "return bool(self.parked) or (",
           "return (",
           (test_backlog.test_a_quorum_write_waits_behind_them_in_order_and_commits,)),
    # Concurrent writes appended as one batch (raft/core/merging.py, issue 28).
    Mutant("an idempotent write is merged into a batch without its producer id (a retry of it "
           "is appended again)",
           "raft.core.open_batch", "merge_start",
           "batch.producer_id != NO_PRODUCER or ",
           "",
           (test_merging
            .test_an_idempotent_retry_of_a_write_proposed_beside_others_is_a_duplicate,)),
    Mutant("writes of another timestamp are merged (their records show the first's timestamp)",
           "raft.core.merging", "ProduceMerging._open_propose",
           "batch.timestamp_ms == held.timestamp_ms",
           "True",
           (functools.partial(
               test_merging.test_writes_proposed_in_one_pass_share_a_batch_at_their_answered_offsets,
               test_merging.CASES[2]),)),
    Mutant("every write of a merged batch is answered with the batch's first offset",
           "raft.core.merging", "ProduceMerging._seal_open",
           "base = last + 1",
           "pass",
           (functools.partial(
               test_merging.test_writes_proposed_in_one_pass_share_a_batch_at_their_answered_offsets,
               test_merging.CASES[0]),)),
    Mutant("writes still open when leadership ends are never answered",
           "raft.core.raft", "RaftCore._step_down",
           "self._drop_open(lead)",
           "pass",
           (test_merging
            .test_writes_still_open_when_leadership_ends_are_answered_not_leader_and_never_written,)),
    # Metadata saves (raft/node/meta_saver.py, issue 28): a commit checkpoint holds no message,
    # and no save writes an older term or vote over a newer one.
    Mutant("the Ready loop waits for a commit checkpoint's save (behind the running flush)",
           "raft.node.meta_saver", "MetaSaver.put",
           "if urgent or not checkpoint_only(hs, saved):",
           "if True:",
           (_in_tmp(test_meta_checkpoint
                    .test_heartbeats_leave_while_a_checkpoint_waits_for_the_store),)),
    Mutant("a vote's save leaves an older checkpoint queued to be written after it",
           "raft.node.meta_saver", "MetaSaver.save",
           "self._lazy = None  # `hs` is newer",
           "pass  # `hs` is newer",
           (test_meta_checkpoint.test_a_waiting_checkpoint_never_overwrites_a_newer_term,)),
    Mutant("a loads index read that meets a state transfer's new start stops the node",
           "raft.core.loads", "LoadIndex.catch_up",
           "except OffsetOutOfRange:\n                # The log moved under us",
           "except ZeroDivisionError:\n                # The log moved under us",
           (functools.partial(test_index_log_moved.
                              test_a_reset_under_a_read_is_not_caught_up_yet_then_the_index_restores,
                              test_index_log_moved.LoadIndex),)),
    Mutant("a suffix truncation deletes the cut records but leaves their heads behind",
           "storage.lmdb_log", "LmdbLog.truncate_suffix",
           "gone = heads.delete_range(txn, space, after_offset + 1, None, self._fmt)",
           "gone = space.delete_from(txn.cursor(db=space.log_db), after_offset + 1,\n"
           "                                             self._trailer)",
           (_in_tmp(test_lmdb_heads.test_the_heads_follow_every_write_of_a_single_log),)),
]


def mutated(mutant: Mutant) -> Callable[..., object]:
    module = importlib.import_module(mutant.module)
    owner: object = module
    *path, name = mutant.qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = inspect.unwrap(owner.__dict__[name] if path else getattr(module, name))
    source = inspect.getsource(original)  # as indented in its file, like `old` and `new`
    found = source.count(mutant.old)
    assert found == 1, (f"mutant {mutant.name!r}: expected the rule's text once in "
                        f"{mutant.module}.{mutant.qualname}, found it {found} times; update "
                        f"the mutant to the code as it is now")
    code = compile(textwrap.dedent(source.replace(mutant.old, mutant.new)),
                   f"<mutant of {mutant.qualname}>",
                   "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict[str, object] = {}
    exec(code, module.__dict__, namespace)  # noqa: S102 - the point of a mutation test
    return namespace[name]  # type: ignore[return-value]


def bindings(mutant: Mutant) -> list[tuple[object, str]]:
    """Where to patch: the class attribute, or for a module-level function its own module and
    every core module that imported it by name (the simulation's checkers keep the original)."""
    module = importlib.import_module(mutant.module)
    *path, name = mutant.qualname.split(".")
    if path:
        owner: object = module
        for part in path:
            owner = getattr(owner, part)
        return [(owner, name)]
    original = getattr(module, name)
    out: list[tuple[object, str]] = []
    for modname, mod in list(sys.modules.items()):
        if (isinstance(mod, types.ModuleType)
                and (modname == mutant.module or modname.startswith("raft.")
                     and not modname.startswith(("raft.sim", "raft.cli", "raft.client")))
                and getattr(mod, name, None) is original):
            out.append((mod, name))
    return out


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed(mutant: Mutant, monkeypatch: pytest.MonkeyPatch) -> None:
    replacement = mutated(mutant)
    for owner, name in bindings(mutant):
        monkeypatch.setattr(owner, name, replacement)
    survived = []
    for killer in mutant.killers:
        try:
            killer()
        except (Exception, pytest.fail.Exception) as e:  # the rule was missed
            name = getattr(killer, "__name__", None) or killer.func.__name__  # a partial
            print(f"killed by {name}: {type(e).__name__}")
            return
        survived.append(getattr(killer, "__name__", None) or killer.func.__name__)
    pytest.fail(f"mutant survived: {mutant.name!r} passed {survived}")


def _runs_in_the_suite_as_here(killer: Callable[[], object]) -> bool:
    """A module-level test function that takes no argument and carries no mark (skip,
    parametrize, ...) is run by pytest in the suite exactly as the mutants call it: bare."""
    return (inspect.isfunction(killer) and killer.__name__.startswith("test_")
            and getattr(sys.modules[killer.__module__], killer.__name__, None) is killer
            and not inspect.signature(killer).parameters
            and not getattr(killer, "pytestmark", None))


def test_killers_pass_without_mutants() -> None:
    """The killers are real tests: on the unmutated core every one of them passes. Those the
    suite itself runs as they are called here pass there (the suite is red otherwise), so
    this runs the others (wrapped with a temporary directory or a store, partials of a
    table's cases), whose bare call is not what pytest runs. The suite's time: this re-ran
    every killer, ~27 s in CI."""
    killers = {k for mutant in MUTANTS for k in mutant.killers}
    others = [k for k in killers if not _runs_in_the_suite_as_here(k)]
    assert len(others) < len(killers)  # the rule above still recognises the plain killers
    for killer in others:
        killer()
