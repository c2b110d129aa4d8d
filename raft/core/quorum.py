"""Majority arithmetic, kept apart so the commit rule and vote counting have one definition each
(etcd-io/raft's quorum/ package does the same). Pure functions over plain values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum


def majority(n_voters: int) -> int:
    """How many of `n_voters` make a quorum."""
    if n_voters < 1:
        raise ValueError("a configuration needs at least one voter")
    return n_voters // 2 + 1


def committed_index(values: Iterable[int]) -> int:
    """The highest offset that a majority of voters holds (one value per voter: each voter's
    *durable* offset, never its dirty one). With values sorted high to low it is the one at
    position majority - 1: that many voters are at or above it."""
    ranked = sorted(values, reverse=True)
    if not ranked:
        raise ValueError("no voters")
    return ranked[majority(len(ranked)) - 1]


class VoteResult(Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def vote_result(voters: Iterable[int], votes: Mapping[int, bool]) -> VoteResult:
    """WON once a majority granted, LOST once a majority can no longer grant, else PENDING.
    Votes from non-voters are ignored."""
    voter_list = list(voters)
    need = majority(len(voter_list))
    granted = sum(1 for v in voter_list if votes.get(v) is True)
    refused = sum(1 for v in voter_list if votes.get(v) is False)
    if granted >= need:
        return VoteResult.WON
    if len(voter_list) - refused < need:
        return VoteResult.LOST
    return VoteResult.PENDING
