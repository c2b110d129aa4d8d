"""Subscriptions in the simulation: every node keeps the replicated table (raft/core/subscription_table.py)
at its commit index, the leader batches operations into entries (raft/core/subscription_batcher.py),
and consumers read, commit, crash and resume under the nemesis.

The node side mirrors raft/node/subscription_service.py: operations wait in the leader's
accumulator, leave as one quorum CONTROL entry, and each requester gets the verdict the table
reached applying that entry. A node rebuilds its table from its log when it restarts.

Consumers (one per subscription) open with a short single-consumer lease, read committed DATA
records from any node up to that node's commit index, "process" them, commit now and then, and
crash now and then (forgetting everything, then opening again under a new consumer id, which
the old lease refuses until it expires by the entries' stamps). The checker, on every resume at
position P (the verdict of an `open`, so linearizable):
- no acknowledged commit is lost: P >= the highest position a commit was acknowledged at, so a
  resumed consumer re-reads at most what was read after its last acknowledged commit;
- no gap: P <= the highest position ever sent, and every committed DATA record below P was
  delivered to some incarnation;
and at the end every node's table, applied to the same offset, is the same.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raft.core.ready import ProduceAnswer
from raft.core.subscription_batcher import CommitBatcher, Outgoing
from raft.core.subscription_index import SubscriptionIndex
from raft.core.subscription_table import Op, OpRequest, Outcome, make_entry
from raft.core.types import Acks, ErrorCode
from storage.batch import BatchKind, CorruptBatch
from storage.records import decode_records

if TYPE_CHECKING:
    from raft.sim.node import SimNode
    from raft.sim.world import World

Reply = Callable[[Outcome], None]
REQUEST_ID_BASE = 1 << 40  # the subscription entries' request ids, apart from the producers'
LEASE_MS = 100
REQUEST_TIMEOUT_US = 300_000


class SimSubscriptions:
    """The node side: tables, accumulators and the routing of verdicts."""

    def __init__(self, world: "World") -> None:
        self.world = world
        self.indexes: dict[int, SubscriptionIndex] = {}
        self.batchers: dict[int, CommitBatcher[Reply]] = {}
        self.awaiting: dict[int, dict[tuple[int, ...], Outgoing[Reply]]] = {}
        self.requests: dict[int, tuple[int, tuple[int, ...]]] = {}  # rid -> (node, src)
        self._next_rid = REQUEST_ID_BASE
        self._epochs: dict[int, int] = {}
        self.entries = 0

    def owns(self, request_id: int) -> bool:
        return request_id >= REQUEST_ID_BASE

    # -- node lifecycle --------------------------------------------------------------------
    def on_start(self, node: "SimNode") -> None:
        """A (re)started node rebuilds its table from its log, as the runtime does."""
        self.indexes[node.node_id] = SubscriptionIndex(node.log)
        self.batchers[node.node_id] = CommitBatcher(linger_ms=1, max_ops=64, max_pending=1024)
        self.awaiting[node.node_id] = {}
        self._epochs[node.node_id] = self._epochs.get(node.node_id, 0) + 1

    def on_crash(self, node: "SimNode") -> None:
        """Its clients see their connections drop: each waiter gets an error at once (the
        operation may still commit through another node, or not at all)."""
        batcher = self.batchers.pop(node.node_id, None)
        awaiting = self.awaiting.pop(node.node_id, {})
        replies = [] if batcher is None else [r for group in batcher.drain() for r in group]
        for out in awaiting.values():
            replies.extend(r for slot in out.slots for r in slot.waiters)
            replies.extend(out.barriers)
        for reply in replies:
            reply(Outcome(ErrorCode.SHUTTING_DOWN))

    def on_ready(self, node: "SimNode") -> None:
        if node.core is not None and node.node_id in self.indexes:
            self._catch_up(node)

    def _catch_up(self, node: "SimNode") -> None:
        assert node.core is not None
        awaiting = self.awaiting.get(node.node_id, {})

        def applied(a: Any) -> None:
            out = awaiting.pop(tuple(a.src), None)
            if out is None:
                return
            for slot, outcome in zip(out.slots, a.outcomes):
                for reply in slot.waiters:
                    reply(outcome)
            for reply in out.barriers:
                reply(Outcome(ErrorCode.OK))

        self.indexes[node.node_id].catch_up(self.apply_upto(node), 1 << 30, applied)

    @staticmethod
    def apply_upto(node: "SimNode") -> int:
        """What a node's table may apply: committed entries only (the teeth test moves it)."""
        assert node.core is not None
        return node.core.commit_index

    # -- requests --------------------------------------------------------------------------
    def submit(self, node_id: int, op: OpRequest, reply: Reply) -> bool:
        """Queue `op` on node_id (False: down, paused or not the leader: the caller retries)."""
        node = self.world.nodes.get(node_id)
        batcher = self.batchers.get(node_id)
        if node is None or batcher is None or not node.is_leader or node.paused:
            return False
        if not batcher.add(op, reply, self.world.loop.now // 1000):
            return False
        self.world.loop.after(1_000, lambda: self._send(node_id))
        return True

    def _send(self, node_id: int) -> None:
        node = self.world.nodes[node_id]
        batcher = self.batchers.get(node_id)
        if batcher is None or not node.up:
            return
        now_ms = self.world.loop.now // 1000
        while batcher.can_send(now_ms):
            out = batcher.take()
            src = (node_id, self._epochs[node_id], out.seq)
            self.awaiting[node_id][src] = out
            rid = self._next_rid
            self._next_rid += 1
            self.requests[rid] = (node_id, src)
            self.entries += 1
            if not node.propose(rid, make_entry(src, out.ops, now_ms), Acks.QUORUM):
                self._fail(node_id, src, ErrorCode.NOT_LEADER)

    def on_answer(self, node_id: int, a: ProduceAnswer) -> None:
        owner = self.requests.pop(a.request_id, None)
        if owner is None:
            return
        node_id, src = owner
        batcher = self.batchers.get(node_id)
        if batcher is None:
            return  # crashed since: its waiters time out
        batcher.done()
        node = self.world.nodes[node_id]
        if a.error == ErrorCode.OK and node.core is not None:
            self._catch_up(node)
        self._fail(node_id, src, a.error if a.error != ErrorCode.OK else ErrorCode.TIMEOUT)
        if batcher.pending:
            self.world.loop.after(0, lambda: self._send(node_id))

    def _fail(self, node_id: int, src: tuple[int, ...], code: ErrorCode) -> None:
        out = self.awaiting.get(node_id, {}).pop(src, None)
        if out is None:
            return
        for slot in out.slots:
            for reply in slot.waiters:
                reply(Outcome(code))
        for reply in out.barriers:
            reply(Outcome(code))

    # -- at the end ------------------------------------------------------------------------
    def check_tables_agree(self, now: int) -> None:
        """Every live node's table, caught up to its commit index, equals the others' at the
        same applied offset."""
        seen: dict[int, tuple[int, Any]] = {}
        for node_id, node in self.world.nodes.items():
            if node.core is None or node_id not in self.indexes:
                continue
            self._catch_up(node)
            t = self.indexes[node_id].table
            seen[node_id] = (t.applied, t.to_snapshot())
        by_applied: dict[int, tuple[int, Any]] = {}
        for node_id, (applied, snap) in seen.items():
            other = by_applied.setdefault(applied, (node_id, snap))
            if other[1] != snap:
                self.world.checkers.fail(now, "subscription tables agree",
                                         f"nodes {other[0]} and {node_id} applied up to "
                                         f"{applied} but hold different tables")


@dataclass
class _Sub:
    """One subscription's consumer and what the checker knows about it."""

    name: str
    incarnation: int = 0
    open: bool = False
    position: int = -1  # the incarnation's next offset to read
    processed: int = -1  # position of what it processed
    outstanding: int = 0  # a request token, 0 = none
    acked: int = 0  # highest position a commit (or open) was acknowledged at
    sent_max: int = 0  # highest position ever sent in a commit
    delivered: set[int] = field(default_factory=set)
    resumes: int = 0

    @property
    def consumer(self) -> str:
        return f"{self.name}.{self.incarnation}"


class SubscriptionConsumers:
    """Consumers of `n` subscriptions under the nemesis, and the resume checker."""

    def __init__(self, world: "World", subs: SimSubscriptions, rng: random.Random) -> None:
        self.world = world
        self.subs = subs
        self.rng = rng
        self.consumers: list[_Sub] = []
        self.stopped = False
        self._tokens = 0

    def start(self, n: int) -> None:
        for i in range(n):
            c = _Sub(f"sub{i}")
            self.consumers.append(c)
            self.world.loop.after(self.rng.randint(0, 50_000), lambda c=c: self._open(c))

    def _later(self, c: _Sub, lo: int, hi: int, fn: Callable[[_Sub], None]) -> None:
        if not self.stopped:
            self.world.loop.after(self.rng.randint(lo, hi), lambda: fn(c))

    def _request(self, c: _Sub, op: OpRequest, done: Callable[[_Sub, Outcome], None]) -> None:
        """Send `op` to a node (the leader, mostly); retried after a timeout."""
        self._tokens += 1
        token = c.outstanding = self._tokens
        leaders = self.world.leaders()
        nodes = sorted(self.world.nodes)
        target = leaders[0] if leaders and self.rng.random() < 0.9 else self.rng.choice(nodes)

        def reply(outcome: Outcome) -> None:
            if c.outstanding == token:
                c.outstanding = 0
                done(c, outcome)

        def timeout() -> None:
            if c.outstanding == token:
                c.outstanding = 0
                done(c, Outcome(ErrorCode.TIMEOUT))

        self.world.loop.after(self.rng.randint(100, 1_000),
                              lambda: self.subs.submit(target, op, reply))
        self.world.loop.after(REQUEST_TIMEOUT_US, timeout)

    # -- open / resume ---------------------------------------------------------------------
    def _open(self, c: _Sub) -> None:
        if self.stopped or c.outstanding:
            return
        self._request(c, OpRequest(Op.OPEN, c.name, c.consumer, 0, LEASE_MS), self._opened)

    def _opened(self, c: _Sub, outcome: Outcome) -> None:
        if not outcome.ok:
            self._later(c, 2_000, 30_000, self._open)  # not leader, leased, lost: again
            return
        assert outcome.sub is not None
        p = int(outcome.sub["position"])
        self._check_resume(c, p)
        c.open, c.position, c.processed = True, p, p
        c.acked = max(c.acked, p)
        c.resumes += 1
        self._later(c, 500, 5_000, self._read)

    def _check_resume(self, c: _Sub, p: int) -> None:
        now = self.world.loop.now
        fail = self.world.checkers.fail
        if p < c.acked:
            fail(now, "subscription keeps acknowledged commits",
                 f"{c.name} resumed at {p} below its acknowledged commit {c.acked}")
        if p > c.sent_max:
            fail(now, "subscription has no gap",
                 f"{c.name} resumed at {p}, past every position ever committed ({c.sent_max})")
        missing = [o for o in self._data_offsets(p) if o not in c.delivered]
        if missing:
            fail(now, "subscription has no gap",
                 f"{c.name} resumed at {p} but committed records at {missing[:5]} were never "
                 f"delivered")

    def _data_offsets(self, below: int) -> list[int]:
        """Offsets of committed DATA records below `below` (from the most advanced node)."""
        nodes = [n for n in self.world.nodes.values() if n.core is not None]
        if not nodes:
            return []
        node = max(nodes, key=lambda n: n.core.commit_index)  # type: ignore[union-attr]
        out: list[int] = []
        off = node.log.start_offset
        upto = min(below - 1, node.core.commit_index)  # type: ignore[union-attr]
        while off <= upto:
            batches = node.log.read(off, 1 << 22)
            if not batches:
                break
            for b in batches:
                if b.base_offset > upto:
                    return out
                if b.kind == BatchKind.DATA:
                    out.extend(o for o in range(b.base_offset, b.last_offset + 1) if o <= upto)
                off = b.last_offset + 1
        return out

    # -- reading and committing ------------------------------------------------------------
    def _read(self, c: _Sub) -> None:
        if self.stopped or not c.open:
            return
        if self.rng.random() < 0.08:
            # The consumer crashes: what it processed since its last commit is read again.
            c.open, c.incarnation = False, c.incarnation + 1
            c.outstanding = 0
            self._later(c, 1_000, 40_000, self._open)
            return
        node = self.world.nodes[self.rng.choice(sorted(self.world.nodes))]
        if node.core is not None and node.up and not node.paused:
            n = self.rng.randint(1, 6)
            for offset, _ in self._records(node, c.position, n):
                c.delivered.add(offset)
                c.position = offset + 1
                c.processed = c.position
        if c.processed > c.acked and not c.outstanding and self.rng.random() < 0.5:
            c.sent_max = max(c.sent_max, c.processed)
            self._request(c, OpRequest(Op.COMMIT, c.name, c.consumer, c.processed, LEASE_MS),
                          self._committed)
        self._later(c, 2_000, 20_000, self._read)

    def _records(self, node: "SimNode", offset: int, n: int) -> list[tuple[int, bytes]]:
        """Up to n committed DATA records from `offset` on this node (a fetch)."""
        assert node.core is not None
        hw = node.core.commit_index
        out: list[tuple[int, bytes]] = []
        if offset < node.log.start_offset or offset > hw:
            return out
        try:
            batches = node.log.read(offset, 1 << 16)
        except CorruptBatch:
            return out  # damaged there: the fetch fails and the consumer reads again later
        for b in batches:
            if b.last_offset > hw or len(out) >= n:
                break
            if b.kind == BatchKind.DATA:
                for i, r in enumerate(decode_records(b.payload)):
                    if b.base_offset + i >= offset and len(out) < n:
                        out.append((b.base_offset + i, r.value))
        return out

    def _committed(self, c: _Sub, outcome: Outcome) -> None:
        if outcome.ok and outcome.sub is not None:
            c.acked = max(c.acked, int(outcome.sub["position"]))
        elif outcome.code == ErrorCode.SUBSCRIPTION_LEASED:
            c.open = False  # lost the lease (paused too long): open again
            c.incarnation += 1
            self._later(c, 1_000, 20_000, self._open)

    def check_final(self, leader: "SimNode") -> None:
        """On the converged cluster, each subscription's position as the leader's table holds
        it passes the resume checks (it is where the next consumer would start)."""
        table = self.subs.indexes[leader.node_id].table
        for c in self.consumers:
            sub = table.get(c.name)
            if sub is None:
                if c.resumes:
                    self.world.checkers.fail(self.world.loop.now, "subscription kept",
                                             f"{c.name} was opened but is gone from the table")
                continue
            self._check_resume(c, sub.position)

    def stats(self) -> dict[str, int]:
        return {"sub_resumes": sum(c.resumes for c in self.consumers),
                "sub_acked": sum(c.acked for c in self.consumers)}
