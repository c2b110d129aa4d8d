"""Finding where a follower's log stops matching the leader's, a whole term per round trip.

The follower rejects an AppendEntries whose (prev offset, prev term) it does not hold and sends a
hint: the term it has at that offset and where that term starts in its log (or, when its log is
too short, just its dirty offset + 1). The leader then jumps back over the whole conflicting run
instead of one batch per round trip (the Raft paper's optimisation, as etcd and the RFC do it),
and never probes at or past the offset that was just rejected.

Terms never decrease along a log, so both searches are binary searches over `term_at`.
"""

from __future__ import annotations

from storage.api import LogStorage


def conflict_hint(log: LogStorage, prev_offset: int) -> tuple[int, int]:
    """Follower side: (conflict term, conflict offset) for a rejected `prev_offset`. Term 0 means
    "my log ends before it": resend from the offset given."""
    if prev_offset > log.dirty_offset:
        return 0, log.dirty_offset + 1
    term = log.term_at(prev_offset)
    return term, first_offset_of_term(log, term, prev_offset)


def backoff_next(log: LogStorage, conflict_term: int, conflict_offset: int,
                 reject_offset: int) -> int:
    """Leader side: the next offset to probe after a rejection carrying these hints."""
    if conflict_term == 0:
        nxt = conflict_offset
    else:
        # If we hold entries of the follower's conflicting term, those match up to our
        # last one of that term; otherwise its whole run of that term is wrong: resend from
        # where that term starts on the follower.
        limit = log.dirty_offset if reject_offset < 0 else min(log.dirty_offset, reject_offset)
        last = last_offset_with_term_at_most(log, conflict_term, limit)
        if last >= log.start_offset and log.term_at(last) == conflict_term:
            nxt = last + 1
        else:
            nxt = conflict_offset
    if reject_offset >= 0:
        nxt = min(nxt, reject_offset)  # always strictly below the rejected probe
    return max(min(nxt, log.dirty_offset + 1), 0)


def first_offset_of_term(log: LogStorage, term: int, upto: int) -> int:
    """First offset in [start, upto] whose entry has `term`."""
    lo, hi = log.start_offset, upto
    while lo < hi:
        mid = (lo + hi) // 2
        if log.term_at(mid) < term:
            lo = mid + 1
        else:
            hi = mid
    return lo


def last_offset_with_term_at_most(log: LogStorage, term: int, upto: int) -> int:
    """Last offset in [start - 1, upto] whose term is <= `term`."""
    lo, hi = log.start_offset - 1, upto
    if hi < lo:
        return lo
    if log.term_at(lo) > term:
        return lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if log.term_at(mid) <= term:
            lo = mid
        else:
            hi = mid - 1
    return lo
