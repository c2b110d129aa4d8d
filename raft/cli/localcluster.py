"""A cluster of real `raftlog serve` processes on 127.0.0.1, for `raftlog up`, `raftlog demo`
and process-level tests: start, find the leader, SIGKILL or SIGTERM a node, restart it, stop all.

Each node logs to DATA_DIR/node-<id>.log so a failed run can be diagnosed after the fact."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raft.client import BlockingClient, RaftlogError
from raft.protocol.requests import Status


# Where free_ports looks: below the kernel's ephemeral range, whose ports any outgoing
# connection (the nodes' own peer links included) may take between our check and the node's
# bind. Linux's default range starts at 32768.
PORT_RANGE = (20000, 32000)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int, consecutive: bool = False) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (consecutive if asked), chosen outside the
    ephemeral range. Bound then released: a small race remains with other processes that pick
    ports the same way, acceptable for local clusters and tests."""
    lo, hi = PORT_RANGE[0], min(PORT_RANGE[1], _ephemeral_low() - 1)
    rng = random.Random()
    for _ in range(1000):
        if consecutive:
            base = rng.randrange(lo, hi - n)
            candidates = list(range(base, base + n))
        else:
            candidates = rng.sample(range(lo, hi), n)
        socks = []
        try:
            for p in candidates:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return candidates
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} free ports found in {lo}..{hi}")


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 30.0,
             interval: float = 0.05) -> Any:
    """Poll `cond` until it returns a truthy value; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)  # polling a real cluster, not synchronising threads


@dataclass
class LocalCluster:
    data_dir: Path
    nodes: int = 3
    base_port: int | None = None  # None: pick free ports
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    # Per-node flags (TLS certificates differ per node: raft/cli/localtls.py) and what the
    # cluster's own client needs to talk to it (tls_ca, token, ...).
    node_args: Callable[[int], list[str]] | None = None
    client_options: dict[str, Any] = field(default_factory=dict)
    # Shard processes per node (docs/SHARDS.md): node i's shard k listens on its port + k, so
    # nodes' ports are `shards` apart. Always passed: `serve` left alone runs one shard per
    # usable core, and K nodes on one host would each take every core and K ports.
    shards: int = 1

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.nodes < 1:
            raise ValueError("a cluster needs at least one node (--nodes 3 is usual)")
        k = self.shards
        ports = ([self.base_port + i * k for i in range(self.nodes)] if self.base_port
                 else free_ports(self.nodes) if k == 1
                 else free_ports(self.nodes * k, consecutive=True)[::k])
        self.addresses = {i + 1: f"127.0.0.1:{p}" for i, p in enumerate(ports)}
        self.joining: set[int] = set()
        self.started_at: dict[int, float] = {}  # node id -> time.monotonic() of its last start
        self._client: BlockingClient | None = None

    @property
    def servers(self) -> str:
        return ",".join(self.addresses.values())

    @property
    def peers_spec(self) -> str:
        return ",".join(f"{i}={a}" for i, a in self.addresses.items())

    def command(self, node_id: int) -> list[str]:
        extra = ["--join"] if node_id in self.joining else []
        return [sys.executable, "-m", "raft.cli", "serve", "--node-id", str(node_id),
                "--data-dir", str(self.data_dir), "--peers", self.peers_spec,
                "--shards", str(self.shards), *self.extra_args,
                *(self.node_args(node_id) if self.node_args else []), *extra]

    def new_node(self) -> int:
        """Reserve an id and a port for a node that will join with `raftlog add-node`; start
        it with start(id) (it runs `serve --join`)."""
        node_id = max(self.addresses) + 1
        self.addresses[node_id] = f"127.0.0.1:{free_ports(1)[0]}"
        self.joining.add(node_id)
        return node_id

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, node_id: int | None = None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ids = [node_id] if node_id is not None else list(self.addresses)
        env = {**os.environ, **self.env}
        # The repository root (raft/cli/localcluster.py -> ../..), never raft/ itself: on the
        # path, raft/core/types.py would shadow the standard library's `types`.
        repo = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
        for i in ids:
            if i in self.procs and self.procs[i].poll() is None:
                continue
            out = open(self.data_dir / f"node-{i}.log", "ab")
            # Its own process group: a Ctrl-C in the terminal reaches the supervisor (`up`,
            # a test), which stops the nodes in order, not every node at once.
            self.procs[i] = subprocess.Popen(self.command(i), stdout=out,
                                             stderr=subprocess.STDOUT, env=env,
                                             process_group=0)
            self.started_at[i] = time.monotonic()
            out.close()

    def kill(self, node_id: int) -> None:
        """SIGKILL: the node loses whatever it had not flushed."""
        proc = self.procs.get(node_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)

    def terminate(self, node_id: int, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait: a clean stop (flush, hand over leadership). Returns the exit code."""
        proc = self.procs.get(node_id)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop(self) -> dict[int, int | None]:
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {}
        for i, proc in self.procs.items():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            codes[i] = proc.returncode
        return codes

    def alive(self, node_id: int) -> bool:
        proc = self.procs.get(node_id)
        return proc is not None and proc.poll() is None

    def returncode(self, node_id: int) -> int | None:
        """None while the node runs (or was never started), else how it ended (-N: signal N)."""
        proc = self.procs.get(node_id)
        return None if proc is None else proc.poll()

    def pid(self, node_id: int) -> int | None:
        proc = self.procs.get(node_id)
        return None if proc is None else proc.pid

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation -----------------------------------------------------------------------
    @property
    def client(self) -> BlockingClient:
        if self._client is None:
            self._client = BlockingClient(self.servers, timeout=10.0, **self.client_options)
        return self._client

    def status_of(self, node_id: int, timeout: float = 1.0) -> dict[str, Any] | None:
        if not self.alive(node_id):
            return None
        try:
            return self.client._call(self.client._client.call, Status(),
                                     server=self.addresses[node_id], leader=False,
                                     timeout=timeout)["status"]
        except RaftlogError:
            return None

    def leader(self) -> int | None:
        """The node that says it leads, if the live nodes agree on it."""
        statuses = {i: self.status_of(i) for i in self.addresses if self.alive(i)}
        leaders = [i for i, st in statuses.items() if st and st.get("role") == "leader"]
        if len(leaders) != 1:
            return None
        term = statuses[leaders[0]]["term"]
        return leaders[0] if all(st is None or st["term"] <= term
                                 for st in statuses.values()) else None

    def wait_leader(self, timeout: float = 30.0, exclude: int | None = None) -> int:
        return wait_for(lambda: (lambda ldr: ldr if ldr and ldr != exclude else None)(
            self.leader()), "a leader to be elected", timeout)

    def wait_caught_up(self, node_id: int, timeout: float = 60.0) -> None:
        """Until `node_id` has flushed everything the leader had when the wait began, and
        committed as far. A fixed target: under a steady write load the leader's log end moves
        on between two status calls, and a node that keeps pace a few milliseconds behind has
        caught up, whatever the load does to those milliseconds."""
        target: list[tuple[int, int]] = []

        def done() -> bool:
            if not target:
                leader = self.leader()
                lst = self.status_of(leader) if leader is not None else None
                if not lst:
                    return False
                target.append((lst["dirty_offset"], lst["commit_index"]))
            st = self.status_of(node_id)
            dirty, commit = target[0]
            return bool(st and st["flushed_offset"] >= dirty and st["commit_index"] >= commit)
        wait_for(done, f"node {node_id} to catch up", timeout)

    def node_log(self, node_id: int) -> str:
        path = self.data_dir / f"node-{node_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""
