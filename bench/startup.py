"""How fast a restarted follower answers: `python -m bench.startup --runs 10`.

`bench recovery`'s clock starts when the stopped follower is started again, and on a calm
machine about half of its 200 MiB catch-up was that process starting (imports, opening LMDB,
the runtime) before it answered at all (docs/PERFORMANCE.md "start28"). This measures that part
alone, many times on one 3-node cluster: a follower is stopped cleanly, MB MiB are written with
leader acks while it is down, it is started again, and the parent polls it every 5 ms. Per
restart: seconds from the exec to its first status answer, the process's CPU seconds
(utime+stime, /proc/PID/stat) at that moment (the figure that holds up under load), and
seconds until its flushed offset reached what was written while it was down. Medians printed,
every run in --json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time

from bench.harness import Cluster
from bench.wire import status_of
from bench.workloads.recovery import _fill

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def restart_once(cluster: Cluster, lag: int, leader: int, mb: int) -> dict[str, float]:
    cluster.kill(lag, signal.SIGTERM)
    top = _fill(cluster.nodes[leader].addr, mb) if mb else -1
    cluster.start_node(lag)
    node = cluster.nodes[lag]
    t0 = time.perf_counter()
    answered = cpu = None
    while time.perf_counter() - t0 < 60:
        st = status_of(node.addr, timeout=1.0)
        if st is not None:
            if answered is None:
                answered = time.perf_counter() - t0
                cpu = cpu_seconds(node.proc.pid)
            if st.get("flushed_offset", -2) >= top:
                return {"answer_s": answered, "cpu_s": cpu,
                        "caught_up_s": time.perf_counter() - t0}
        time.sleep(0.005)
    raise RuntimeError(f"node {lag} did not catch up within 60 s:\n{cluster.log_tail(lag)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--mb", type=int, default=1, help="MiB written while the follower is down")
    p.add_argument("--json", help="write every run here")
    args = p.parse_args(argv)
    runs = []
    with Cluster(3) as cluster:
        leader = cluster.wait_for_leader()
        lag = next(i for i in cluster.nodes if i != leader)
        for _ in range(args.runs):
            runs.append(restart_once(cluster, lag, leader, args.mb))
            cluster.wait_caught_up()
    for key in ("answer_s", "cpu_s", "caught_up_s"):
        values = [r[key] for r in runs]
        print(f"{key}: median {statistics.median(values):.3f} "
              f"(min {min(values):.3f}, max {max(values):.3f}, n={len(values)})")
    print(f"load: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "load1": os.getloadavg()[0]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
