"""The replicated subscription table (raft/core/subscription_table.py), the leader's accumulator
(raft/core/subscription_batcher.py) and the index that keeps the table current from a log
(raft/core/subscription_index.py): every rule, table-driven, on plain objects."""

from __future__ import annotations

import pytest

from raft.core.subscription_batcher import CommitBatcher
from raft.core.subscription_index import DataCounter, SubscriptionIndex
from raft.core.subscription_table import (
    MAX_NAME_CHARS,
    AutoReset,
    Subscription,
    Op,
    OpRequest,
    SubscriptionTable,
    decode_entry,
    make_entry,
    name_error,
)
from raft.core.types import ErrorCode
from storage.batch import Batch, BatchKind
from storage.memory import MemoryLog
from storage.records import encode_values

SRC = (1, 7, 1)


class Log:
    """Applies entries to a table at consecutive offsets, with DATA batches in between."""

    def __init__(self) -> None:
        self.table = SubscriptionTable()
        self.next = 0

    def data(self, n: int = 1) -> int:
        """n DATA records in one batch; returns the offset after them."""
        b = Batch.create(encode_values([b"x"] * n), n).placed(self.next, 1)
        self.table.apply(b)
        self.next = b.last_offset + 1
        return self.next

    def ops(self, *ops: OpRequest, ts: int = 1000):  # noqa: ANN201
        b = make_entry(SRC, list(ops), ts).placed(self.next, 1)
        self.next += 1
        applied = self.table.apply(b)
        assert applied is not None and applied.src == SRC
        return applied.outcomes

    def op(self, op: OpRequest, ts: int = 1000):  # noqa: ANN201
        (outcome,) = self.ops(op, ts=ts)
        return outcome


def open_(name: str = "s", consumer: str = "c1", at: int = 0, lease: int = 0) -> OpRequest:
    return OpRequest(Op.OPEN, name, consumer, at, lease)


def commit(pos: int, name: str = "s", consumer: str = "c1", lease: int = 0) -> OpRequest:
    return OpRequest(Op.COMMIT, name, consumer, pos, lease)


@pytest.mark.parametrize("name, fragment", [
    ("", "non-empty"),
    ("x" * (MAX_NAME_CHARS + 1), "the limit is 128"),
    ("with space", "characters outside"),
    ("slash/no", "characters outside"),
    ("é", "characters outside"),
])
def test_bad_names_are_refused_with_the_reason(name: str, fragment: str) -> None:
    assert fragment in (name_error(name) or "")
    log = Log()
    log.data(3)
    out = log.op(open_(name))
    assert out.code == ErrorCode.INVALID_SUBSCRIPTION_NAME and fragment in out.message


@pytest.mark.parametrize("name", ["orders", "a", "etl.v2:daily_1-x", "x" * MAX_NAME_CHARS])
def test_good_names(name: str) -> None:
    assert name_error(name) is None


def test_open_creates_once_then_commits_move_forward_only() -> None:
    log = Log()
    end = log.data(10)
    first = log.op(open_(at=3))
    assert first.ok and first.sub["position"] == 3 and first.sub["created_offset"] == end
    assert log.op(open_(at=9)).sub["position"] == 3  # exists: the initial position is ignored
    assert log.op(commit(7)).sub["position"] == 7
    assert log.op(commit(7)).ok  # equal: a heartbeat
    behind = log.op(commit(5))
    assert behind.code == ErrorCode.POSITION_BEHIND and behind.sub["position"] == 7
    past = log.op(commit(log.next + 5))
    assert past.code == ErrorCode.POSITION_PAST_HIGH_WATERMARK
    assert log.table.get("s").position == 7
    reset = log.op(OpRequest(Op.RESET, "s", "", 2))
    assert reset.ok and reset.sub["position"] == 2  # only a reset moves back
    assert log.op(commit(4)).sub["commits"] == 3


def test_unknown_subscriptions_and_delete() -> None:
    log = Log()
    log.data(2)
    for op in (commit(1, name="nope"), OpRequest(Op.DELETE, "nope", "", -1, -1),
               OpRequest(Op.RELEASE, "nope", "c1")):
        assert log.op(op).code == ErrorCode.UNKNOWN_SUBSCRIPTION
    assert log.op(OpRequest(Op.RESET, "new", "", 1)).sub["position"] == 1  # reset creates
    assert log.op(OpRequest(Op.DELETE, "new", "", -1, -1)).ok
    assert log.table.get("new") is None


