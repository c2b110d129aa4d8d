"""Real processes under faults: repeated leader SIGKILLs under quorum load, SIGSTOP/SIGCONT of a
follower and of the leader, and a leader cut off from both followers by a fault-injecting TCP
proxy that sits on every peer link. Nothing acknowledged may be lost, and every node must end
with the acknowledged records once each, in the same order."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from raft.client import BlockingClient, RaftlogError
from raft.cli.demo import verify
from raft.cli.localcluster import LocalCluster, free_ports, wait_for

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


class Writers:
    """Closed-loop idempotent quorum writers; remembers every acknowledged (offset, value)."""

    def __init__(self, servers: str, n: int = 3) -> None:
        self.acked: dict[int, bytes] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(servers, k), daemon=True)
                         for k in range(n)]

    def _run(self, servers: str, k: int) -> None:
        with BlockingClient(servers, timeout=15) as client:
            i = 0
            while not self._stop.is_set():
                value = f"w{k}-{i}".encode()
                try:
                    (off,) = client.produce_idempotent([value], acks="quorum")
                    with self._lock:
                        self.acked[off] = value
                except RaftlogError:
                    pass  # not acknowledged: allowed to be lost
                i += 1

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def __enter__(self) -> "Writers":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def wait_more(self, n: int, what: str, timeout: float = 60) -> None:
        target = self.count() + n
        wait_for(lambda: self.count() >= target, what, timeout=timeout)


def same_order_everywhere(cluster: LocalCluster, acked: dict[int, bytes]) -> None:
    """Once the writers stopped: every node catches up with the leader, then holds each acked
    record once, at its offset. The catch-up comes first because a node can still be behind
    for a while after a fault heals (ci17: the healed old leader received appends, but its own
    link to the leader was still in its reconnect backoff, up to reconnect_max_ms, so its
    replies, and the rest of the log, waited); verify's fetches wait 1 s, not that long."""
    for node_id in cluster.addresses:
        cluster.wait_caught_up(node_id, timeout=60)
    assert verify(cluster, acked) == []


def test_ten_leader_kills_under_quorum_load(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        with Writers(cluster.servers) as w:
            cluster.wait_leader()
            for round_ in range(10):
                w.wait_more(50, f"writes before kill {round_ + 1}")
                leader = cluster.wait_leader()
                cluster.kill(leader)
                cluster.wait_leader(exclude=leader, timeout=30)
                w.wait_more(50, f"writes to resume after kill {round_ + 1}")
                cluster.start(leader)
                cluster.wait_caught_up(leader, timeout=60)
        same_order_everywhere(cluster, w.acked)


def test_sigstop_follower_then_leader(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        with Writers(cluster.servers) as w:
            leader = cluster.wait_leader()
            follower = next(i for i in cluster.addresses if i != leader)
            w.wait_more(50, "writes")
            cluster.procs[follower].send_signal(signal.SIGSTOP)
            w.wait_more(50, "writes with one follower paused")
            cluster.procs[follower].send_signal(signal.SIGCONT)
            cluster.wait_caught_up(follower)
            cluster.procs[leader].send_signal(signal.SIGSTOP)
            try:
                # status_of skips unresponsive nodes, so the paused leader is not counted.
                wait_for(lambda: next((i for i in cluster.addresses if i != leader and (
                    cluster.status_of(i) or {}).get("role") == "leader"), None),
                    "a new leader while the old one is paused", timeout=30)
                w.wait_more(50, "writes with the old leader paused")
            finally:
                cluster.procs[leader].send_signal(signal.SIGCONT)
            cluster.wait_caught_up(leader)
        same_order_everywhere(cluster, w.acked)


class Proxy:
    """Forwards one peer link (A dials B) through 127.0.0.1:port; `cut()` drops every
    connection and refuses new ones until `heal()`."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.blocked = False
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.blocked:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data or self.blocked:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        self.blocked = True
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def heal(self) -> None:
        self.blocked = False

    def close(self) -> None:
        self.cut()
        self.sock.close()


def test_leader_partitioned_by_proxies_steps_down_and_nothing_acked_is_lost(
        tmp_path: Path) -> None:
    ids = [1, 2, 3]
    ports = dict(zip(ids, free_ports(3)))
    # proxies[(a, b)]: the link a dials to reach b.
    proxies = {(a, b): Proxy(ports[b]) for a in ids for b in ids if a != b}
    procs: dict[int, subprocess.Popen] = {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start(i: int) -> None:
        peers = ",".join(f"{j}=127.0.0.1:{ports[j] if j == i else proxies[(i, j)].port}"
                         for j in ids)
        out = open(tmp_path / f"node-{i}.log", "ab")
        procs[i] = subprocess.Popen(
            [sys.executable, "-m", "raft.cli", "serve", "--shards=1", "--node-id", str(i), "--data-dir",
             str(tmp_path), "--listen", f"127.0.0.1:{ports[i]}", "--peers", peers],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        out.close()

    # A LocalCluster view (real addresses) for status polling and verification.
    view = LocalCluster(tmp_path / "view", nodes=3)
    view.addresses = {i: f"127.0.0.1:{ports[i]}" for i in ids}
    view.procs = procs
    try:
        for i in ids:
            start(i)
        old = view.wait_leader()
        with Writers(view.servers) as w:
            w.wait_more(100, "writes before the partition")
            for (a, b), p in proxies.items():
                if old in (a, b):
                    p.cut()
            # CheckQuorum: the isolated leader steps down; the majority elects a new one.
            wait_for(lambda: (view.status_of(old) or {}).get("role") != "leader",
                     "the isolated leader to step down", timeout=30)
            new = wait_for(lambda: next((i for i in ids if i != old and (view.status_of(i) or {})
                                         .get("role") == "leader"), None),
                           "the majority to elect a leader", timeout=30)
            assert new != old
            w.wait_more(100, "writes to go on at the new leader")
            for p in proxies.values():
                p.heal()
            view.wait_caught_up(old, timeout=60)
        same_order_everywhere(view, w.acked)
    finally:
        view.stop()
        for p in proxies.values():
            p.close()
