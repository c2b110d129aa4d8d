"""Safety and liveness checks over a simulated cluster. Each records a Violation instead of
raising, so a run reports every broken property with the simulated time it broke at.

With disk loss (raft/sim/nemesis.py): a node that lost its disk (its new incarnation is in
`forgot`) must not grant a vote until its own configuration records that incarnation (it was
re-added); a commit must be held flushed, readable and by a node the leader's configuration
knows as it is; damaged batches are skipped by the content checks (they are not served)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import bisect

from raft.core import messages as m
from raft.core.quorum import majority
from raft.core.retention import Plan, RetentionPolicy
from storage.api import LogStorage
from storage.batch import Batch, BatchKind, CorruptBatch
from storage.records import decode_records

if TYPE_CHECKING:
    from raft.sim.node import SimNode


@dataclass(slots=True, frozen=True)
class Violation:
    time_us: int
    prop: str
    detail: str


def _entry_id(b: Batch) -> tuple[int, int, int, int]:
    """What makes an entry itself: its term, kind, CRC and count (offsets are positions)."""
    return (b.term, int(b.kind), b.crc, b.count)


@dataclass
class Checkers:
    violations: list[Violation] = field(default_factory=list)
    leaders: dict[int, int] = field(default_factory=dict)  # term -> leader
    committed: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # base -> id
    commit_seen: dict[int, int] = field(default_factory=dict)  # node -> commit index (alive)
    max_commit: int = -1
    check_flushed_majority: bool = True
    # Retention and state transfers: what was ever committed survives its deletion here.
    committed_last: dict[int, int] = field(default_factory=dict)  # last offset -> term
    config_offsets: list[int] = field(default_factory=list)  # committed CONFIG bases, sorted
    committed_values: dict[bytes, int] = field(default_factory=dict)  # record -> batch base
    starts: dict[int, int] = field(default_factory=dict)  # node -> log start it last had
    state_transfers: int = 0
    retention_checked: int = 0  # retention cuts the keep-the-newest checks looked at
    forgot: dict[int, int] = field(default_factory=dict)  # node -> incarnation after disk loss
    # node -> (base, last, term) of the batches it held flushed when its disk was damaged: a
    # report it sent before may still be on its way, and counting it then was right.
    before_loss: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)

    def note_disk_loss(self, node: "SimNode") -> None:
        """Called with the node down, before its storage is damaged."""
        held: list[tuple[int, int, int]] = []
        off = node.log.start_offset
        while off <= node.log.flushed_offset:
            batches, skip_to = read_whole(node.log, off, 1 << 22)
            if skip_to >= 0:
                off = skip_to
                continue
            held.extend((b.base_offset, b.last_offset, b.term) for b in batches)
            off = batches[-1].last_offset + 1
        self.before_loss[node.node_id] = held

    def fail(self, now: int, prop: str, detail: str) -> None:
        if len(self.violations) < 50:
            self.violations.append(Violation(now, prop, detail))

    # -- after every Ready of a node -------------------------------------------------------
    def on_ready(self, now: int, node: "SimNode", nodes: dict[int, "SimNode"]) -> None:
        core = node.core
        assert core is not None
        inc = self.forgot.get(node.node_id)
        if inc is not None and core.config.incarnations.get(node.node_id) == inc:
            del self.forgot[node.node_id]  # re-added: a member again
        if core.role.value == "leader":
            other = self.leaders.setdefault(core.term, node.node_id)
            if other != node.node_id:
                self.fail(now, "election safety",
                          f"term {core.term} has two leaders: {other} and {node.node_id}")
        prev = self.commit_seen.get(node.node_id, core.commit_index)
        if core.commit_index < prev:
            self.fail(now, "commit monotonic", f"node {node.node_id} commit index went from "
                                               f"{prev} back to {core.commit_index}")
        if core.commit_index > prev:
            self._check_committed_range(now, node, prev + 1, core.commit_index)
            if core.role.value == "leader" and self.check_flushed_majority:
                self._check_flushed_majority(now, node, nodes, core.commit_index)
        self.commit_seen[node.node_id] = core.commit_index
        self.max_commit = max(self.max_commit, core.commit_index)
        start = node.log.start_offset
        if start != self.starts.get(node.node_id, start):
            self.state_transfers += 1  # moved without retention: a reset to the leader's start
        self.starts[node.node_id] = start
        self._check_config_not_older_than_start(now, node)

    def on_retention(self, node: "SimNode") -> None:
        self.starts[node.node_id] = node.log.start_offset

    def on_retention_plan(self, now: int, node: "SimNode", policy: RetentionPolicy,
                          p: Plan) -> None:
        """Called with a retention cut planned on `node`, before its log start moves. Retention
        keeps the newest data (docs/RETENTION.md): it never deletes the node's newest committed
        batch, and a cut the age rule did not ask for (size alone) keeps at least
        `max_bytes`, in whole batches. Restated here from the log itself, not from the plan's
        own accounting."""
        d = p.decision
        if d.cut <= d.start:
            return
        self.retention_checked += 1
        core = node.core
        assert core is not None
        commit = core.commit_index
        if commit >= d.start and d.cut > commit:
            self.fail(now, "retention keeps the newest committed batch",
                      f"node {node.node_id} cut its log at {d.cut}, past its commit index "
                      f"{commit}: the batch holding it is gone")
        log = node.log
        deleted, newest_ts, off = 0, 0, d.start
        while off < d.cut:
            batches = log.read(off, 1 << 22)
            for b in batches:
                if b.base_offset >= d.cut:
                    break
                deleted += b.size
                newest_ts = max(newest_ts, b.timestamp_ms)
            off = batches[-1].last_offset + 1
        if policy.max_bytes is None:
            return
        by_age = (policy.max_age_ms is not None
                  and now // 1000 - newest_ts > policy.max_age_ms)
        kept = log.retained_bytes - deleted
        if not by_age and kept < policy.max_bytes:
            self.fail(now, "size retention keeps at least retention-bytes",
                      f"node {node.node_id} cut its log at {d.cut} (from {d.start}) for size "
                      f"alone, keeping {kept} bytes, under its limit of {policy.max_bytes}")

    def _check_config_not_older_than_start(self, now: int, node: "SimNode") -> None:
        """A node never votes (nor counts votes) with a configuration older than its log start:
        the one in force is at least the last committed CONFIG entry below the start."""
        start = node.log.start_offset
        i = bisect.bisect_left(self.config_offsets, start)
        if not i:
            return
        latest = self.config_offsets[i - 1]
        core = node.core
        assert core is not None
        have = core._configs[-1].offset
        if have < latest:
            self.fail(now, "configuration no older than the log start",
                      f"node {node.node_id} (log start {start}, role {core.role.value}) uses "
                      f"the configuration of offset {have}; the one committed at {latest} is "
                      f"below its log start")

    def on_send(self, now: int, msg: m.Message, nodes: dict[int, "SimNode"]) -> None:
        if not (isinstance(msg, m.RequestVoteReply) and msg.granted):
            return
        node = nodes[msg.src]
        inc = self.forgot.get(msg.src)
        if (inc is not None and node.core is not None and node.log.incarnation == inc
                and node.core.config.incarnations.get(msg.src) != inc):
            self.fail(now, "a node that lost its disk does not vote until re-added",
                      f"node {msg.src} (new incarnation {inc}) granted a "
                      f"{'pre-' if msg.pre_vote else ''}vote to {msg.dst} in term {msg.term}")

    def on_restart(self, node: "SimNode") -> None:
        """A restarted node starts from its checkpointed commit index (it may be lower than
        before the crash; the high watermark it serves never passes what was committed)."""
        assert node.core is not None
        self.commit_seen[node.node_id] = node.core.commit_index
        self.starts[node.node_id] = node.log.start_offset
        if node.core.commit_index >= 0:
            self._check_committed_range(0, node, node.log.start_offset, node.core.commit_index)

    def _check_committed_range(self, now: int, node: "SimNode", lo: int, hi: int) -> None:
        """Entries a node reports committed (what consumers may read from it) must be the same
        entries on every node, forever."""
        log = node.log
        off = max(lo, log.start_offset)
        while off <= hi:
            batches, skip_to = read_whole(log, off, 1 << 20)
            if skip_to >= 0:
                off = skip_to  # damaged here: not served, not checked (it is being repaired)
                continue
            if not batches:
                self.fail(now, "committed data present",
                          f"node {node.node_id} commit index {hi} passes its log end "
                          f"{log.dirty_offset}")
                return
            for b in batches:
                if b.base_offset > hi:
                    return
                if b.last_offset > hi:
                    self.fail(now, "commit on batch boundary",
                              f"node {node.node_id} committed {hi} inside batch "
                              f"{b.base_offset}..{b.last_offset}")
                    return
                known = self.committed.get(b.base_offset)
                if known is None:
                    self._first_commit(now, b)
                elif known != _entry_id(b):
                    self.fail(now, "committed prefix identical",
                              f"node {node.node_id} has {_entry_id(b)} at committed offset "
                              f"{b.base_offset}; committed there before: {known}")
                off = b.last_offset + 1

    def _first_commit(self, now: int, b: Batch) -> None:
        """Remember a newly committed entry for good (retention may delete it everywhere)."""
        self.committed[b.base_offset] = _entry_id(b)
        self.committed_last[b.last_offset] = b.term
        if b.kind == BatchKind.CONFIG:
            bisect.insort(self.config_offsets, b.base_offset)
        elif b.kind == BatchKind.DATA:
            for r in decode_records(b.payload):
                first = self.committed_values.setdefault(r.value, b.base_offset)
                if first != b.base_offset:
                    self.fail(now, "no idempotent duplicate",
                              f"record {r.value!r} committed at {first} and again at "
                              f"{b.base_offset} (a retry the producer table did not catch)")

    def _check_flushed_majority(self, now: int, leader: "SimNode",
                                nodes: dict[int, "SimNode"], commit: int) -> None:
        """Dirty offsets never count: whatever the leader commits is flushed, as this very
        entry, on a majority of the voters at this moment."""
        core = leader.core
        assert core is not None
        term = leader.log.term_at(commit)
        holders = 0
        voters = core.config.voters
        for v in voters:
            n = nodes.get(v)
            if n is None:
                continue
            log = n.log
            if log.start_offset > commit and self.committed_last.get(commit) == term:
                holders += 1  # retention deleted it here, which it does only once committed
                continue
            if any(b <= commit <= last and t == term for b, last, t in
                   self.before_loss.get(v, ())):
                holders += 1  # held before its disk was damaged (its report may be late)
                continue
            if any(d.first <= commit for d in log.damaged()) or (
                    v in self.forgot and log.incarnation == self.forgot[v]
                    and core.config.incarnations.get(v) != log.incarnation):
                continue  # damaged below it, or a disk the configuration does not know
            if log.flushed_offset >= commit:
                try:
                    same = log.term_at(commit) == term
                except Exception:  # noqa: BLE001 (out of range: not held)
                    same = False
                holders += same
        if holders < majority(len(voters)):
            self.fail(now, "commit needs a flushed majority",
                      f"leader {leader.node_id} committed {commit} (term {term}) but only "
                      f"{holders} of {len(voters)} voters have it flushed")

    # -- at the end ----------------------------------------------------------------------
    def check_above_log_starts(self, now: int, nodes: dict[int, "SimNode"]) -> None:
        """Committed data agrees above every node's log start: each node's committed range,
        from its start, is exactly what was committed there (retention and state transfers
        included), and the term at its start is the committed one."""
        for node in nodes.values():
            if node.core is None:
                continue
            start = node.log.start_offset
            if start > 0 and (start - 1) in self.committed_last and \
                    self.committed_last[start - 1] != node.log.start_term:
                self.fail(now, "committed data agrees above the log start",
                          f"node {node.node_id} starts at {start} with term "
                          f"{node.log.start_term}; the entry ending at {start - 1} was "
                          f"committed with term {self.committed_last[start - 1]}")
            if start > 0 and (start - 1) not in self.committed_last:
                self.fail(now, "committed data agrees above the log start",
                          f"node {node.node_id} starts at {start}, which is not the end of a "
                          f"committed entry")
            self._check_committed_range(now, node, start, node.core.commit_index)

    def check_log_matching(self, now: int, nodes: dict[int, "SimNode"]) -> None:
        """If two logs hold an entry with the same offset and term, they are identical up to
        there (checked at each pair's last common offset of equal term)."""
        ids = sorted(nodes)
        logs = {i: _entries(nodes[i]) for i in ids}
        for x in range(len(ids)):
            for y in range(x + 1, len(ids)):
                a, b = logs[ids[x]], logs[ids[y]]
                common = sorted(set(a) & set(b))
                agree = [o for o in common if a[o][0] == b[o][0]]
                if not agree:
                    continue
                top = agree[-1]
                for o in common:
                    if o > top:
                        break
                    if a[o] != b[o]:
                        self.fail(now, "log matching",
                                  f"nodes {ids[x]} and {ids[y]} agree on the term at {top} but "
                                  f"differ at {o}: {a[o]} vs {b[o]}")
                        break


def read_whole(log: LogStorage, offset: int, max_bytes: int) -> tuple[list[Batch], int]:
    """(batches, -1), or ([], the offset after it) when the batch at `offset` is damaged."""
    try:
        return log.read(offset, max_bytes), -1
    except CorruptBatch:
        hit = [d for d in log.damaged() if d.first <= offset <= d.last]
        if not hit:
            raise
        return [], hit[0].last + 1


def _entries(node: "SimNode") -> dict[int, tuple[int, int, int, int]]:
    out = {}
    off = node.log.start_offset
    while off <= node.log.dirty_offset:
        batches, skip_to = read_whole(node.log, off, 1 << 22)
        if skip_to >= 0:
            off = skip_to
            continue
        for b in batches:
            out[b.base_offset] = _entry_id(b)
        off = batches[-1].last_offset + 1
    return out


def data_records(node: "SimNode", upto: int) -> list[tuple[int, bytes]]:
    """(base offset, payload) of DATA batches up to `upto` (what a consumer reads)."""
    out = []
    off = node.log.start_offset
    while off <= min(upto, node.log.dirty_offset):
        batches, skip_to = read_whole(node.log, off, 1 << 22)
        if skip_to >= 0:
            off = skip_to
            continue
        for b in batches:
            if b.last_offset > upto:
                return out
            if b.kind == BatchKind.DATA:
                out.append((b.base_offset, b.payload))
        off = batches[-1].last_offset + 1
    return out
