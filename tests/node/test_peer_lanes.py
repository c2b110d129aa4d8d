"""A peer link's two lanes: heartbeats, replies and votes go before queued appends, appends
keep their order and go in bounded frames, and a heartbeat that overtakes appends carries a
seq below theirs (the leader's lost-request check assumes in-order delivery).

The lanes and bounds are the link's (raft.node.peer); which lane a message takes, superseded
appends and heartbeat seqs are the rules of one group's stream (raft.node.outbox.PeerStream),
so each test queues through a stream, as a group does."""

from __future__ import annotations

import random

from raft.core import messages as m
from raft.node import peer
from raft.node.outbox import PeerStream
from raft.node.peer import PeerLink
from storage.batch import Batch


def _link(queue_messages: int = 100,
          queue_bytes: int = 64 << 20) -> tuple[PeerLink, PeerStream]:
    link = PeerLink(1, 2, "127.0.0.1:1", max_frame_bytes=16 << 20,
                    queue_messages=queue_messages, queue_bytes=queue_bytes, backoff_min_s=0.05,
                    backoff_max_s=1.0, rng=random.Random(1))
    return link, PeerStream(link, 0)


def _frame(link: PeerLink) -> list[m.Message]:
    """The messages of the link's next frame (without their group ids)."""
    return [msg for _, msg in link._next_frame()]


def _ae(seq: int, nbatches: int = 1, size: int = 10) -> m.AppendEntries:
    batches = [Batch.create(b"x" * size, 1).placed(seq * 10_000 + i, 1) for i in range(nbatches)]
    return m.AppendEntries(1, 2, 1, seq * 10_000 - 1, 1, batches, 0, False, seq)


def test_control_messages_go_first_and_a_heartbeat_never_claims_to_follow_queued_appends() -> None:
    link, stream = _link()
    stream.send(_ae(5))
    stream.send(_ae(6))
    stream.send(m.Heartbeat(1, 2, 1, 0, 7))
    stream.send(m.RequestVoteReply(1, 2, 1, True))
    first = _frame(link)
    assert [type(x) for x in first] == [m.Heartbeat, m.RequestVoteReply]
    assert first[0].seq == 4  # below the first append still queued (seq 5)
    assert [x.seq for x in _frame(link) + _frame(link)] == [5, 6]


def test_a_heartbeat_behind_no_queued_append_keeps_its_seq() -> None:
    link, stream = _link()
    stream.send(m.Heartbeat(1, 2, 1, 0, 9))
    (hb,) = _frame(link)
    assert hb.seq == 9


def test_bulk_frames_are_bounded_in_bytes_and_batches_but_carry_at_least_one_append() -> None:
    link, stream = _link()
    for seq in range(1, 4):
        stream.send(_ae(seq, nbatches=peer.BULK_FRAME_BATCHES // 2 + 1))
    assert [len(_frame(link)) for _ in range(3)] == [1, 1, 1]
    big = _ae(9, nbatches=1, size=peer.BULK_FRAME_BYTES * 2)
    stream.send(big)
    stream.send(_ae(10))
    assert _frame(link) == [big]
    for seq in range(11, 20):
        stream.send(_ae(seq))
    assert [x.seq for x in _frame(link)] == [10, *range(11, 20)]  # small ones share


def test_a_full_bulk_lane_does_not_cost_a_heartbeat_its_place() -> None:
    link, stream = _link(queue_messages=2)
    assert stream.send(_ae(1)) and stream.send(_ae(2))
    assert not stream.send(_ae(3))
    assert stream.send(m.Heartbeat(1, 2, 1, 0, 4))
    assert link.dropped_messages == 1


def test_a_restarted_stream_drops_the_appends_it_supersedes() -> None:
    """A leader that resets a follower's stream (a lost request, a slow ack) resends from an
    earlier offset: the queued appends are obsolete, so they go, instead of piling up."""
    link, stream = _link()
    first, second = _ae(1, nbatches=2), _ae(2, nbatches=2)
    stream.send(first)
    stream.send(second)  # in order: kept
    assert link.superseded_messages == 0
    again = _ae(3, nbatches=1)
    again.prev_offset = first.prev_offset  # starts over
    stream.send(again)
    assert link.superseded_messages == 2
    assert [x.seq for x in _frame(link)] == [3]


def test_one_link_carries_several_streams_and_each_stream_keeps_its_own_rules() -> None:
    """The link is a node-pair pipe: a second sender's appends are neither withdrawn by the
    first one's restart nor taken as the first one's when its heartbeat overtakes them."""
    link, a = _link()
    b = PeerStream(link, 1)
    b.send(_ae(5))
    a.send(m.Heartbeat(1, 2, 1, 0, 9))  # a has nothing queued: its seq stands
    (hb,) = _frame(link)
    assert hb.seq == 9
    a.send(_ae(1, nbatches=2))
    again = _ae(2)
    again.prev_offset = _ae(1).prev_offset  # a starts over: only a's append is obsolete
    a.send(again)
    assert link.superseded_messages == 1
    assert [x.seq for x in _frame(link)] == [5, 2]


def test_a_heartbeat_sent_while_one_is_queued_replaces_it_and_leaves_in_its_place() -> None:
    link, stream = _link()
    stream.send(m.Heartbeat(1, 2, 1, 10, 7))
    stream.send(m.RequestVoteReply(1, 2, 1, True))
    stream.send(m.Heartbeat(1, 2, 1, 11, 8))
    stream.send(m.Heartbeat(1, 2, 1, 12, 9))
    stream.send(m.HeartbeatReply(1, 2, 1, 3, 5, 1, 5, 1))
    stream.send(m.HeartbeatReply(1, 2, 1, 4, 6, 1, 6, 1))
    assert len(link._control) == 3  # one heartbeat, the vote reply, one heartbeat reply
    out = _frame(link)
    assert [type(x) for x in out] == [m.Heartbeat, m.RequestVoteReply, m.HeartbeatReply]
    assert (out[0].commit_index, out[0].seq) == (12, 9)  # the newest, in the oldest's place
    assert (out[2].seq, out[2].dirty_offset) == (4, 6)
    # Once it has left, the next heartbeat queues again; a lost connection forgets them.
    stream.send(m.Heartbeat(1, 2, 1, 13, 10))
    assert [x.commit_index for x in _frame(link)] == [13]
    stream.send(m.Heartbeat(1, 2, 1, 14, 11))
    link._drop_queue()
    stream.send(m.Heartbeat(1, 2, 1, 15, 12))
    assert [x.commit_index for x in _frame(link)] == [15]


def test_heartbeats_of_different_groups_on_one_link_are_not_merged() -> None:
    link, a = _link()
    b = PeerStream(link, 1)
    a.send(m.Heartbeat(1, 2, 1, 1, 1))
    b.send(m.Heartbeat(1, 2, 1, 2, 1))
    a.send(m.Heartbeat(1, 2, 1, 3, 2))
    assert [(g, x.commit_index) for g, x in link._next_frame()] == [(0, 3), (1, 2)]
