"""Groups on the wire: every raft message travels in its group's envelope (key "g" of the
message map, raft.protocol.raft_frames), left out for group 0 so a single-group node's frames are
unchanged; and one peer link carries many groups' messages without one group's stream rules
(superseded appends, heartbeat seqs) reaching into another's."""

from __future__ import annotations

import random

import msgpack
import pytest

from raft.core import messages as m
from raft.node.outbox import GroupOutbox
from raft.node.peer import PeerLink
from raft.protocol.framing import WireError, decode_body, encode_frame
from raft.protocol.raft_frames import (BatchEncodings, encode_raft_frame,
                                       group_message_from_wire, message_to_wire,
                                       messages_from_frame, raft_frame)
from storage.batch import Batch


def _ae(seq: int, group_tag: int = 0, nbatches: int = 1, prev: int | None = None,
        src: int = 1, dst: int = 2) -> m.AppendEntries:
    base = seq * 10_000
    batches = [Batch.create(bytes([group_tag]) * 10, 1).placed(base + i, 1)
               for i in range(nbatches)]
    return m.AppendEntries(src, dst, 1, base - 1 if prev is None else prev, 1, batches, 0,
                           False, seq)


def _hb(seq: int, src: int = 1, dst: int = 2) -> m.Heartbeat:
    return m.Heartbeat(src, dst, 1, 0, seq)


MIXED = [(0, _hb(1)), (3, _hb(2)), (3, _ae(3, 3, nbatches=2)), (0, _ae(4)),
         (2**40, m.RequestVoteReply(1, 2, 5, True)), (7, m.TimeoutNow(1, 2, 5))]


def test_group_ids_round_trip_through_both_encoders_in_order() -> None:
    plain = decode_body(encode_frame(raft_frame(MIXED))[4:])
    assert messages_from_frame(plain) == MIXED
    prefix, body = encode_raft_frame(MIXED, BatchEncodings())
    fast = decode_body(body)
    assert fast == plain  # the peer links' encoder writes the same document
    assert messages_from_frame(fast) == MIXED


def test_group_zero_leaves_the_key_out_and_its_frames_are_unchanged() -> None:
    """A single-group node's frames are byte for byte what they were before groups: no "g"."""
    msgs = [_hb(1), _ae(2, nbatches=2), m.RequestVote(1, 2, 3, 9, 2, False)]
    _, body = encode_raft_frame([(0, x) for x in msgs])
    for wire in decode_body(body)["msgs"]:
        assert "g" not in wire
    # What the encoder wrote before groups existed: the same maps without any envelope.
    before = msgpack.packb({"v": 1, "t": "raft",
                            "msgs": [message_to_wire(x) for x in msgs]}, use_bin_type=True)
    assert decode_body(body) == decode_body(before)
    assert encode_frame(raft_frame([(0, x) for x in msgs]))[4:] == before
    _, grouped = encode_raft_frame([(5, x) for x in msgs])
    assert all(w["g"] == 5 for w in decode_body(grouped)["msgs"])


def test_a_frame_of_an_old_node_decodes_as_group_zero() -> None:
    old = {"v": 1, "t": "raft", "msgs": [message_to_wire(_hb(4)), message_to_wire(_ae(5))]}
    assert messages_from_frame(decode_body(msgpack.packb(old, use_bin_type=True))) == [
        (0, _hb(4)), (0, _ae(5))]


@pytest.mark.parametrize("g, what", [
    (-1, "-1"),
    ("1", "'1'"),
    (True, "True"),
    (1.5, "1.5"),
    (None, "None"),
    ([1], "[1]"),
    ({"g": 1}, "{'g': 1}"),
    (b"\x01", "b'\\x01'"),
])
def test_a_bad_group_id_is_a_wire_error_naming_the_field(g: object, what: str) -> None:
    wire = {**message_to_wire(_hb(1)), "g": g}
    with pytest.raises(WireError, match='field "g" \\(group id\\) must be an integer >= 0') as e:
        group_message_from_wire(wire)
    assert what in str(e.value)


@pytest.mark.parametrize("wire, fragment", [
    ([], "must be a map"),
    ({"g": 1}, "unknown raft message kind"),
    ({"g": 1, "k": "hb"}, 'missing field "src"'),
    ({"g": 1, "k": "zz", "src": 1}, "unknown raft message kind"),
    ({**message_to_wire(m.Heartbeat(1, 2, 1, 0, 1)), "g": 1, "term": "x"}, '"term" must be an'),
    ({**message_to_wire(m.Heartbeat(1, 2, 1, 0, 1)), "g": -5}, '"g"'),
])
def test_malformed_envelopes_are_refused_with_what_is_wrong(wire: object, fragment: str) -> None:
    with pytest.raises(WireError, match=fragment):
        messages_from_frame({"v": 1, "t": "raft", "msgs": [wire]})