def test_a_lease_refuses_other_consumers_until_it_expires_by_entry_stamps() -> None:
    log = Log()
    log.data(5)
    assert log.op(open_(consumer="a", lease=500), ts=1000).sub["lease_holder"] == "a"
    refused = log.op(open_(consumer="b", lease=500), ts=1200)
    assert refused.code == ErrorCode.SUBSCRIPTION_LEASED and "'a'" in refused.message
    assert log.op(commit(3, consumer="b"), ts=1300).code == ErrorCode.SUBSCRIPTION_LEASED
    assert log.op(OpRequest(Op.RESET, "s", "", 0), ts=1300).code == \
        ErrorCode.SUBSCRIPTION_LEASED
    assert log.op(commit(3, consumer="a", lease=500), ts=1400).ok  # renews: until 1900
    assert log.op(open_(consumer="b", lease=500), ts=1800).code == \
        ErrorCode.SUBSCRIPTION_LEASED
    taken = log.op(open_(consumer="b", lease=500), ts=1900)
    assert taken.ok and taken.sub["lease_holder"] == "b" and taken.sub["position"] == 3
    # The fenced consumer's late commit is refused.
    assert log.op(commit(5, consumer="a"), ts=1950).code == ErrorCode.SUBSCRIPTION_LEASED
    assert log.op(OpRequest(Op.RELEASE, "s", "b"), ts=2000).ok
    assert log.op(commit(4, consumer="a"), ts=2001).ok  # released: anyone may commit


def test_a_new_leader_with_a_clock_behind_cannot_revive_an_expired_lease() -> None:
    log = Log()
    log.data(2)
    log.op(open_(consumer="a", lease=1000), ts=1000)  # until 2000
    log.op(open_(name="other"), ts=5000)  # the log's time passes the lease
    # A new leader whose clock is behind stamps an earlier time: the lease stays expired.
    assert log.op(open_(consumer="b", lease=1000), ts=1500).ok


def test_a_pin_holds_until_a_commit_reaches_it() -> None:
    log = Log()
    log.data(10)
    pinned = log.op(OpRequest(Op.PIN, "etl", "spark", 10, 0))  # created at 0, ends at 10
    assert (pinned.sub["position"], pinned.sub["pin_end"]) == (0, 10)
    log.data(5)
    again = log.op(OpRequest(Op.PIN, "etl", "spark", log.next, 0))
    assert again.sub["pin_end"] == 10  # a re-plan or retry reads the same range
    assert log.op(commit(6, name="etl", consumer="spark")).sub["pin_end"] == 10
    assert log.op(commit(10, name="etl", consumer="spark")).sub["pin_end"] is None
    end = log.next
    assert log.op(OpRequest(Op.PIN, "etl", "spark", end, 0)).sub["pin_end"] == end


def test_expiry_spares_used_and_leased_subscriptions() -> None:
    log = Log()
    log.data(2)
    log.op(open_(name="idle"), ts=1000)
    log.op(open_(name="busy"), ts=1000)
    log.op(open_(name="leased", consumer="x", lease=600_000), ts=1000)
    log.op(commit(1, name="busy"), ts=50_000)
    assert log.table.expired(now_ms=62_000, expiry_ms=60_000) == [("idle", 1000)]
    # Guarded by the stamp it saw: a use in between keeps it.
    log.op(commit(1, name="idle"), ts=62_500)
    assert log.op(OpRequest(Op.DELETE, "idle", "", -1, 1000)).ok
    assert log.table.get("idle") is not None
    assert log.op(OpRequest(Op.DELETE, "idle", "", -1, 62_500)).ok
    assert log.table.get("idle") is None
    assert [n for n, _ in log.table.expired(now_ms=700_000, expiry_ms=60_000)] == \
        ["busy", "leased"]


