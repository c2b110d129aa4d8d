"""Hostile and broken input against a live 3-node cluster, while a producer keeps writing.

The cluster (trio, in-process Nodes on port 0) runs in a background thread for the whole module
so hypothesis can drive plain blocking sockets at it, example after example. Every bad frame must
get a clear error frame and a closed connection (an unknown request type: an error reply, and the
connection stays usable). At the end, everything the concurrent producer had acknowledged must be
in the log exactly once, at its acknowledged offset.
"""

from __future__ import annotations

import socket
import struct
import threading
import traceback
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inproc_cluster import (Producer, RawClient, check_acked, read_all, running_cluster)
from raft.protocol.framing import encode_frame

MAX_FRAME = 256 * 1024
SOCKET_TIMEOUT_S = 20.0


class LiveCluster:
    """A 3-node cluster plus a quorum producer, running in a trio loop on its own thread."""

    def __init__(self) -> None:
        self.addresses: list[str] = []
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.acked: list[tuple[int, list[bytes]]] = []
        self.records: list[tuple[int, bytes]] | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("cluster did not start")
        if self.error:
            raise self.error

    def stop(self) -> None:
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(60)

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as e:  # surfaced by the final test
            traceback.print_exc()
            self.error = e
            self.ready.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with running_cluster(3, max_frame_bytes=MAX_FRAME, max_fetch_wait_ms=200,
                                   max_timeout_ms=2000, default_timeout_ms=2000) as cluster:
            await cluster.wait_leader()
            self.addresses = [n.address for n in cluster.nodes]
            producer = Producer(self.addresses, producer_id=4242)
            async with trio.open_nursery() as nursery:
                async def produce_forever() -> None:
                    i = 0
                    while True:
                        await producer.produce([f"steady-{i}-{j}".encode() for j in range(3)])
                        self.acked = list(producer.acked)
                        i += 1

                nursery.start_soon(produce_forever)
                self.ready.set()
                await self._stop.wait()
                # Let the producer get a few more acks after the last hostile frame.
                target = len(producer.acked) + 3
                with trio.fail_after(30):
                    while len(producer.acked) < target:
                        await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
            self.acked = list(producer.acked)
            leader = await cluster.wait_leader()
            await cluster.wait_hw(leader.core.high_watermark)
            self.records = {n.node_id: await read_all(n.address) for n in cluster.nodes}
            await producer.aclose()


@pytest.fixture(scope="module")
def live() -> LiveCluster:
    cluster = LiveCluster()
    cluster.start()
    yield cluster
    cluster.stop()


# -- a blocking client -----------------------------------------------------------------------------

class Sock:
    def __init__(self, address: str, hello: bool = True) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S)
        self.buf = b""
        if hello:
            self.send({"v": 1, "t": "hello", "role": "client"})
            frame = self.recv()
            assert frame is not None and frame["t"] == "hello", frame

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, frame: dict[str, Any]) -> None:
        self.sock.sendall(encode_frame(frame))

    def _read(self, n: int) -> bool:
        while len(self.buf) < n:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return False
            if not chunk:
                return False
            self.buf += chunk
        return True

    def recv(self) -> dict[str, Any] | None:
        """The next frame, or None once the server closed the connection."""
        if not self._read(4):
            return None
        (n,) = struct.unpack(">I", self.buf[:4])
        assert self._read(4 + n), "server closed mid-frame"
        body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
        return msgpack.unpackb(body, raw=False, strict_map_key=False)

    def expect_error_then_close(self) -> dict[str, Any]:
        err = self.recv()
        assert err is not None, "connection closed without an error frame"
        assert err["t"] == "error", err
        assert err["v"] == 1 and isinstance(err["message"], str) and err["message"]
        assert self.recv() is None, "connection stayed open after the error frame"
        return err

    def close(self) -> None:
        self.sock.close()


def leader_of(live: LiveCluster) -> str:
    s = Sock(live.addresses[0])
    s.send({"v": 1, "t": "status", "id": 1})
    st_ = s.recv()["status"]
    s.close()
    return st_["leader_addr"] or live.addresses[0]


# -- fixed cases -------------------------------------------------------------------------------------

def test_garbage_bytes_get_an_error_and_a_close(live: LiveCluster) -> None:
    s = Sock(live.addresses[1], hello=False)
    s.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # reads as a ~1.2 GB length prefix
    err = s.expect_error_then_close()
    assert err["code"] == "TOO_LARGE" and "--max-frame-bytes" in err["message"]


