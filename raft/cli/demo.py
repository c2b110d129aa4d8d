"""`raftlog demo` (what `make run` runs): a local 3-node cluster of real processes, a short
workload at every ack level, a leader SIGKILL under quorum writes, and a report.

It checks what it shows: every quorum-acknowledged record must be readable, exactly once, at its
acknowledged offset on every node after the killed node restarts and catches up. Exit 0 only
when that holds."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from raft.cli.args import positive_int
from raft.cli.localcluster import LocalCluster
from raft.cli.status import render_status
from raft.client import BlockingClient, RaftlogError
from raft.protocol.partitioner import partition_for_key
from storage.records import Record


def run_demo(records: int = 3000, keep: bool = False, nodes: int = 3) -> int:
    # Wide enough for the status tables when output is piped (make run, CI logs).
    console = Console() if Console().is_terminal else Console(width=120)
    root = Path(tempfile.mkdtemp(prefix="raftlog-demo-"))
    cluster = LocalCluster(root, nodes=nodes)
    summary: list[tuple[str, str]] = []
    ok = True
    try:
        console.rule("[bold]raftlog demo")
        cluster.start()
        console.print(f"started {nodes} nodes: {cluster.servers} (data in {root})")
        with console.status("electing a leader..."):
            t0 = time.monotonic()
            leader = cluster.wait_leader(timeout=30)
        summary.append(("first leader", f"node {leader} after "
                                        f"{time.monotonic() - t0:.2f} s"))

        client = BlockingClient(cluster.servers, timeout=15.0)
        acked: dict[int, bytes] = {}  # quorum-acknowledged offset -> value
        for acks in ("quorum", "leader", "none"):
            values = [f"{acks}-{i}".encode() for i in range(records)]
            with console.status(f"producing {records} records with acks={acks}..."):
                t0 = time.monotonic()
                offsets = client.produce_idempotent(values, acks=acks, batch_bytes=64 << 10)
                dt = time.monotonic() - t0
            if acks == "quorum":
                acked.update(zip(offsets, values))
            summary.append((f"produce acks={acks}",
                            f"{records} records in {dt:.2f} s ({records / dt:,.0f} rec/s)"))

        # A leader SIGKILL while a quorum writer keeps going.
        leader = cluster.wait_leader()
        stop = threading.Event()
        failover = FailoverTimer()
        writer_errors: list[str] = []

        def writer() -> None:
            i = 0
            while not stop.is_set():
                value = f"failover-{i}".encode()
                sent_at = time.monotonic()
                try:
                    (off,) = client.produce_idempotent([value], acks="quorum")
                except RaftlogError as e:
                    writer_errors.append(f"{e.code}: {e.message}")
                    continue
                acked[off] = value
                failover.write_acked(sent_at, time.monotonic())
                i += 1

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        time.sleep(0.5)  # let the writer get going before the kill (demo pacing)
        with console.status(f"SIGKILL of leader node {leader} under quorum writes..."):
            cluster.kill(leader)  # returns once the process is gone
            failover.killed(time.monotonic())
            new_leader = cluster.wait_leader(timeout=30, exclude=leader)
            failover.wait(timeout=30)
            stop.set()
            thread.join(timeout=30)
        if failover.seconds is not None:
            summary.append(("failover", f"node {new_leader} leads; writes succeeded again "
                                        f"{failover.seconds:.2f} s after the kill"))
        else:
            ok = False
            summary.append(("failover", "[red]no write succeeded within 30 s[/]"))

        with console.status(f"restarting node {leader}; recovery catches it up..."):
            t0 = time.monotonic()
            cluster.start(leader)
            cluster.wait_caught_up(leader, timeout=60)
        summary.append((f"node {leader} recovery", f"caught up in {time.monotonic() - t0:.2f} s"))

        with console.status("checking every quorum-acked record on every node..."):
            problems = verify(cluster, acked)
        if problems:
            ok = False
            for p in problems[:10]:
                console.print(f"[red]{p}[/]")
        summary.append(("quorum-acked records", f"{len(acked)} checked on {nodes} nodes: "
                        + ("[green]all present exactly once[/]" if not problems
                           else f"[red]{len(problems)} problems[/]")))
        with console.status("a topic of 4 partitions: keyed records, read back..."):
            t0 = time.monotonic()
            topic_problems = topic_round_trip(client, replicas=min(3, nodes))
        if topic_problems:
            ok = False
            for p in topic_problems[:10]:
                console.print(f"[red]{p}[/]")
        summary.append((f"topic {DEMO_TOPIC}", (
            f"{DEMO_PARTITIONS} partitions, {TOPIC_RECORDS} records over {TOPIC_KEYS} keys in "
            f"{time.monotonic() - t0:.2f} s: " + (
                "[green]each key in its partition, in order, read back exactly once[/]"
                if not topic_problems else f"[red]{len(topic_problems)} problems[/]"))))
        client.close()

        with BlockingClient(cluster.servers) as c:
            render_status(c.cluster_status(), console)
        table = Table(title="demo summary", show_header=False)
        table.add_column("what")
        table.add_column("result")
        for k, v in summary:
            table.add_row(k, v)
        console.print(table)
        console.print("[green]demo passed[/]" if ok else "[red]demo FAILED[/]")
        return 0 if ok else 1
    except (TimeoutError, RaftlogError) as e:
        console.print(f"[red]demo failed: {e}[/]")
        for i in cluster.addresses:
            tail = cluster.node_log(i).strip().splitlines()[-5:]
            if tail:
                console.print(f"node {i} log tail:\n  " + "\n  ".join(tail))
        return 1
    finally:
        cluster.stop()
        if keep:
            console.print(f"data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


DEMO_TOPIC = "demo-orders"
DEMO_PARTITIONS = 4
TOPIC_RECORDS = 2000
TOPIC_KEYS = 50


def topic_round_trip(client: BlockingClient, replicas: int) -> list[str]:
    """Create a topic of DEMO_PARTITIONS partitions, produce keyed records (quorum, idempotent)
    and read every partition back: each key must sit in the partition Kafka's partitioner
    picks, in the order produced, and every acknowledged record must be read exactly once."""
    client.create_topic(DEMO_TOPIC, DEMO_PARTITIONS, replicas)
    records = [Record(f"{i}".encode(), f"user-{i % TOPIC_KEYS}".encode())
               for i in range(TOPIC_RECORDS)]
    placed = client.produce_to_topic(records, topic=DEMO_TOPIC, batch_bytes=16 << 10)
    problems = []
    read: dict[tuple[int, int], tuple[bytes | None, bytes]] = {}
    for partition in range(DEMO_PARTITIONS):
        offset = 0
        while True:
            res = client.fetch(offset, topic=DEMO_TOPIC, partition=partition)
            for r in res.records:
                if (partition, r.offset) in read:
                    problems.append(f"partition {partition} offset {r.offset} read twice")
                read[(partition, r.offset)] = (r.key, r.value)
            if res.next_offset > res.high_watermark or res.next_offset == offset:
                break
            offset = res.next_offset
    for rec, (partition, offset) in zip(records, placed):
        if partition != partition_for_key(rec.key, DEMO_PARTITIONS):
            problems.append(f"key {rec.key!r} went to partition {partition}")
        if read.get((partition, offset)) != (rec.key, rec.value):
            problems.append(f"record {rec.value!r} not read back at {partition}/{offset}")
    if len(read) != len(records):
        problems.append(f"read {len(read)} records, {len(records)} were acknowledged")
    order: dict[bytes | None, list[tuple[int, int]]] = {}
    for rec, place in zip(records, placed):
        order.setdefault(rec.key, []).append(place)
    for key, places in order.items():
        if len({p for p, _ in places}) != 1 or places != sorted(places):
            problems.append(f"key {key!r} is not in one partition in the order produced")
    return problems


class FailoverTimer:
    """How long writes failed after the leader's kill: from the moment the killed process is
    gone to the first acknowledgement of a write *sent* after it. A write sent before the kill
    may be acknowledged by the old leader in its last moments (or its answer read late), which
    would make failover look instant; only writes that started after the kill can show that a
    new leader took over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.killed_at: float | None = None
        self.recovered_at: float | None = None

    def killed(self, at: float) -> None:
        with self._lock:
            self.killed_at = at

    def write_acked(self, sent_at: float, acked_at: float) -> None:
        with self._lock:
            if self.killed_at is not None and sent_at >= self.killed_at \
                    and self.recovered_at is None:
                self.recovered_at = acked_at
                self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    @property
    def seconds(self) -> float | None:
        with self._lock:
            if self.killed_at is None or self.recovered_at is None:
                return None
            return self.recovered_at - self.killed_at


