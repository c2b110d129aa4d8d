"""A real raftlog cluster of `python -m raft.cli serve` processes for the Spark tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sparkio.staging import RaftlogError, Session

REPO = Path(__file__).resolve().parents[2]
LOAD_TIMEOUT_MS = 15_000  # the cluster's open-load timeout (default 1 h); the timeout test waits it


def wait_for(cond: Callable[[], object], what: str, timeout: float = 60.0,
             interval: float = 0.1) -> object:
    """Poll `cond` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last_err: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = cond()
            if got:
                return got
        except (OSError, RaftlogError, KeyError) as e:
            last_err = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: "
                         f"{last_err})")


def serve_module() -> list[str]:
    """`raftlog serve` when the full CLI is in the build, else the node's own entry point."""
    import importlib.util

    if importlib.util.find_spec("raft.cli") is not None:
        return ["raft.cli", "serve"]
    return ["raft.node"]


def missing_for_cluster() -> list[str]:
    """What this build lacks to run real server processes (the consensus core, a durable log)."""
    import importlib.util

    import storage

    missing = [] if importlib.util.find_spec("raft.core.raft") is not None else ["raft.core.raft"]
    if not hasattr(storage, "open_log"):
        missing.append("storage.open_log")
    return missing


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    """Three raftlog server processes; helpers to kill, restart and inspect nodes."""

    def __init__(self, root: Path, n: int = 3) -> None:
        self.root = root
        self.ids = list(range(1, n + 1))
        self.addr = {i: f"127.0.0.1:{p}" for i, p in zip(self.ids, _free_ports(n))}
        self.procs: dict[int, subprocess.Popen] = {}
        self.servers = ",".join(self.addr.values())

    def start(self, i: int) -> None:
        peers = ",".join(f"{k}={v}" for k, v in self.addr.items())
        env = {**os.environ, "RAFTLOG_LOAD_TIMEOUT_MS": str(LOAD_TIMEOUT_MS),
               "PYTHONPATH": str(REPO)}
        out = open(self.root / f"node-{i}.log", "ab")
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", *serve_module(), "--shards", "1", "--node-id", str(i),
             "--data-dir", str(self.root / "data"), "--listen", self.addr[i], "--peers", peers],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)

    def start_all(self) -> None:
        for i in self.ids:
            self.start(i)
        self.wait_leader()

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        p = self.procs.pop(i)
        p.send_signal(sig)
        p.wait(timeout=30)

    def stop_all(self) -> None:
        for i in list(self.procs):
            p = self.procs[i]
            if p.poll() is None:
                p.terminate()
        for i in list(self.procs):
            try:
                self.procs.pop(i).wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.procs.get(i, p).kill()

    def status(self, i: int) -> dict:
        s = Session([self.addr[i]], timeout_s=5, io_timeout_s=5)
        try:
            return s.status()
        finally:
            s.close()

    def leader(self, timeout: float = 60.0) -> int:
        def find() -> int | None:
            for i in self.procs:
                try:
                    st = self.status(i)
                except (OSError, RaftlogError):
                    continue
                if st["role"] == "leader":
                    return i
            return None
        return int(wait_for(find, "a leader", timeout))  # type: ignore[arg-type]

    def wait_leader(self) -> int:
        return self.leader()

    def session(self) -> Session:
        return Session(self.servers, timeout_s=60)

    def stable_offset(self) -> int:
        s = self.session()
        try:
            return int(s.call({"t": "load_status"})["high_watermark"])
        finally:
            s.close()

    def wait_converged(self, timeout: float = 120.0) -> int:
        """Every running node has the same dirty offset and commit index; returns it."""
        def same() -> int | None:
            sts = [self.status(i) for i in self.procs]
            dirty = {s["dirty_offset"] for s in sts}
            commit = {s["commit_index"] for s in sts}
            if len(dirty) == 1 and dirty == commit:
                return next(iter(dirty)) + 1  # +1 so offset 0 is truthy
            return None
        return int(wait_for(same, "all nodes to converge", timeout)) - 1  # type: ignore[arg-type]

    def read_node(self, i: int, start: int, end: int) -> list[tuple[int, bytes]]:
        """(offset, value) of consumer-visible records in [start, end) read from node i only."""
        import msgpack

        s = Session([self.addr[i]], timeout_s=30)
        out: list[tuple[int, bytes]] = []
        try:
            off = start
            while off < end:
                r = s.fetch(off, 8 << 20)
                for b in r["batches"]:
                    for k, rec in enumerate(msgpack.unpackb(b["payload"], raw=False)):
                        if b["base_offset"] + k < end:
                            out.append((b["base_offset"] + k, rec[1]))
                nxt = r["next_offset"]
                if nxt <= off:
                    raise AssertionError(f"node {i} stopped at {off} before {end}")
                off = nxt
        finally:
            s.close()
        return out




class SingleNode:
    """tests/spark/solo_node.py in a subprocess: the real trio Node and wire path with a
    real core with one voter (no replication), for fast Spark-side tests."""

    def __init__(self, root: Path, load_timeout_ms: int = LOAD_TIMEOUT_MS) -> None:
        self.port = _free_ports(1)[0]
        self.servers = f"127.0.0.1:{self.port}"
        out = open(root / f"solo-node-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "spark" / "solo_node.py"), str(self.port)],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO),
                 "RAFTLOG_LOAD_TIMEOUT_MS": str(load_timeout_ms)})
        wait_for(lambda: self.stable_offset() >= -1, "the solo node to serve", timeout=30)

    def session(self) -> Session:
        return Session(self.servers, timeout_s=30)

    def stable_offset(self) -> int:
        s = self.session()
        try:
            return int(s.call({"t": "load_status"})["high_watermark"])
        finally:
            s.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