def test_oversized_frame_refused_from_its_header(live: LiveCluster) -> None:
    s = Sock(live.addresses[0])
    # Announce a body over the limit and send only a little of it: the server must answer from
    # the header alone instead of waiting for (or buffering) the body.
    s.send_raw(struct.pack(">I", MAX_FRAME + 1) + b"\x00" * 100)
    err = s.expect_error_then_close()
    assert err["code"] == "TOO_LARGE" and str(MAX_FRAME) in err["message"]


@pytest.mark.parametrize("body, fragment", [
    (b"\xc1\xc1\xc1", "not valid msgpack"),
    (msgpack.packb([1, 2, 3]), "must be a msgpack map"),
    (msgpack.packb({"v": 9, "t": "status", "id": 1}), "unsupported protocol version"),
    (msgpack.packb({"v": True, "t": "status", "id": 1}), "unsupported protocol version"),
    (msgpack.packb({"v": 1, "id": 1}), 'type tag "t"'),
    (msgpack.packb({"v": 1, "t": "status"}), 'missing integer field "id"'),
    (msgpack.packb({"v": 1, "t": "status", "id": "1"}), '"id" must be an integer'),
    (msgpack.packb({"v": 1, "t": "produce", "id": 3, "payload": "text", "count": 1}),
     '"payload" must be msgpack bin'),
    (msgpack.packb({"v": 1, "t": "produce", "id": 3, "payload": b"x", "count": 0}),
     '"count"=0 must be >= 1'),
    (msgpack.packb({"v": 1, "t": "produce", "id": 3, "payload": b"x", "count": 1,
                    "acks": "all"}), "must be one of"),
    (msgpack.packb({"v": 1, "t": "fetch", "id": 3}), 'missing integer field "offset"'),
    (msgpack.packb({"v": 1, "t": "fetch", "id": 3, "offset": 1.5}), '"offset" must be an int'),
    (msgpack.packb({"v": 1, "t": "raft", "id": 3, "msgs": []}), "unknown request type"),
])
def test_bad_frames_are_explained_and_closed(live: LiveCluster, body: bytes,
                                             fragment: str) -> None:
    s = Sock(live.addresses[2])
    s.send_raw(struct.pack(">I", len(body)) + body)
    if fragment == "unknown request type":  # an unknown op is a reply; the connection stays
        reply = s.recv()
        assert reply["t"] == "reply" and reply["ok"] is False
        assert reply["error"]["code"] == "BAD_REQUEST" and fragment in reply["error"]["message"]
        s.send({"v": 1, "t": "status", "id": 4})
        assert s.recv()["ok"] is True
        s.close()
        return
    err = s.expect_error_then_close()
    assert err["code"] == "BAD_REQUEST"
    assert fragment in err["message"], err["message"]
    if b'"id": 3' in body or b"\xa2id\x03" in body:
        assert err.get("id") == 3


def test_unknown_request_type_keeps_the_connection(live: LiveCluster) -> None:
    s = Sock(live.addresses[0])
    s.send({"v": 1, "t": "frobnicate", "id": 7})
    reply = s.recv()
    assert reply == {"v": 1, "t": "reply", "id": 7, "ok": False,
                     "error": reply["error"]} and reply["error"]["code"] == "BAD_REQUEST"
    assert "frobnicate" in reply["error"]["message"] and "produce" in reply["error"]["message"]
    s.send({"v": 1, "t": "status", "id": 8})
    assert s.recv()["id"] == 8
    s.close()


def test_a_group_the_node_does_not_run_is_refused_and_the_connection_kept(
        live: LiveCluster) -> None:
    """Requests carry their Raft group (raft.protocol.requests.SINGLE_GROUP when they name
    none); another group is refused with a reply, not a hang-up, and a wrong type is a bad
    frame like any other field."""
    s = Sock(live.addresses[0])
    s.send({"v": 1, "t": "status", "id": 1, "group": 0})
    assert s.recv()["ok"] is True
    s.send({"v": 1, "t": "fetch", "id": 2, "offset": 0, "group": 7})
    reply = s.recv()
    assert reply["id"] == 2 and reply["ok"] is False
    assert reply["error"]["code"] == "BAD_REQUEST" and "group 7" in reply["error"]["message"]
    s.send({"v": 1, "t": "status", "id": 3})
    assert s.recv()["id"] == 3
    s.send({"v": 1, "t": "status", "id": 4, "group": "seven"})
    err = s.recv()
    assert err["t"] == "error" and '"group" must be an integer' in err["message"]
    assert s.recv() is None
    s.close()