def test_entries_apply_in_order_and_foreign_control_is_ignored() -> None:
    t = SubscriptionTable()
    with pytest.raises(ValueError, match="apply committed batches in order"):
        t.apply(make_entry(SRC, [open_()], 0).placed(3, 1))
    foreign = Batch.create(b"\x81\xa3ctl\xaaload_begin", 1,
                           kind=BatchKind.CONTROL).placed(0, 1)
    assert t.apply(foreign) is None and t.applied == 0
    garbage = Batch.create(b"\xc1", 1, kind=BatchKind.CONTROL).placed(1, 1)
    assert t.apply(garbage) is None
    (bad,) = t.apply(Batch.create(
        __import__("msgpack").packb({"ctl": "sub_ops", "src": [1], "ops": [["??"]]}), 1,
        kind=BatchKind.CONTROL).placed(2, 1)).outcomes
    assert bad.code == ErrorCode.BAD_REQUEST
    assert decode_entry(make_entry(SRC, [commit(1)], 0).payload)[1] == [commit(1)]


def test_snapshot_round_trip_and_malformed_snapshots() -> None:
    log = Log()
    log.data(4)
    log.op(open_(name="a", consumer="x", lease=100), ts=10)
    log.op(commit(3, name="a", consumer="x"), ts=20)
    log.op(OpRequest(Op.PIN, "b", "spark", 4, 1), ts=30)
    snap = log.table.to_snapshot()
    back = SubscriptionTable.from_snapshot(snap)
    assert back.to_snapshot() == snap and back.applied == log.table.applied
    assert back.holds() == [("subscription 'b'", 1), ("subscription 'a'", 3)]
    assert back.min_position() == (1, "b")
    for bad in (None, {"v": 2}, {**snap, "subs": [["bad name", 1, 0, 0, 0, "", 0, "", 0, 0, 0]]},
                {**snap, "applied": "x"}):
        with pytest.raises(ValueError, match="malformed"):
            SubscriptionTable.from_snapshot(bad)


# -- the accumulator ------------------------------------------------------------------------------
def test_a_reset_forward_records_the_offsets_it_skipped_and_back_does_not() -> None:
    """Issue 29: `raftlog subscriptions` says records were skipped, on every node: the count is
    in the replicated table."""
    log = Log()
    log.op(open_(at=0))
    end = log.data(10)
    assert log.op(commit(3)).ok
    moved = log.op(OpRequest(Op.RESET, "s", "", end))  # 3 -> 10: seven offsets never read
    assert moved.ok and moved.sub["position"] == end
    assert (moved.sub["skipped_offsets"], moved.sub["resets"]) == (end - 3, 1)
    back = log.op(OpRequest(Op.RESET, "s", "", 1))  # back: re-reads, skips nothing
    assert (back.sub["skipped_offsets"], back.sub["resets"]) == (end - 3, 2)
    assert log.table.to_snapshot() == SubscriptionTable.from_snapshot(
        log.table.to_snapshot()).to_snapshot()


def test_a_conditional_reset_applies_only_at_the_position_it_saw() -> None:
    """Two consumers whose position retention passed both reset it: the second one's reset
    (guarded by the position it saw) must not move it again."""
    log = Log()
    log.op(open_(at=0))
    end = log.data(10)
    first = log.op(OpRequest(Op.RESET, "s", "c1", 5, expect=0))
    assert first.ok and first.sub["position"] == 5 and first.sub["skipped_offsets"] == 5
    assert log.op(commit(7, consumer="c1")).ok
    second = log.op(OpRequest(Op.RESET, "s", "c2", 5, expect=0))
    assert second.ok and second.sub["position"] == 7  # it answers where the subscription is
    assert (second.sub["skipped_offsets"], second.sub["resets"]) == (5, 1)
    assert log.op(OpRequest(Op.RESET, "s", "c2", end, expect=7)).sub["position"] == end


def test_an_open_that_names_a_reset_policy_stores_it() -> None:
    log = Log()
    assert log.op(open_()).sub["auto_reset"] == "none"  # the default
    log.data(2)
    got = log.op(OpRequest(Op.OPEN, "s", "c1", 0, 0, auto_reset="earliest"))
    assert got.sub["auto_reset"] == "earliest"
    assert log.op(open_()).sub["auto_reset"] == "earliest"  # an open naming none keeps it
    assert log.op(OpRequest(Op.OPEN, "t", "c1", 0, 0, auto_reset="latest")
                  ).sub["auto_reset"] == "latest"  # set on creation too
    snap = SubscriptionTable.from_snapshot(log.table.to_snapshot())
    assert snap.get("s").auto_reset == "earliest"  # type: ignore[union-attr]
    # A policy that is not one of the three makes the operation malformed, not stored.
    item = OpRequest(Op.OPEN, "s", "c1", 0, 0, auto_reset="earliest").encode()
    item[5]["auto_reset"] = "sometimes"
    assert OpRequest.decode(item) is None
    assert [p.value for p in AutoReset] == ["none", "earliest", "latest"]


