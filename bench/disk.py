"""How much disk a bench workload may use: retention sized to the free space, and the refusal of
a workload that would not fit.

Why: the nodes keep every record forever unless told otherwise, and a bench run writes as fast
as the machine allows. Unbounded, `raftlog bench produce` wrote 22.7 GB per node and filled a
64 GB disk; the nodes then could not flush, the run failed with "cluster did not catch up" and
still exited 0. Every cluster the bench starts now runs with `--retention-bytes` sized by the
rule below, and with `--low-disk-mb` at the safety margin (the node's own valve: below it, a
leader stops holding data back for a lagging member).

The rule (docs/PERFORMANCE.md, "Disk"), for F bytes free on the --data-dir filesystem when a
workload starts, and N nodes on it (3, or 6 for the two clusters of `tls`):

    margin     = max(F / 10, 64 MiB)            never used: other writers, our estimate's error
    per node   = (F - margin) / N               the nodes share one filesystem
    retention  = per node / LMDB_FACTOR - SLACK

LMDB_FACTOR (2): LMDB is copy-on-write and reuses freed pages only once no transaction can see
them, so its data file runs up to about twice what the log holds (the node's own process test
holds a 64 MiB retention under 128 MiB). SLACK (32 MiB a node, also doubled): size retention
keeps up to one batch more than retention-bytes (whole batches), the newest committed batch
always stays, and a round runs every 250 ms, so what arrives between two rounds is on disk
before it is deleted.

A workload declares what each node must keep (`DiskNeed.keep_bytes`): the least retention it
can run under. Throughput workloads need only MIN_KEEP; workloads that read back or catch up
everything they wrote (fetch, recovery, catchup, spark) need all of it. If the rule gives less
than that, the workload is refused with the space it needs and the space free.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

MIB = 1 << 20
LMDB_FACTOR = 2
SLACK_BYTES = 32 * MIB
MARGIN_FRACTION = 0.10
MIN_MARGIN_BYTES = 64 * MIB
MIN_KEEP = 16 * MIB  # the least log a node keeps: 64 of the bench's default 256 KiB batches


class DiskTooSmall(Exception):
    """A workload (or the probes) would not fit in the free space; the message says how much it
    needs, how much is free, and what to do."""


@dataclass(slots=True, frozen=True)
class DiskNeed:
    """What a workload asks of the disk: each node must be able to keep `keep_bytes` of log
    (retention never below it); `clusters` clusters of the run's size run at once; `why`
    names what that log is, for the refusal message."""

    keep_bytes: int = MIN_KEEP
    clusters: int = 1
    why: str = "the newest batches while retention deletes the rest"


@dataclass(slots=True, frozen=True)
class DiskPlan:
    """The disk bound of one workload's clusters: the node flags and how they were derived."""

    free_bytes: int
    nodes: int
    margin_bytes: int
    retention_bytes: int
    need: DiskNeed
    user_retention_bytes: int | None = None  # --server-arg --retention-bytes, when given
    server_args: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"free_bytes": self.free_bytes, "nodes": self.nodes,
                "margin_bytes": self.margin_bytes, "retention_bytes": self.retention_bytes,
                "keep_bytes": self.need.keep_bytes, "user_retention_bytes":
                    self.user_retention_bytes, "server_args": list(self.server_args)}


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on path's filesystem (statvfs f_bavail): the
    space a node's --low-disk-mb valve also measures."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def margin(free: int) -> int:
    return max(int(free * MARGIN_FRACTION), MIN_MARGIN_BYTES)


def node_footprint(retention: int) -> int:
    """The most one node's data dir may reach under --retention-bytes `retention`."""
    return LMDB_FACTOR * (retention + SLACK_BYTES)


def retention_for(free: int, nodes: int) -> int:
    """The rule: the retention each of `nodes` nodes sharing `free` bytes runs with (may be
    zero or negative: nothing fits)."""
    per_node = (free - margin(free)) // max(1, nodes)
    return per_node // LMDB_FACTOR - SLACK_BYTES


def free_needed(keep: int, nodes: int) -> int:
    """The least free space at which retention_for() reaches `keep` (the inverse of the rule,
    rounded up to whole MiB)."""
    used = nodes * node_footprint(keep)
    need = max(-(-used * 10 // 9), used + MIN_MARGIN_BYTES)  # F - max(F/10, 64 MiB) >= used
    return -(-need // MIB) * MIB


def fmt_bytes(n: int) -> str:
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / MIB:.0f} MiB"


def user_retention(server_args: list[str]) -> int | None:
    """A --retention-bytes the user passed with --server-arg (the last one wins, as in the
    node's own parsing), in bytes; None when not given."""
    from raft.node.config_values import parse_size

    args = [part for arg in server_args for part in shlex.split(arg)]
    found = None
    for i, arg in enumerate(args):
        if arg == "--retention-bytes" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--retention-bytes="):
            found = arg.split("=", 1)[1]
    return None if found is None else parse_size(found, "--retention-bytes")


def plan(workload: str, need: DiskNeed, free: int, nodes_per_cluster: int, where: str,
         server_args: list[str] | None = None) -> DiskPlan:
    """The disk bound for one workload, or DiskTooSmall when it would not fit."""
    nodes = nodes_per_cluster * need.clusters
    retention = retention_for(free, nodes)
    user = user_retention(server_args or [])
    if retention < need.keep_bytes:
        raise DiskTooSmall(
            f"workload {workload} needs {fmt_bytes(free_needed(need.keep_bytes, nodes))} free "
            f"on {where} and {fmt_bytes(free)} is free: each of its {nodes} nodes must keep "
            f"{fmt_bytes(need.keep_bytes)} of log ({need.why}), which takes up to "
            f"{fmt_bytes(node_footprint(need.keep_bytes))} on disk with LMDB's overhead, plus "
            f"a safety margin of {fmt_bytes(MIN_MARGIN_BYTES)} or 10% of the free space. Free "
            f"some space or point --data-dir at a bigger disk (docs/PERFORMANCE.md, Disk)")
    if user is not None and user > retention:
        raise DiskTooSmall(
            f"workload {workload}: --server-arg --retention-bytes {fmt_bytes(user)} does not "
            f"fit: with {fmt_bytes(free)} free on {where}, {nodes} nodes can each keep at most "
            f"{fmt_bytes(retention)}. Pass a smaller --retention-bytes or omit it (the bench "
            f"then sizes it)")
    if user is not None and user < need.keep_bytes:
        raise DiskTooSmall(
            f"workload {workload}: --server-arg --retention-bytes {fmt_bytes(user)} is below "
            f"the {fmt_bytes(need.keep_bytes)} each node must keep ({need.why}). Pass at least "
            f"that or omit it")
    chosen = retention if user is None else user
    m = margin(free)
    # The bench's flags come first: a --server-arg given by the user comes later and wins.
    args = ["--retention-bytes", str(chosen), "--low-disk-mb", str(max(1, m // MIB))]
    return DiskPlan(free, nodes, m, chosen, need, user, args)


class FreeSpaceWatch:
    """The least free space seen on a filesystem while a workload runs, sampled by a daemon
    thread (a measurement for results.json, never a synchronisation): `with FreeSpaceWatch(p)
    as w: ...; w.min_free`."""

    def __init__(self, path: str, period_s: float = 0.2) -> None:
        import threading

        self.path = path
        self.period_s = period_s
        self.min_free: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-disk-watch", daemon=True)

    def _sample(self) -> None:
        try:
            free = free_bytes(self.path)
        except OSError:
            return
        self.min_free = free if self.min_free is None else min(self.min_free, free)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> "FreeSpaceWatch":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
