"""Hostile and broken input on the TLS handshake path and in the auth frames, against a live
3-node TLS cluster with an auth file, while an authenticated producer keeps writing.

The cluster (trio, in-process Nodes on port 0, certificates from raft/cli/pki.py) runs in a
background thread for the whole module so hypothesis can drive plain blocking sockets, TLS or
not, at it. Every refused connection must end (an error frame where one can be read, else a
close), a refused request must leave its connection usable, and at the end everything the
producer had acknowledged must be in every node's log exactly once, at its offset.
"""

from __future__ import annotations

import socket
import ssl
import threading
import traceback

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inproc_cluster import check_acked
from raft.cli import pki
from raft.client import Client, Producer
from raft.node.config import NodeConfig
from raft.node.server import Node
from secfixtures import Pki, Wire, client_context, make_pki, peer_context
from storage.memory import MemoryLog

DEADLINE_S = 30.0


class LiveTLSCluster:
    def __init__(self, pki: Pki) -> None:
        self.pki = pki
        self.addresses: list[str] = []
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.acked: list[tuple[int, list[bytes]]] = []
        self.records: dict[int, list[tuple[int, bytes]]] | None = None
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

    def client(self) -> Client:
        ops = self.pki.client("ops")
        return Client(self.addresses, tls_ca=str(self.pki.ca), tls_cert=str(ops.cert),
                      tls_key=str(ops.key), timeout=DEADLINE_S)

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        ids = (1, 2, 3)
        nodes = [Node(NodeConfig(node_id=i, data_dir="/nonexistent-in-memory",
                                 peers={j: "127.0.0.1:0" for j in ids}, tick_ms=10,
                                 election_ticks=20, reconnect_min_ms=5, reconnect_max_ms=100,
                                 auth_file=str(self.pki.auth_file), **self.pki.node_settings(i)),
                      log_storage=MemoryLog()) for i in ids]
        async with trio.open_nursery() as nursery:
            for node in nodes:
                await nursery.start(node.run)
            for node in nodes:
                for other in nodes:
                    if other is not node:
                        node.set_peer_address(other.node_id, other.address)
            self.addresses = [n.address for n in nodes]
            async with self.client() as client:
                async with Producer(client, acks="quorum") as producer, \
                        trio.open_nursery() as inner:
                    async def produce_forever() -> None:
                        i = 0
                        while True:
                            values = [f"steady-{i}-{j}".encode() for j in range(3)]
                            offsets = await producer.send_many(values)
                            self.acked.extend((o, [v]) for o, v in zip(offsets, values))
                            i += 1

                    inner.start_soon(produce_forever)
                    self.ready.set()
                    await self._stop.wait()
                    target = len(self.acked) + 3  # a few more acks after the last attack
                    with trio.fail_after(DEADLINE_S):
                        while len(self.acked) < target:
                            await trio.sleep(0.02)
                    inner.cancel_scope.cancel()
                self.records = {n.node_id: await read_all(client, n.address) for n in nodes}
            for node in nodes:
                node.request_shutdown()


async def read_all(client: Client, address: str) -> list[tuple[int, bytes]]:
    """Every committed (offset, value) on one node, once it has everything acknowledged."""
    leader_hw = (await client.status())["high_watermark"]
    with trio.fail_after(DEADLINE_S):
        while (await client.status(address))["high_watermark"] < leader_hw:
            await trio.sleep(0.02)
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        res = await client.fetch(offset, address=address)
        out.extend((r.offset, r.value) for r in res.records)
        if res.next_offset > res.high_watermark:
            return out
        offset = res.next_offset


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> LiveTLSCluster:
    cluster = LiveTLSCluster(make_pki(tmp_path_factory.mktemp("tls-wire")))
    cluster.start()
    yield cluster
    cluster.stop()


def tls_wire(live: LiveTLSCluster, node: int = 0, **hello) -> Wire:
    w = Wire(live.addresses[node], client_context(live.pki.ca))
    if hello:
        reply = w.hello(**hello)
        assert reply is not None and reply["t"] == "hello", reply
    return w


# -- plaintext and the handshake -----------------------------------------------------------------

def test_a_plaintext_client_gets_a_clear_error(live: LiveTLSCluster) -> None:
    w = Wire(live.addresses[1])
    w.send({"v": 1, "t": "hello", "role": "client", "token": live.pki.tokens["ops"]})
    err = w.expect_error_then_close()
    assert err["code"] == "UNAUTHENTICATED" and "requires TLS" in err["message"]
    assert "--tls-ca" in err["message"]


def test_a_client_trusting_another_ca_refuses_the_node(live: LiveTLSCluster) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        Wire(live.addresses[0], client_context(live.pki.other / "ca.pem"))


def test_a_client_certificate_from_another_ca_is_refused(live: LiveTLSCluster) -> None:
    # A certificate for "ops", but signed by the other CA.
    ctx = client_context(live.pki.ca, pki.client_paths(live.pki.other, "ops"))
    try:
        w = Wire(live.addresses[0], ctx)
        got = w.hello()  # TLS 1.3 reports the refusal on the first read
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return
    assert got is None, got