def test_entries_and_snapshots_written_before_the_reset_fields_still_apply() -> None:
    """Old five-item operations decode with the defaults; an old eleven-item snapshot entry
    loads with policy none and nothing skipped."""
    old = ["reset", "s", "", 4, 0]
    assert OpRequest.decode(old) == OpRequest(Op.RESET, "s", "", 4, 0)
    assert OpRequest(Op.RESET, "s", "", 4, 0).encode() == old  # unchanged on the wire
    log = Log()
    log.data(5)
    b = Batch.create(__import__("msgpack").packb(
        {"ctl": "sub_ops", "src": list(SRC), "ops": [old]}), 1,
        kind=BatchKind.CONTROL, timestamp_ms=1).placed(log.next, 1)
    (outcome,) = log.table.apply(b).outcomes  # type: ignore[union-attr]
    assert outcome.ok and outcome.sub["position"] == 4
    sub = Subscription.from_list(["s", 4, 0, 5, -1, "", -1, "", -1, -1, 0])
    assert (sub.auto_reset, sub.skipped_offsets, sub.resets) == ("none", 0, 0)


def test_batcher_coalesces_a_consumers_commits_and_bounds_everything() -> None:
    b: CommitBatcher[str] = CommitBatcher(linger_ms=2, max_ops=3, max_pending=5, max_inflight=1)
    assert b.due_at() is None
    assert b.add(commit(5), "w1", now_ms=100)
    assert b.add(commit(9), "w2", now_ms=101)  # same consumer, later position: folded
    assert b.add(commit(4), "w3", now_ms=101)  # lower: its own slot (it will be refused)
    assert b.add(commit(12), "w4", now_ms=101)  # not folded into the lower one
    assert b.add(commit(3, name="t", consumer="c2"), "w5", now_ms=101)
    assert b.add(open_(name="u"), "w6", now_ms=101)
    assert not b.add(open_(name="v"), "w7", now_ms=101)  # max_pending: BACKPRESSURE
    assert b.ops_coalesced == 1 and b.pending == 5
    assert b.can_send(now_ms=100)  # max_ops reached: no need to linger
    out = b.take()
    assert [(s.op.position, s.waiters) for s in out.slots] == \
        [(9, ["w1", "w2"]), (4, ["w3"]), (12, ["w4"])]
    assert not b.can_send(now_ms=1000)  # one entry in flight at most
    b.done()
    assert b.can_send(now_ms=101)  # the rest is due at once
    rest = b.take()
    assert [s.op.name for s in rest.slots] == ["t", "u"]
    b.done()
    b.add_barrier("r", now_ms=200)
    assert not b.can_send(now_ms=201) and b.can_send(now_ms=202)
    assert b.take().barriers == ["r"]


def test_batcher_does_not_fold_across_another_operation_on_the_name() -> None:
    b: CommitBatcher[str] = CommitBatcher()
    b.add(commit(5), "w1", 0)
    b.add(OpRequest(Op.RESET, "s", "", 0), "w2", 0)
    b.add(commit(6), "w3", 0)
    assert [s.op.op for s in b.take().slots] == [Op.COMMIT, Op.RESET, Op.COMMIT]


# -- the index and lag -----------------------------------------------------------------------------
def test_index_rebuilds_from_the_log_and_reports_our_verdicts() -> None:
    log = MemoryLog()
    batches = [Batch.create(encode_values([b"a"] * 3), 3),
               make_entry(SRC, [open_(at=1)], 5),
               Batch.create(encode_values([b"bb"] * 2), 2),
               make_entry(SRC, [commit(4)], 6)]
    off = 0
    for b in batches:
        log.append([b.placed(off, 1)])
        off += b.count
    log.flush()
    seen = []
    idx = SubscriptionIndex(log)
    assert not idx.catch_up(commit_index=off + 5, on_applied=seen.append)  # past the log end
    assert idx.table.get("s").position == 4 and len(seen) == 2
    assert idx.lag(4, off) == (2, idx.counter.nbytes[-1] - idx.counter.at(4)[1], True)
    assert idx.lag(0, off)[0] == 5
    again = SubscriptionIndex(log)
    assert again.catch_up(off - 2) and again.table.get("s").position == 1


