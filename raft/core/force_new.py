"""Force a new cluster from one node's log: the way out of a lost majority (etcd's model,
`etcd --force-new-cluster`), as a pure rule. The CLI (raft/cli/recover.py) reads the stopped
node's data directory into `NodeFacts`, asks `plan_force_new_cluster` what to write, shows the
operator what will be lost, and only then writes the plan.

Why a tool at all: when a majority of the voters lost their disks (several disk losses one after
another, typically before a first commit), the survivors refuse every candidate that lacks what
they once held (lost positions), and the nodes that lost their disks wait to be re-added by a
leader that cannot be elected. Raft has no safe way out; the operator must choose one log to be
the truth. This makes that choice explicit and loud.

What the plan does to the chosen node:
- keeps its flushed log up to just before its first damaged batch (a damaged batch has no good
  copy this node can reach any more; everything after it is dropped with it);
- appends a CONFIG entry making it the only voter, with its own incarnation recorded (so it is
  a member in good standing, not a node waiting to be re-added), carrying an audit record of
  what was done;
- writes that entry in a term above every term the node knows: its current term, its log's last
  term and the term of any position it once held and lost (storage's lost_position). Then its
  log is the most up to date it has ever held, so nothing it remembers refuses its campaign, and
  no old entry of any term can be mistaken for the new configuration;
- saves metadata with that term, no vote, the new configuration as its history and no `pending`
  flag (the rejoin state of raft/core/incarnation.py is cleared).
Everything any other node committed beyond this node's flushed log is lost for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from raft.core.membership import ClusterConfig
from storage.batch import Batch, BatchKind

AUDIT_KEY = "forced_new_cluster"  # the audit record's key in the forced CONFIG entry's payload


@dataclass(slots=True, frozen=True)
class NodeFacts:
    """What the CLI read from the stopped node's data directory."""

    node_id: int
    incarnation: int
    term: int  # the metadata's current term
    start_offset: int
    flushed_offset: int
    last_term: int  # the term of the entry at flushed_offset (start_term for an empty log)
    commit_index: int  # the last checkpointed commit index (-1: none)
    first_damaged: int | None  # the lowest damaged offset found, if any
    lost_position: tuple[int, int] | None  # (offset, term) the log once held and lost
    config_before: ClusterConfig | None  # the configuration in force (None: the bootstrap one)


@dataclass(slots=True, frozen=True)
class ForcePlan:
    """What to write: cut the log after `keep_upto`, append `config_batch(...)` at
    `keep_upto + 1`, save `meta_config` with `term` and no vote."""

    node_id: int
    keep_upto: int  # the last offset kept (start_offset - 1: nothing)
    dropped: tuple[int, int] | None  # [first, last] flushed offsets dropped with damage
    term: int
    config: ClusterConfig
    commit_index: int
    removed: tuple[int, ...]  # members of the old configuration that are no longer members
    audit: dict[str, Any]

    @property
    def config_offset(self) -> int:
        return self.keep_upto + 1

    def meta_config(self) -> dict[str, Any]:
        """The metadata's configuration record (raft/core/confchange.py's `_config_meta`)."""
        return {"history": [{"offset": self.config_offset, "term": self.term,
                             "config": self.config.to_dict()}],
                "commit": self.commit_index}

    def config_batch(self, timestamp_ms: int) -> Batch:
        """The forced configuration entry: the configuration, plus the audit record (readers of
        a configuration ignore keys they do not know), at its offset and term."""
        payload = {**self.config.to_dict(), AUDIT_KEY: {**self.audit, "at_ms": timestamp_ms}}
        return Batch.create(msgpack.packb(payload), 1, kind=BatchKind.CONFIG,
                            timestamp_ms=timestamp_ms).placed(self.config_offset, self.term)

    def warnings(self) -> list[str]:
        """What the operator may lose, one line each (printed before asking to proceed)."""
        out = [f"node {self.node_id} keeps its flushed log up to offset {self.keep_upto} "
               f"(commit index it last knew: {self.commit_index}); any entry committed "
               f"elsewhere beyond offset {self.keep_upto} is LOST for good, and so is "
               f"anything other nodes hold that differs from this node's log"]
        if self.audit.get("kept_nothing"):
            out.append("this node holds no entries: the new cluster starts EMPTY (a node that "
                       "lost its disk is the wrong one to force from; pick the longest log)")
        if self.dropped is not None:
            out.append(f"offsets {self.dropped[0]}..{self.dropped[1]} are dropped: this node's "
                       f"copy is damaged at {self.dropped[0]} and no other copy can be fetched")
        if self.removed:
            out.append(f"nodes {', '.join(map(str, self.removed))} stop being members; re-add "
                       f"each with `raftlog add-node` once it runs on an empty data directory")
        return out


def plan_force_new_cluster(facts: NodeFacts) -> ForcePlan:
    """The new single-voter cluster of `facts.node_id` from its own log (see the module doc)."""
    keep = facts.flushed_offset
    dropped: tuple[int, int] | None = None
    if facts.first_damaged is not None and facts.first_damaged <= keep:
        dropped = (facts.first_damaged, keep)
        keep = facts.first_damaged - 1
    keep = max(keep, facts.start_offset - 1)
    lost_term = facts.lost_position[1] if facts.lost_position is not None else 0
    # Above every term this node knows: its log then outranks any position it remembers.
    term = max(facts.term, facts.last_term, lost_term) + 1
    addresses = {}
    if facts.config_before is not None and facts.node_id in facts.config_before.addresses:
        addresses[facts.node_id] = facts.config_before.addresses[facts.node_id]
    config = ClusterConfig((facts.node_id,), (), addresses, {facts.node_id: facts.incarnation})
    before = facts.config_before.members if facts.config_before is not None else ()
    removed = tuple(n for n in before if n != facts.node_id)
    commit = min(facts.commit_index, keep)
    audit = {"node_id": facts.node_id, "incarnation": facts.incarnation,
             "old_term": facts.term, "new_term": term, "kept_upto": keep,
             "commit_index": commit, "dropped": list(dropped) if dropped else None,
             "old_members": list(before), "removed": list(removed),
             "kept_nothing": keep < 0}
    return ForcePlan(facts.node_id, keep, dropped, term, config, commit, removed, audit)
