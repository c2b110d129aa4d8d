"""What every workload receives from the runner, and shared payload helpers."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.disk import DiskPlan
from bench.harness import Cluster
from bench.wire import status_of
from storage.records import encode_values

MB = 1_000_000
RECORD_SIZES = {"100B": 100, "1KiB": 1024, "16KiB": 16 << 10}


@dataclass(slots=True)
class BenchConfig:
    workloads: list[str]
    nodes: int = 3
    duration: float = 2.0  # measured seconds per point (after warmup)
    repeats: int = 3
    quick: bool = False
    base_dir: str | None = None  # where cluster data dirs and probe files go (default: $TMPDIR)
    server_args: list[str] = field(default_factory=list)
    batch_bytes: int = 256 << 10  # client batching: record bytes per produce request
    window: int = 8  # produce requests in flight per producer
    keep: bool = False
    # `partitions` workload: which of its measures to run (empty: all) and its large count.
    only: list[str] = field(default_factory=list)
    partitions: int = 1000
    producers: int | None = None  # `scale`: load generator processes (None: its default)


@dataclass
class Ctx:
    cfg: BenchConfig
    limits: dict[str, Any]
    advance: Callable[[str], None]  # one progress step done; the text says what runs next
    describe: Callable[[str], None]
    # results.json `errors`: a point whose load generator failed is reported here and the
    # workload goes on with its next point.
    errors: list[dict[str, Any]] = field(default_factory=list)
    # Set by the runner per workload: the directory its clusters live in (removed after it
    # unless --keep-data) and the disk bound they run with (bench/disk.py).
    data_dir: str | None = None
    disk: DiskPlan | None = None

    def point_failed(self, workload: str, point: str, exc: BaseException) -> str:
        error = f"{type(exc).__name__}: {exc}"
        self.errors.append({"workload": workload, "point": point, "error": error})
        return error

    def cluster(self, tls: bool = False) -> Cluster:
        """A cluster (not started) under this workload's data dir, with retention sized to the
        free space: the bench's flags first, so a --server-arg of the user's wins."""
        bound = self.disk.server_args if self.disk is not None else []
        return Cluster(self.cfg.nodes, base_dir=self.data_dir or self.cfg.base_dir,
                       extra_args=[*bound, *self.cfg.server_args], keep=self.cfg.keep, tls=tls)

    def limit(self, name: str) -> float | None:
        v = self.limits.get(name)
        if isinstance(v, dict):
            return v.get("median", v.get("p50"))
        return v


def batch_payload(record_size: int, batch_bytes: int) -> tuple[bytes, int]:
    """One pre-encoded batch of random records (count = how many fit in batch_bytes).

    Encoded once and resent: the server treats payloads as opaque, and encoding per request
    would measure the generator's CPU instead of the server."""
    count = max(1, batch_bytes // record_size)
    value = os.urandom(record_size)
    return encode_values([value] * count), count


def loop_lag_of(cluster: Cluster, node_id: int) -> dict[str, Any] | None:
    """A node's event-loop lag over the last seconds (`status` field `loop_lag`: max, p99,
    ...), or None when the node does not answer or does not report it."""
    node = cluster.nodes.get(node_id)
    if node is None or not node.alive:
        return None
    st = status_of(node.addr, timeout=5.0)
    return None if st is None else st.get("loop_lag")