def test_counter_is_exact_near_the_tail_and_interpolates_the_thinned_past() -> None:
    c = DataCounter(0, max_points=8)
    off = 0
    for i in range(40):
        kind = BatchKind.CONTROL if i % 5 == 4 else BatchKind.DATA
        b = Batch.create(encode_values([b"v"] * 2) if kind == BatchKind.DATA else b"x", 2 if
                         kind == BatchKind.DATA else 1, kind=kind).placed(off, 1)
        c.add(b)
        off = b.last_offset + 1
    assert len(c.offsets) <= 8
    records, _, exact = c.lag(off - 3, off)  # recent: exact
    assert exact and records == 2
    records, _, exact = c.lag(1, off)  # thinned: an estimate
    assert not exact and abs(records - 63) <= 4
    assert c.lag(off, off)[:2] == (0, 0)


# -- topic subscriptions: members (raft/core/subscription_members.py) --------------------------
def member(mode: str, consumer: str, lease: int = 1000) -> OpRequest:
    op = Op.RELEASE if mode == "leave" else Op.OPEN
    return OpRequest(op, "s", consumer, 0, lease if op == Op.OPEN else 0, member=mode)


def test_members_watch_take_and_leave_a_partition_by_entry_stamps() -> None:
    log = Log()
    log.data(3)
    got = log.op(member("take", "a"), ts=1000)
    assert got.ok and got.sub["lease_holder"] == "a" and got.sub["members"] == ["a"]
    # Another member is counted but not given a running lease, and is not refused.
    got = log.op(member("take", "b"), ts=1100)
    assert got.ok and got.sub["lease_holder"] == "a" and got.sub["members"] == ["a", "b"]
    assert log.op(commit(2, consumer="b"), ts=1150).code == ErrorCode.SUBSCRIPTION_LEASED
    assert log.op(member("watch", "c"), ts=1200).sub["members"] == ["a", "b", "c"]
    # a stops renewing: at 2000 its lease and membership are over; b takes the partition.
    got = log.op(member("take", "b"), ts=2000)
    assert got.sub["lease_holder"] == "b" and got.sub["members"] == ["b", "c"]
    assert log.op(commit(2, consumer="a"), ts=2001).code == ErrorCode.SUBSCRIPTION_LEASED
    assert log.op(commit(2, consumer="b"), ts=2002).ok
    got = log.op(member("leave", "b"), ts=2003)
    assert got.ok and got.sub["lease_holder"] is None and got.sub["members"] == ["c"]
    bad = log.op(OpRequest(Op.OPEN, "s", "", 0, 1000, member="take"), ts=2004)
    assert bad.code == ErrorCode.BAD_REQUEST
    # Members survive a snapshot; a snapshot written before members (14 items) still loads.
    snap = log.table.to_snapshot()
    again = SubscriptionTable.from_snapshot(snap)
    assert again.describe("s") == log.table.describe("s")
    old = {**snap, "subs": [item[:14] for item in snap["subs"]]}
    assert SubscriptionTable.from_snapshot(old).get("s").members == {}


def _settle(members: list[str], partitions: int, holders: dict[int, str | None],
            rounds: int = 12) -> dict[int, str | None]:
    """Run member rounds against an ideal partition table (each take wins if the partition is
    free when it arrives), members one after another, until nothing moves."""
    from raft.core.subscription_members import PartitionView, plan
    for _ in range(rounds):
        before = dict(holders)
        for m in members:
            views = {p: PartitionView(h, tuple(members)) for p, h in holders.items()}
            pl = plan(m, views, range(partitions))
            for p in pl.release:
                holders[p] = None
            for p in pl.take:
                if holders[p] is None:
                    holders[p] = m
        if holders == before:
            return holders
    raise AssertionError(f"no convergence: {holders}")


