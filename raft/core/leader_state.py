"""What only a leader holds (after etcd-io/raft's tracker): the progress of each follower,
the quorum produces waiting for the commit index, the leadership transfer under way, and the
leader's clocks.

RaftCore keeps it in `self.leader`, created by `_become_leader` and dropped when the node steps
down, so no follower can act on a progress table, a transfer or a waiting produce left from a
term it no longer leads: `self.leader is not None` exactly while `self.role` is LEADER.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from raft.core.backlog import Backlog
from raft.core.open_batch import OpenBatch
from raft.core.progress import FollowerProgress


@dataclass(slots=True)
class Waiting:
    """A quorum produce waiting for the commit index."""

    request_id: int
    base_offset: int
    last_offset: int
    duplicate: bool = False


@dataclass(slots=True)
class LeaderState:
    # One FollowerProgress per member other than the leader (raft/core/leader.py,
    # raft/core/confchange.py).
    progress: dict[int, FollowerProgress] = field(default_factory=dict)
    # Quorum produces (and membership changes) awaiting commit, lowest last offset first.
    waiting: deque[Waiting] = field(default_factory=deque)
    # This leader's no-op: once the commit index passes it, the leader has committed an entry
    # of its term (a membership change waits for that: raft/core/confchange.py).
    noop_offset: int = -1
    transfer_target: int | None = None  # leadership is moving there: proposals are refused
    transfer_elapsed: int = 0  # ticks since the transfer began (given up after a timeout)
    heartbeat_elapsed: int = 0
    check_quorum_elapsed: int = 0
    # Quiescence (raft/core/quiesce.py): ticks in a row with nothing to do; the first heartbeat
    # seq of the quiescing round (-1: none under way); followers that answered it quiesced.
    idle_ticks: int = 0
    quiesce_seq: int = -1
    quiesce_acked: set[int] = field(default_factory=set)
    # Bytes appended in this term past the commit index (acks leader/none wait beyond a bound).
    backlog: Backlog = field(default_factory=Backlog)
    # Client writes proposed since the last Ready pass, to be appended as one batch
    # (raft/core/merging.py); never appended if leadership ends first.
    open: OpenBatch | None = None
