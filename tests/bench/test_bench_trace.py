"""`raftlog bench trace`'s matching of node events to sampled writes (bench/workloads/trace.py)."""

from __future__ import annotations

from bench.workloads.trace import Sample, _Series, _stamps


def test_first_event_covering_an_offset_after_the_send() -> None:
    s = _Series()
    for t, offset in ((1.0, 5), (2.0, 9), (3.0, 12)):
        s.add(t, offset)
    assert s.first(9, 0.0) == 2.0  # the first event covering offset 9
    assert s.first(6, 0.0) == 2.0  # covers 6 too (events report the end of what they carry)
    assert s.first(5, 2.5) == 3.0  # none before the write was sent
    assert s.first(13, 0.0) is None  # not covered yet


def test_a_write_is_measured_on_its_quorum_follower() -> None:
    series: dict = {}

    def add(node: int, kind: str, t: float, offset: int, peer: int = 0) -> None:
        series.setdefault((node, kind, 1, peer), _Series()).add(t, offset)

    # Leader 1: follower 3's reply comes first, so stages are measured on node 3.
    add(1, "reply_read", 5.0, 10, peer=2)
    add(1, "reply_read", 4.0, 10, peer=3)
    add(1, "net_send", 2.0, 10, peer=3)
    add(3, "f_read", 2.5, 10, peer=1)
    st = _stamps(Sample(1, sent=1.0, received=6.0, offset=10), 1, [2, 3], 1, series, {})
    assert st["L_reply_read"] == 4.0 and st["F_f_read"] == 2.5 and st["L_net_send"] == 2.0
    assert st["c_send"] == 1.0 and st["c_recv"] == 6.0
