"""A fresh cluster of real `raftlog serve` processes on 127.0.0.1, for benchmarks and smoke tests.

Why real processes: the figures must include everything a user pays for (sockets, msgpack,
fsync, the trio loop, scheduling between processes on the same cores). The harness only starts,
observes (status over the wire), kills, restarts and stops nodes; it never reaches inside them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from bench.wire import SyncConn, status_of
# Ports below the kernel's ephemeral range: a port handed out by bind(0) was often taken by an
# outgoing connection (another node's peer link) before the node bound it.
from raft.cli.localcluster import free_ports

log = logging.getLogger("raftlog.bench.harness")


class ClusterError(Exception):
    """The cluster did not reach the state the benchmark needs; the message says where to look."""


# The packages a node process imports from this checkout.
NODE_PACKAGES = ("raft", "storage", "recovery")
_compiled = False


def ensure_bytecode() -> None:
    """Compile the node's packages to bytecode (__pycache__, once per bench process) before
    nodes start. A node started with PYTHONDONTWRITEBYTECODE=1 in its environment (as on the
    reference machine) and an editable install writes none itself, so every start compiled
    ~200 modules from source again: ~0.18 s of a restarted follower's ~0.5 s start-up, inside
    `bench recovery`'s figure (docs/PERFORMANCE.md "start28"). An installed raftlog has its
    bytecode from pip; this gives the bench's nodes the same. Python still checks each file's
    timestamp and compiles in memory whatever is stale; a directory it may not write is left
    as it is."""
    global _compiled
    if _compiled:
        return
    _compiled = True
    import compileall

    for name in NODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        for directory in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(directory, quiet=2)


def serve_command(node_id: int) -> list[str]:
    """`python -m raft.cli serve`, or $RAFTLOG_BENCH_SERVE (a shell-quoted command, `{node_id}`
    substituted) to benchmark another build or to wrap nodes in a profiler, e.g.
    `python -m pyinstrument -o /tmp/n{node_id}.txt -m raft.cli serve`."""
    override = os.environ.get("RAFTLOG_BENCH_SERVE")
    if not override:
        # `raftlog serve` and `python -m raft.node` take the same flags; the latter lets the
        # bench run before the CLI module exists.
        # One shard per node: the bench's nodes share this host, and `serve` left alone
        # takes every core and K ports per node (a --shards in the extra args wins).
        if importlib.util.find_spec("raft.cli") is None:
            return [sys.executable, "-m", "raft.node", "--shards", "1"]
        return [sys.executable, "-m", "raft.cli", "serve", "--shards", "1"]
    return [part.replace("{node_id}", str(node_id)) for part in shlex.split(override)]


@dataclass(slots=True)
class Node:
    node_id: int
    addr: str
    data_dir: str
    log_path: str
    proc: subprocess.Popen | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    """`with Cluster(3) as c: c.wait_for_leader()` starts, and on exit stops, every node."""

    size: int = 3
    base_dir: str | None = None
    extra_args: list[str] = field(default_factory=list)
    keep: bool = False
    tls: bool = False  # TLS on every connection: a fresh CA and node certificates in the tmp dir
    nodes: dict[int, Node] = field(default_factory=dict)
    _tmp: str | None = None
    tls_ca: str | None = None  # the CA clients trust, when tls

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "Cluster":
        ensure_bytecode()
        self._tmp = tempfile.mkdtemp(prefix="raftlog-bench-", dir=self.base_dir)
        ports = free_ports(self.size)
        for i, port in enumerate(ports, start=1):
            d = os.path.join(self._tmp, f"n{i}")
            os.makedirs(d)
            self.nodes[i] = Node(i, f"127.0.0.1:{port}", d, os.path.join(self._tmp, f"n{i}.log"))
        if self.tls:
            from raft.cli import pki

            ca, _ = pki.local_cluster(os.path.join(self._tmp, "tls"), list(self.nodes))
            self.tls_ca = str(ca.cert)
        for node_id in self.nodes:
            self.start_node(node_id)
        return self

    def peers_arg(self) -> str:
        return ",".join(f"{n.node_id}={n.addr}" for n in self.nodes.values())

    def start_node(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.alive:
            return
        cmd = [*serve_command(node_id), "--node-id", str(node_id),
               "--data-dir", node.data_dir, "--listen", node.addr, "--peers", self.peers_arg(),
               *self.extra_args, *self._tls_args(node_id)]
        out = open(node.log_path, "ab")
        try:
            node.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()
        log.debug("event=node_started node_id=%s addr=%s pid=%s", node_id, node.addr,
                  node.proc.pid)

    def _tls_args(self, node_id: int) -> list[str]:
        if not self.tls:
            return []
        from raft.cli import pki

        assert self._tmp is not None and self.tls_ca is not None
        paths = pki.node_paths(os.path.join(self._tmp, "tls"), node_id)
        return ["--tls-cert", str(paths.cert), "--tls-key", str(paths.key),
                "--tls-ca", self.tls_ca]

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        node = self.nodes[node_id]
        if node.alive:
            node.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                try:
                    node.proc.wait(15)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(5)

    def stop(self) -> None:
        """SIGTERM everyone (clean shutdown), SIGKILL stragglers, delete the data unless keep."""
        for node in self.nodes.values():
            if node.alive:
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for node in self.nodes.values():
            if node.proc is None:
                continue
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("event=node_kill_after_sigterm node_id=%s", node.node_id)
                node.proc.kill()
                node.proc.wait(5)
        if self._tmp and not self.keep:
            shutil.rmtree(self._tmp, ignore_errors=True)
        # Write back the page cache now: otherwise the next workload's fsyncs queue behind
        # gigabytes of this one's dirty pages (seen as 0.5 s latency stalls right after the
        # produce workload).
        os.sync()

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation ----------------------------------------------------------------------------
    @property
    def addrs(self) -> list[str]:
        return [n.addr for n in self.nodes.values()]

    def statuses(self) -> dict[int, dict[str, Any] | None]:
        return {i: (status_of(n.addr, tls_ca=self.tls_ca) if n.alive else None)
                for i, n in self.nodes.items()}

    def _check_alive(self) -> None:
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is not None and node.proc.returncode \
                    not in (-signal.SIGKILL, -signal.SIGTERM, 0):
                raise ClusterError(f"node {node.node_id} exited with code {node.proc.returncode}; "
                                   f"its log ends with:\n{self.log_tail(node.node_id)}")

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        try:
            with open(self.nodes[node_id].log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
        except OSError:
            return "(no log)"

    def leader(self, exclude: int | None = None) -> int | None:
        """A node that says it leads and that every other live node follows (or None)."""
        st = {i: s for i, s in self.statuses().items() if s is not None and i != exclude}
        leaders = [i for i, s in st.items() if s.get("role") == "leader"]
        if len(leaders) != 1:
            return None
        lid = leaders[0]
        term = st[lid].get("term")
        agree = sum(1 for i, s in st.items()
                    if s.get("term") == term and (i == lid or s.get("leader_id") == lid))
        return lid if agree >= self.size // 2 + 1 else None

    def wait_for_leader(self, timeout: float = 30.0, exclude: int | None = None) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            lid = self.leader(exclude)
            if lid is not None:
                return lid
            time.sleep(0.05)
        raise ClusterError(f"no leader within {timeout:.0f}s; node logs are in {self._tmp} "
                           f"(n1.log ...). Last lines of n1:\n{self.log_tail(1)}")

    def wait_caught_up(self, timeout: float = 60.0) -> None:
        """Every live node's dirty and commit offsets reached the leader's dirty offset: the
        backlog of the previous measurement is flushed and replicated before the next starts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            lid = self.leader()
            st = self.statuses()
            if lid is not None and st.get(lid):
                target = st[lid].get("dirty_offset", -1)
                live = [s for i, s in st.items() if self.nodes[i].alive]
                if all(s is not None and s.get("commit_index", -2) >= target
                       and s.get("flushed_offset", -2) >= target for s in live):
                    return
            time.sleep(0.1)
        raise ClusterError(f"the cluster did not catch up within {timeout:.0f}s: "
                           f"{self.statuses()!r}")

    def admin(self, node_id: int, msg: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        with SyncConn(self.nodes[node_id].addr, timeout=timeout, tls_ca=self.tls_ca) as conn:
            return conn.request(msg)