def client_hello_bytes() -> bytes:
    """A real TLS ClientHello, as the first flight a TLS client sends."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


CLIENT_HELLO = client_hello_bytes()


def closes(address: str, data: bytes) -> bytes:
    """Send `data`, half-close, read until the node closes; what it sent back."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return b""
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                return got
            if not chunk:
                return got
            got += chunk


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cut=st.integers(0, len(CLIENT_HELLO)), tail=st.binary(max_size=64),
       target=st.integers(0, 2))
def test_a_broken_tls_handshake_ends_only_that_connection(live: LiveTLSCluster, cut: int,
                                                          tail: bytes, target: int) -> None:
    closes(live.addresses[target], CLIENT_HELLO[:cut] + tail)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=64))
def test_garbage_before_the_handshake(live: LiveTLSCluster, data: bytes) -> None:
    got = closes(live.addresses[data[0] % 3], data)
    if data[0] != 0x16 and got:  # not TLS: answered in plaintext, then closed
        assert b"requires TLS" in got


# -- the auth frames -----------------------------------------------------------------------------

tokens = st.none() | st.text(max_size=40) | st.integers() | st.binary(max_size=8) | \
    st.lists(st.text(max_size=3), max_size=2) | st.just("rl_" + "A" * 43)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(token=tokens, role=st.sampled_from(["client", "peer", "admin", None]),
       node_id=st.none() | st.integers(-3, 9) | st.text(max_size=2), target=st.integers(0, 2))
def test_generated_hellos_are_refused_with_a_reason(live: LiveTLSCluster, token, role, node_id,
                                                    target: int) -> None:
    hello = {"v": 1, "t": "hello"}
    for key, value in (("token", token), ("role", role), ("node_id", node_id)):
        if value is not None:
            hello[key] = value
    w = Wire(live.addresses[target], client_context(live.pki.ca))
    try:
        w.send(hello)
        err = w.expect_error_then_close()  # no token is valid, and a client cert is absent
        assert err["code"] in ("UNAUTHENTICATED", "BAD_REQUEST"), err
        if isinstance(token, str) and len(token) > 3:
            assert token not in err["message"]  # never echo a secret
    finally:
        w.close()


def test_a_peer_must_present_its_own_certificate(live: LiveTLSCluster) -> None:
    node2 = live.pki.node(2)
    w = Wire(live.addresses[0], peer_context(live.pki.ca, node2))
    w.send({"v": 1, "t": "hello", "role": "peer", "node_id": 3})  # node 2 posing as node 3
    err = w.expect_error_then_close()
    assert err["code"] == "UNAUTHENTICATED" and "certificate names node 2" in err["message"]
    w = Wire(live.addresses[0], peer_context(live.pki.ca, live.pki.client("ops")))
    w.send({"v": 1, "t": "hello", "role": "peer", "node_id": 2})  # a client cert as a peer
    assert w.expect_error_then_close()["code"] == "UNAUTHENTICATED"
    w = Wire(live.addresses[0], client_context(live.pki.ca))  # no certificate at all
    w.send({"v": 1, "t": "hello", "role": "peer", "node_id": 2})
    assert w.expect_error_then_close()["code"] == "UNAUTHENTICATED"


def test_a_forbidden_request_leaves_the_connection_usable(live: LiveTLSCluster) -> None:
    w = tls_wire(live, token=live.pki.tokens["reader"])
    reply = w.request("produce", 1, payload=b"x", count=1)
    assert reply["ok"] is False and reply["error"]["code"] == "FORBIDDEN"
    assert reply["error"]["permission"] == "produce"
    reply = w.request("remove_node", 2, node_id=3)
    assert reply["error"]["code"] == "FORBIDDEN" and reply["error"]["permission"] == "admin"
    assert w.request("status", 3)["ok"] is True
    assert w.request("fetch", 4, offset=0)["ok"] is True
    w.close()


def test_a_client_certificate_authenticates_its_principal(live: LiveTLSCluster) -> None:
    w = Wire(live.addresses[0], client_context(live.pki.ca, live.pki.client("stranger")))
    hello = w.hello()
    assert hello["t"] == "hello" and hello["principal"] == "stranger"
    assert w.request("status", 1)["ok"] is True  # status is open to every principal
    assert w.request("fetch", 2, offset=0)["error"]["code"] == "FORBIDDEN"
    w.close()


def test_no_secret_in_status(live: LiveTLSCluster) -> None:
    w = tls_wire(live, token=live.pki.tokens["ops"])
    text = repr(w.request("status", 1))
    w.close()
    assert all(t not in text for t in live.pki.tokens.values())
    assert str(live.pki.auth_file) not in text and "sha256:" not in text


# -- and nothing was lost ----------------------------------------------------------------------

def test_zz_cluster_kept_serving_and_lost_nothing(live: LiveTLSCluster) -> None:
    """Runs last (file order): stop the producer, then check its acks on every node."""
    live.stop()
    assert live.error is None, live.error
    assert live.acked, "the concurrent producer never got an ack"
    assert live.records is not None
    for records in live.records.values():
        check_acked(live.acked, [(o, v) for o, v in records if v.startswith(b"steady-")])