def test_member_rounds_share_a_topic_fairly_and_stickily() -> None:
    from raft.core.subscription_members import quotas
    held = _settle(["a", "b"], 6, {p: None for p in range(6)})
    counts = {m: sum(1 for h in held.values() if h == m) for m in "ab"}
    assert counts == {"a": 3, "b": 3}
    before = dict(held)
    held = _settle(["a", "b", "c"], 6, held)
    counts = {m: sum(1 for h in held.values() if h == m) for m in "abc"}
    assert counts == {"a": 2, "b": 2, "c": 2}
    # Sticky: a and b kept two of their own each; only the extras moved.
    assert sum(1 for p, h in held.items() if h in "ab" and before[p] == h) == 4
    held = _settle(["a", "c"], 6, {p: (None if h == "b" else h) for p, h in held.items()})
    assert sorted(held.values()) == ["a", "a", "a", "c", "c", "c"]
    # 7 partitions, 3 members: the extra stays with the member holding most.
    assert quotas(["a", "b", "c"], {"a": 1, "b": 4, "c": 2}, 7) == {"b": 3, "c": 2, "a": 2}


def test_a_read_done_elsewhere_applies_as_the_index_would_have_read_it() -> None:
    """The node's maintenance reads in a worker thread (`next_read`, `read_heads`,
    `apply_read`): the table, the verdicts and the counter come out as `catch_up` makes them,
    and a read the table has moved past meanwhile is not applied."""
    from raft.core.subscription_index import TABLE_KINDS

    log = MemoryLog()
    batches = [Batch.create(encode_values([b"a"] * 3), 3), make_entry(SRC, [open_(at=1)], 5),
               Batch.create(encode_values([b"bb"] * 2), 2), make_entry(SRC, [commit(4)], 6),
               Batch.create(encode_values([b"c"]), 1)]
    off = 0
    for b in batches:
        log.append([b.placed(off, 1)])
        off += b.count
    log.flush()
    direct, seen_direct = SubscriptionIndex(log), []
    assert direct.catch_up(off - 1, on_applied=seen_direct.append)
    read, seen_read = SubscriptionIndex(log), []
    while (pending := read.next_read(off - 1)) is not None:
        got = log.read_heads(pending.start, 40, 2, TABLE_KINDS)  # small reads: several rounds
        stale = read.table.applied
        read.apply_read(pending, got, on_applied=seen_read.append)
        assert read.table.applied > stale
    assert read.table.to_snapshot() == direct.table.to_snapshot()
    assert [a.src for a in seen_read] == [a.src for a in seen_direct]
    assert read.lag(0, off) == direct.lag(0, off)
    # A read from before the table moved on (a synchronous catch-up ran meanwhile): ignored.
    again = SubscriptionIndex(log)
    pending = again.next_read(off - 1)
    assert pending is not None
    early = log.read_heads(pending.start, 1 << 20, None, TABLE_KINDS)
    assert again.catch_up(3)
    assert not again.apply_read(pending, early) and again.table.applied == 3


def test_a_read_applies_only_what_was_committed_when_it_began() -> None:
    """The read runs in a worker thread while the log goes on. Here the entry past the commit
    index it began at (an uncommitted subscription open) is cut and replaced by a new
    leader's, which commits, all before the read comes back: the read's copy of the cut entry
    must not be applied (the table would hold a subscription the log never committed)."""
    from raft.core.subscription_index import TABLE_KINDS

    log = MemoryLog()
    log.append([Batch.create(encode_values([b"a"] * 3), 3).placed(0, 1),
                make_entry(SRC, [open_("cut", at=1)], 5).placed(3, 1)])
    log.flush()
    index = SubscriptionIndex(log)
    pending = index.next_read(2)  # offsets 0-2 committed; the open at 3 is not
    assert pending is not None
    got = log.read_heads(pending.start, 1 << 20, None, TABLE_KINDS)  # (the worker's read)
    log.truncate_suffix(2)  # a new leader cuts it, appends its own entry, and commits it
    log.append([make_entry(SRC, [open_("kept", at=2)], 6).placed(3, 2)])
    log.flush()
    assert index.apply_read(pending, got)  # caught up with what was committed at its start
    assert index.table.applied == 2 and "cut" not in index.table.to_snapshot().__repr__()
    assert index.catch_up(3)  # the next round reads the committed entry
    snap = repr(index.table.to_snapshot())
    assert "kept" in snap and "cut" not in snap