def verify(cluster: LocalCluster, acked: dict[int, bytes]) -> list[str]:
    """Read every node's committed log and compare with what was quorum-acknowledged."""
    problems: list[str] = []
    if not acked:
        return ["nothing was quorum-acknowledged"]
    top = max(acked)
    with BlockingClient(cluster.servers, timeout=15.0) as client:
        for node_id, addr in cluster.addresses.items():
            seen: dict[int, bytes] = {}
            offset = 0
            while offset <= top:
                res = client.fetch(offset, max_bytes=4 << 20, address=addr, max_wait=1.0)
                for r in res.records:
                    seen[r.offset] = r.value
                if res.next_offset <= offset:
                    break
                offset = res.next_offset
            counts: dict[bytes, int] = {}
            for v in seen.values():
                counts[v] = counts.get(v, 0) + 1
            for off, value in acked.items():
                if seen.get(off) != value:
                    problems.append(f"node {node_id}: offset {off} holds {seen.get(off)!r}, "
                                    f"acknowledged {value!r}")
                elif counts[value] != 1:
                    problems.append(f"node {node_id}: {value!r} appears {counts[value]} times")
    return problems


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(records=args.records, keep=args.keep)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="start a local 3-node cluster, run a short workload "
                                    "(every ack level, a leader SIGKILL), report, stop")
    p.add_argument("--records", type=positive_int, default=3000,
                   help="records written per ack level (default 3000)")
    p.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    p.set_defaults(func=cmd_demo)


__all__ = ["FailoverTimer", "cmd_demo", "register", "run_demo", "verify"]