@pytest.mark.parametrize("hello, fragment", [
    ({"v": 1, "t": "status", "id": 1}, "first frame must be"),
    ({"v": 1, "t": "hello", "role": "admin"}, "must be one of"),
    # true is not version 1, though Python's True == 1 (msgpack keeps them apart).
    ({"v": True, "t": "hello", "role": "client"}, "unsupported protocol version"),
    ({"v": 1, "t": "hello"}, '"role" must be a string'),
    ({"v": 1, "t": "hello", "role": "peer", "node_id": 99}, "not a peer"),
    ({"v": 1, "t": "hello", "role": "peer"}, 'missing integer field "node_id"'),
])
def test_bad_hello(live: LiveCluster, hello: dict, fragment: str) -> None:
    s = Sock(live.addresses[0], hello=False)
    s.send(hello)
    err = s.expect_error_then_close()
    assert fragment in err["message"], err["message"]


def test_bad_peer_traffic_is_refused(live: LiveCluster) -> None:
    s = Sock(live.addresses[0], hello=False)
    s.send({"v": 1, "t": "hello", "role": "peer", "node_id": 2})
    assert s.recv()["t"] == "hello"
    s.send({"v": 1, "t": "raft", "msgs": [{"k": "hb", "src": 2, "dst": 1, "term": "x"}]})
    err = s.expect_error_then_close()
    assert '"term" must be an integer' in err["message"]


@pytest.mark.parametrize("data", [
    b"\x00\x00",  # a truncated header
    struct.pack(">I", 50) + b"\x80" * 10,  # a truncated body
])
def test_truncated_frames_just_close(live: LiveCluster, data: bytes) -> None:
    s = Sock(live.addresses[1])
    s.send_raw(data)
    s.sock.shutdown(socket.SHUT_WR)
    frame = s.recv()
    assert frame is None or frame["t"] == "error"
    assert s.recv() is None
    s.close()


# -- generated cases -----------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=8) | st.binary(max_size=16))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
field_names = st.sampled_from(["acks", "timeout_ms", "payload", "count", "producer_id",
                               "sequence", "timestamp_ms", "offset", "max_bytes", "max_wait_ms",
                               "to", "node_id", "address", "load_id", "gen"])
requests = st.fixed_dictionaries(
    {"v": st.just(1),
     "t": st.sampled_from(["produce", "fetch", "status", "transfer_leader", "add_node",
                           "remove_node", "nonsense", "hello", "raft", "reply"]),
     "id": st.integers(1, 2**31)},
    optional={"junk": values},
).flatmap(lambda base: st.dictionaries(field_names, values, max_size=6).map(
    lambda extra: {**extra, **base}))


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(frame=requests, target=st.integers(0, 2))
def test_generated_requests_get_a_reply_or_an_error(live: LiveCluster, frame: dict,
                                                    target: int) -> None:
    s = Sock(live.addresses[target])
    try:
        s.send(frame)
        got = s.recv()
        assert got is not None, "connection closed without a reply or an error frame"
        if got["t"] == "reply":
            assert got["id"] == frame["id"]
            if not got["ok"]:
                assert isinstance(got["error"]["code"], str) and got["error"]["message"]
            s.send({"v": 1, "t": "status", "id": 0})  # the connection still works
            assert s.recv()["t"] == "reply"
        else:
            assert got["t"] == "error" and got["message"], got
            assert s.recv() is None, "connection stayed open after the error frame"
    finally:
        s.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=64))
def test_generated_garbage_bytes(live: LiveCluster, data: bytes) -> None:
    s = Sock(live.addresses[data[0] % 3])
    try:
        s.send_raw(data)
        s.sock.shutdown(socket.SHUT_WR)
        while (frame := s.recv()) is not None:
            # Garbage can happen to parse as a valid request; anything else is an error.
            assert frame["t"] in ("reply", "error"), frame
    finally:
        s.close()


# -- and nothing was lost -----------------------------------------------------------------------------

def test_zz_cluster_kept_serving_and_lost_nothing(live: LiveCluster) -> None:
    """Runs last (file order): stop the producer, then check its acked records on every node."""
    live.stop()
    assert live.error is None, live.error
    assert live.acked, "the concurrent producer never got an ack"
    assert live.records is not None
    logs = list(live.records.values())
    for records in logs:
        check_acked(live.acked, [(o, v) for o, v in records if v.startswith(b"steady-")])
    # Committed prefixes are identical everywhere.
    shortest = min(len(r) for r in logs)
    assert all(r[:shortest] == logs[0][:shortest] for r in logs)
