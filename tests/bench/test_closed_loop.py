"""The closed-loop writers (bench/closed_loop.py) against a fake node on socket pairs: each
writer keeps exactly one write in flight (the next is sent only after this one's reply), every
write is a produce frame of its own id, and only replies inside the measured window count."""

from __future__ import annotations

import socket
import threading
import time

from bench.closed_loop import ClosedArgs, _Writer, closed_round
from raft.protocol.framing import FrameDecoder, encode_frame
from raft.protocol.replies import ProduceOk
from storage.records import encode_values


def _fake_node(sock: socket.socket, seen: list[int], overlap: list[int],
               stop: threading.Event) -> None:
    """Answers every produce with ok; notes its id, and any request read while one was
    still unanswered (there must be none)."""
    decoder = FrameDecoder(1 << 20)
    sock.settimeout(0.05)
    while not stop.is_set():
        try:
            data = sock.recv(1 << 16)
        except socket.timeout:
            continue
        if not data:
            return
        decoder.feed(data)
        frames = []
        while (f := decoder.next_frame()) is not None:
            frames.append(f)
        if len(frames) > 1:
            overlap.append(len(frames))
        for f in frames:
            assert f["t"] == "produce" and f["count"] == 1
            seen.append(f["id"])
            sock.sendall(encode_frame(ProduceOk(0, 0, False).to_frame(f["id"])))


def test_writers_keep_one_write_in_flight_and_count_the_window() -> None:
    pairs = [socket.socketpair() for _ in range(4)]
    stop = threading.Event()
    seen: list[list[int]] = [[] for _ in pairs]
    overlap: list[int] = []
    threads = [threading.Thread(target=_fake_node, args=(b, seen[i], overlap, stop),
                                daemon=True) for i, (_, b) in enumerate(pairs)]
    for t in threads:
        t.start()
    writers = []
    for a, _ in pairs:
        a.setblocking(False)
        writers.append(_Writer(a))
    args = ClosedArgs("fake:1", len(pairs), warmup=0.05, duration=0.15)
    payload = encode_values([b"x" * 10])
    try:
        first = closed_round(writers, args, payload, time.monotonic())
        second = closed_round(writers, args, payload, time.monotonic())
    finally:
        stop.set()
        for t in threads:
            t.join(1)
        for a, b in pairs:
            a.close()
            b.close()
    assert overlap == []  # never a second write before the first's reply
    for ids in seen:  # ids go on across rounds, one per write
        assert ids == list(range(1, len(ids) + 1))
    for res in (first, second):
        assert res["errors"] == {}
        assert 0 < res["ok"] <= sum(len(ids) for ids in seen)
        assert res["rps"] == res["ok"] / args.duration
    assert all(w.rid == 0 for w in writers)  # nothing left in flight after a round


def test_only_closed64_leaves_out_the_open_loop_rates() -> None:
    from types import SimpleNamespace

    import argparse

    from bench.cli import add_arguments, config_from_args
    from bench.workloads import latency

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(["latency", "--only", "closed64", "--repeats", "2"]))
    assert latency.rates(cfg) == ()
    assert latency.steps(cfg) == 2  # the closed-loop writers' repeats alone
    assert latency.rates(SimpleNamespace(quick=False, only=[])) == latency.DEFAULT_RATES