def test_a_large_group_id_survives_and_an_extra_key_is_ignored() -> None:
    wire = {**message_to_wire(_hb(1), group=2**63 - 1), "x": 1}
    assert group_message_from_wire(wire) == (2**63 - 1, _hb(1))


# -- one link, many groups ------------------------------------------------------------------------

class _Links:
    def __init__(self, link: PeerLink) -> None:
        self._link = link

    def link(self, node_id: int) -> PeerLink | None:
        return self._link if node_id == self._link.peer_id else None


def _one_link() -> PeerLink:
    return PeerLink(1, 2, "127.0.0.1:1", max_frame_bytes=16 << 20, queue_messages=100,
                    queue_bytes=64 << 20, backoff_min_s=0.05, backoff_max_s=1.0,
                    rng=random.Random(1))


def test_one_frame_carries_the_heartbeats_of_every_group_each_in_its_envelope() -> None:
    link = _one_link()
    outboxes = [GroupOutbox(_Links(link), g) for g in range(8)]
    for g, box in enumerate(outboxes):
        box.send(_hb(100 + g))
    frame = link._next_frame()
    assert frame == [(g, _hb(100 + g)) for g in range(8)]
    assert link._next_frame() == []


def test_a_restarted_stream_withdraws_only_its_own_groups_appends() -> None:
    """Two groups replicate to the same peer over one link. Group 1 restarts its stream to the
    peer (a lost append, a new term): its queued appends are obsolete and go; group 2's queued
    appends are another group's stream and must all still leave, in order."""
    link = _one_link()
    one, two = GroupOutbox(_Links(link), 1), GroupOutbox(_Links(link), 2)
    one.send(_ae(1, 1))
    two.send(_ae(1, 2))
    two.send(_ae(2, 2))
    one.send(_ae(2, 1))
    again = _ae(3, 1, prev=_ae(1).prev_offset)  # group 1 starts over from its first append
    one.send(again)
    assert link.superseded_messages == 2
    sent = link._next_frame()
    assert [(g, x.seq) for g, x in sent] == [(2, 1), (2, 2), (1, 3)]
    assert sent[0][1].batches[0].payload == bytes([2]) * 10


def test_a_heartbeat_seq_is_lowered_only_below_its_own_groups_queued_appends() -> None:
    link = _one_link()
    one, two = GroupOutbox(_Links(link), 1), GroupOutbox(_Links(link), 2)
    two.send(_ae(5, 2))
    one.send(_hb(9))  # group 1 has no append queued: another group's append is no reason
    two.send(_hb(9))
    assert [(g, x.seq) for g, x in link._next_frame()] == [(1, 9), (2, 4)]


# -- routing a frame's messages to the node's groups ----------------------------------------------

class _FakeGroup:
    """What the registry routes to: a core (any), `closing`, and `deliver_frame` (no node
    scrub scheduler to join)."""

    def __init__(self) -> None:
        self.core = object()
        self.closing = False
        self.scrub_scheduler = None
        self.got: list[tuple[int, list[m.Message]]] = []

    async def deliver_frame(self, msgs: list[m.Message], *, from_peer: int) -> None:
        self.got.append((from_peer, msgs))


def test_a_frame_is_routed_to_each_group_in_order_and_unknown_groups_are_counted() -> None:
    import trio

    from raft.node.registry import GroupRegistry

    registry = GroupRegistry(2)
    groups = {g: _FakeGroup() for g in (0, 1, 3)}
    for g, group in groups.items():
        registry.add(g, group, api=None)  # type: ignore[arg-type]
    frame = [(1, _hb(1)), (1, _hb(2)), (0, _hb(3)), (9, _hb(4)), (9, _hb(5)), (1, _hb(6)),
             (3, _ae(7)), (0, _hb(8))]
    trio.run(lambda: registry.deliver_frame(frame, from_peer=1))
    seen = {g: [x.seq for _, msgs in group.got for x in msgs] for g, group in groups.items()}
    assert seen == {0: [3, 8], 1: [1, 2, 6], 3: [7]}
    assert all(peer == 1 for group in groups.values() for peer, _ in group.got)
    assert registry.unknown_group_messages == 2
    assert registry.ids() == [0, 1, 3] and registry.api(9) is None
