"""What `raftlog bench partitions` reads from outside the nodes: CPU from /proc, counters from
each node's /metrics, per-partition leaders and terms from `status`, and the machine's load.

Why from outside: the figures must hold for the processes as a user runs them, so the bench
never reaches inside a node. CPU is utime+stime of the node process (/proc/<pid>/stat, in
clock ticks), counters are Prometheus counters read over HTTP and differenced over a window.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from dataclasses import dataclass, field

from bench.harness import Cluster
from bench.wire import status_of
from raft.cli.localcluster import free_ports

_TICKS = os.sysconf("SC_CLK_TCK")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)\s*$")


def cpu_seconds(pid: int) -> float | None:
    """utime+stime of a process in seconds (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    rest = raw[raw.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / _TICKS  # fields 14 and 15 of proc(5)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def scrape(addr: str, timeout: float = 5.0) -> dict[str, float]:
    """A node's /metrics as {'name{labels}': value} (counters keep their _total name)."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def summed(sample: dict[str, float], name: str) -> float:
    """The sum of every labelled series of one metric (e.g. frames to every peer)."""
    return sum(v for k, v in sample.items() if k == name or k.startswith(name + "{"))


@dataclass
class MetricsCluster(Cluster):
    """A bench Cluster whose nodes also serve /metrics, each on its own port."""

    metrics: dict[int, str] = field(default_factory=dict)

    def start(self) -> "MetricsCluster":
        self.metrics = {i: f"127.0.0.1:{p}"
                        for i, p in enumerate(free_ports(self.size), start=1)}
        super().start()
        return self

    def start_node(self, node_id: int) -> None:
        base = self.extra_args
        self.extra_args = [*base, "--metrics-listen", self.metrics[node_id]]
        try:
            super().start_node(node_id)
        finally:
            self.extra_args = base

    def pid(self, node_id: int) -> int | None:
        node = self.nodes[node_id]
        return node.proc.pid if node.alive and node.proc is not None else None


@dataclass(slots=True)
class Window:
    """CPU and counters of every live node at the start of a window; `end()` gives the rates."""

    cluster: MetricsCluster
    t0: float = 0.0
    cpu: dict[int, float] = field(default_factory=dict)
    counters: dict[int, dict[str, float]] = field(default_factory=dict)

    def start(self) -> "Window":
        # Scrape first, then read the CPU clocks: rendering /metrics (a series per partition)
        # is the bench's own work, and must not count as the nodes' idle CPU.
        for i in self.cluster.nodes:
            pid = self.cluster.pid(i)
            if pid and cpu_seconds(pid) is not None:
                self.counters[i] = scrape(self.cluster.metrics[i])
        self.t0 = time.monotonic()
        for i in list(self.counters):
            c = cpu_seconds(self.cluster.pid(i) or 0)
            if c is None:
                del self.counters[i]
            else:
                self.cpu[i] = c
        return self

    def end(self) -> dict[str, dict[int, float]]:
        """Per node: cpu_pct (of one core), frames_ps (sent to each peer, averaged over peers:
        per node pair and direction), fsyncs_ps, elections_ps."""
        dt = time.monotonic() - self.t0
        out: dict[str, dict[int, float]] = {"cpu_pct": {}, "frames_ps": {}, "fsyncs_ps": {}}
        for i, c0 in self.cpu.items():
            pid = self.cluster.pid(i)
            c1 = cpu_seconds(pid) if pid else None
            if c1 is None:
                continue
            after, before = scrape(self.cluster.metrics[i]), self.counters[i]
            peers = max(1, len(self.cluster.nodes) - 1)
            out["cpu_pct"][i] = 100 * (c1 - c0) / dt
            frames = "raftlog_peer_frames_sent_total"
            out["frames_ps"][i] = (summed(after, frames) - summed(before, frames)) / dt / peers
            fs = "raftlog_fsyncs_total"
            out["fsyncs_ps"][i] = (summed(after, fs) - summed(before, fs)) / dt
        return out


def partition_view(cluster: Cluster, topic: str) -> dict[int, dict[int, tuple[str, int, int]]]:
    """Per live node: {partition: (role, term, leader)} for `topic`, from its `status`."""
    out: dict[int, dict[int, tuple[str, int, int]]] = {}
    for i, node in cluster.nodes.items():
        if not node.alive:
            continue
        st = status_of(node.addr, timeout=10.0)
        if st is None:
            continue
        out[i] = {p["partition"]: (p["role"], p["term"], p["leader"])
                  for p in st.get("partitions", []) if p.get("topic") == topic}
    return out


def led_partitions(view: dict[int, dict[int, tuple[str, int, int]]],
                   exclude: int | None = None) -> dict[int, int]:
    """{partition: leader node} for every partition some live node (not `exclude`) leads."""
    led: dict[int, int] = {}
    for node, parts in view.items():
        if node == exclude:
            continue
        for p, (role, _term, _leader) in parts.items():
            if role == "leader":
                led[p] = node
    return led


def terms(view: dict[int, dict[int, tuple[str, int, int]]]) -> dict[int, int]:
    """{partition: highest term any live node knows}."""
    out: dict[int, int] = {}
    for parts in view.values():
        for p, (_role, term, _leader) in parts.items():
            out[p] = max(out.get(p, 0), term)
    return out


def wait_quiet(cluster: Cluster, bound_s: float) -> float | None:
    """Poll every live node's `status` until none has an awake group (all quiesced: elections,
    the leader balancer's transfers and catch-ups are over): seconds waited, None past
    `bound_s`. An idle figure taken before that measures the settling, not the idle node."""
    t0 = time.monotonic()
    while True:
        quiet = True
        for node in cluster.nodes.values():
            if not node.alive:
                continue
            st = status_of(node.addr, timeout=10.0)
            if st is None or (st.get("groups") or {}).get("awake", 1) != 0:
                quiet = False
                break
        if quiet:
            return time.monotonic() - t0
        if time.monotonic() - t0 > bound_s:
            return None
        time.sleep(0.5)


def wait_led(cluster: Cluster, topic: str, partitions: int, bound_s: float,
             exclude: int | None = None) -> tuple[float | None, int]:
    """Poll every live node's `status` until each of the topic's partitions runs on every live
    node and one of them leads it: (seconds, partitions led), seconds None past `bound_s`.
    The metadata's leader is one node's view; this is every node's."""
    t0 = time.monotonic()
    led = 0
    while True:
        view = partition_view(cluster, topic)
        led = len(led_partitions(view, exclude))
        everywhere = all(len(v) >= partitions for n, v in view.items() if n != exclude)
        if led >= partitions and everywhere:
            return time.monotonic() - t0, led
        if time.monotonic() - t0 > bound_s:
            return None, led
        time.sleep(0.1)
