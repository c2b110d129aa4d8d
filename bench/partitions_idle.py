"""Partitions bench, idle and failover: what N quiesced groups cost a node, and how fast a node's
groups fail over when it is killed (issue 26 item 12: partitions.idle1000.cpu_pct,
partitions.idle.frames_ps.p1/.p100/.p1000, partitions.failover1000.s,
partitions.failover1000.elections_per_partition).

    python -m bench.partitions_idle [--groups 1,100,1000] [--idle-s 10] [--failover]
                                    [--out results.json]

Three node processes on 127.0.0.1, each a `raftlog serve` node (raft.node.server.Node, default
settings: tick 50 ms, election 10 ticks, quiescence on) running groups 0..N-1 on in-memory logs,
added 100 at a time (each step waits until they are led and quiet)
(an idle group writes nothing, so the storage engine does not enter the idle figures). Until
`raftlog topic create` exists, each process adds its groups itself with Node.add_group (the
one place bench imports the runtime: pyproject's import contract names this module).

For each N: wait until every group on every node has a leader and has quiesced, then measure
over --idle-s seconds each process's CPU time (/proc/PID/stat utime+stime) and the frames each
link wrote (pings included): CPU as % of one core per node, frames/s per node pair (both
directions). With --failover (at the largest N): the node leading the most groups (about a
third, as the elections placed them) is SIGKILLed, and the survivors are polled every 50 ms
until every group has one leader both know; reported: seconds from the kill, and elections per
group (the survivors' term increase), over all groups and over the groups it led.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any

# -- the node process ------------------------------------------------------------------------


def _node_main(args: argparse.Namespace) -> None:
    import trio

    from raft.node.config import NodeConfig
    from raft.node.server import Node
    from storage.memory import MemoryLog

    peers = {i + 1: f"127.0.0.1:{p}" for i, p in enumerate(args.ports)}
    voters = sorted(peers)
    config = NodeConfig(node_id=args.node_id, data_dir="/nonexistent-in-memory",
                        peers=peers, log_level="ERROR")

    def tune() -> None:  # what `raftlog serve` does (raft.node.serve.tune_interpreter)
        import gc
        gc.collect()
        gc.freeze()
        _, g1, g2 = gc.get_threshold()
        gc.set_threshold(10_000, g1, g2)
        sys.setswitchinterval(0.001)

    async def main() -> None:
        node = Node(config, log_storage=MemoryLog(), before_serving=tune)
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            stdin = trio.lowlevel.FdStream(os.dup(0))
            buf = b""
            while True:
                data = await stdin.receive_some()
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    cmd = line.decode().split()
                    if cmd[0] == "add":  # groups [a, b): the driver adds them in steps
                        for g in range(int(cmd[1]), int(cmd[2])):
                            if g in node.registry:  # the controller and the default topic's
                                continue  # partition run from boot: they count among the N
                            await node.add_group(g, voters, MemoryLog())
                            await trio.lowlevel.checkpoint()
                    out = _report(node)
                    sys.stdout.write(json.dumps(out) + "\n")
                    sys.stdout.flush()
            node.request_shutdown()

    trio.run(main)


def _report(node: Any) -> dict[str, Any]:
    """Links' counters, every group's (id, role, leader, term, quiesced), peers down."""
    links = {str(p): {"frames": link.sent_frames, "pings": link.sent_pings,
                      "messages": link.sent_messages} for p, link in node.links.items()}
    groups = [[g.group_id, g.core.role.value, g.core.leader_id, g.core.term,
               g.core.quiesced] for g in node.registry.groups()]
    return {"links": links, "groups": groups, "down": sorted(node.transport.liveness.down)}


# -- the driver -------------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# Groups are added this many at a time, each step waiting until all are led and quiet: a
# thousand groups electing at once, all awake, is the topic-create case (not measured here).
ADD_STEP = 100


class Cluster:
    def __init__(self, groups: int) -> None:
        ports = _free_ports(3)
        self.procs = {}
        for i in (1, 2, 3):
            self.procs[i] = subprocess.Popen(
                [sys.executable, "-m", "bench.partitions_idle", "node", "--node-id", str(i),
                 "--groups", str(groups), "--ports", *map(str, ports)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, i: int, cmd: str = "report") -> dict[str, Any]:
        p = self.procs[i]
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"node {i} exited ({p.poll()})")
        return json.loads(line)

    def cpu_s(self, i: int) -> float:
        with open(f"/proc/{self.procs[i].pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def _settled(reports: dict[int, dict[str, Any]]) -> bool:
    """Every group has one leader every node knows, and every group is quiesced."""
    by_group: dict[int, list[Any]] = {}
    for r in reports.values():
        for g, role, leader, _term, quiet in r["groups"]:
            by_group.setdefault(g, []).append((role, leader, quiet))
    for rows in by_group.values():
        leaders = {leader for _, leader, _ in rows}
        if len(leaders) != 1 or None in leaders or not all(q for _, _, q in rows):
            return False
        if sum(1 for role, _, _ in rows if role == "leader") != 1:
            return False
    return True


def _wait(cluster: Cluster, nodes: list[int], cond: Any, timeout_s: float,
          what: str) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        reports = {i: cluster.ask(i) for i in nodes}
        if cond(reports):
            return reports
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def measure_idle(groups: int, idle_s: float, failover: bool,
                 step: int = ADD_STEP) -> dict[str, Any]:
    cluster = Cluster(groups)
    try:
        _wait(cluster, [1, 2, 3], _settled, 300, "group 0 led and quiesced")
        started = time.monotonic()
        for a in range(1, groups, step):
            b = min(groups, a + step)
            for i in (1, 2, 3):
                cluster.ask(i, f"add {a} {b}")
            _wait(cluster, [1, 2, 3], _settled, 300, f"groups 0..{b - 1} led and quiesced")
        settle_s = time.monotonic() - started
        time.sleep(2.0)  # let the settling's own work (the last rounds) finish
        before = {i: (cluster.cpu_s(i), cluster.ask(i)) for i in (1, 2, 3)}
        t0 = time.monotonic()
        time.sleep(idle_s)
        elapsed = time.monotonic() - t0
        after = {i: (cluster.cpu_s(i), cluster.ask(i)) for i in (1, 2, 3)}
        cpu = {i: 100 * (after[i][0] - before[i][0]) / elapsed for i in (1, 2, 3)}
        frames: dict[str, float] = {}
        messages = 0
        for i in (1, 2, 3):
            for peer, link in after[i][1]["links"].items():
                pair = "-".join(sorted((str(i), peer)))
                sent = link["frames"] - before[i][1]["links"][peer]["frames"]
                frames[pair] = frames.get(pair, 0.0) + sent / elapsed
                messages += link["messages"] - before[i][1]["links"][peer]["messages"]
        out: dict[str, Any] = {"groups": groups, "idle_s": round(elapsed, 2),
                               "added_in_steps_of": step, "settle_s": round(settle_s, 1),
                               "cpu_pct_per_node": {str(i): round(c, 2) for i, c in cpu.items()},
                               "cpu_pct_max": round(max(cpu.values()), 2),
                               "frames_ps_per_pair": {k: round(v, 1) for k, v in frames.items()},
                               "frames_ps_max": round(max(frames.values()), 1),
                               "raft_messages_while_idle": messages}
        if failover:
            print(json.dumps(out), flush=True)  # the idle figures, whatever the failover does
            try:
                out["failover"] = _failover(cluster, groups)
            except RuntimeError as e:
                out["failover"] = {"error": str(e)}
        return out
    finally:
        cluster.close()


def _failover(cluster: Cluster, groups: int) -> dict[str, Any]:
    """SIGKILL the node leading the most groups (leaders as the elections placed them, about a
    third each); poll the survivors until every group has one leader both know."""
    reports = {i: cluster.ask(i) for i in (1, 2, 3)}
    victim = max((1, 2, 3), key=lambda i: sum(1 for row in reports[i]["groups"]
                                               if row[1] == "leader"))
    moved = [row[0] for row in reports[victim]["groups"] if row[1] == "leader"]
    survivors = [i for i in (1, 2, 3) if i != victim]
    terms: dict[int, int] = {}
    for i in survivors:
        for g, _role, _leader, term, _q in reports[i]["groups"]:
            terms[g] = max(terms.get(g, 0), term)
    killed = time.monotonic()
    cluster.procs[victim].send_signal(signal.SIGKILL)
    while True:
        now_reports = {i: cluster.ask(i) for i in survivors}
        now = time.monotonic()
        rows_by_group: dict[int, list[Any]] = {}
        for i in survivors:
            for g, role, leader, _t, _q in now_reports[i]["groups"]:
                rows_by_group.setdefault(g, []).append((role, leader))
        done = all(sum(1 for role, _ in rows if role == "leader") == 1
                   and len({leader for _, leader in rows}) == 1
                   and rows[0][1] in survivors for rows in rows_by_group.values())
        if done:
            break
        if now - killed > 120:
            raise RuntimeError("failover did not complete in 120 s")
        time.sleep(0.05)
    final: dict[int, int] = {}
    for i in survivors:
        for g, _role, _leader, term, _q in now_reports[i]["groups"]:
            final[g] = max(final.get(g, 0), term)
    elections = {g: final[g] - terms[g] for g in terms}
    return {"groups": groups, "killed_node": victim, "groups_it_led": len(moved),
            "seconds": round(now - killed, 2),
            "elections_per_group": round(sum(elections.values()) / groups, 3),
            "elections_per_group_it_led": round(sum(elections[g] for g in moved)
                                                / max(1, len(moved)), 3),
            "max_elections_one_group": max(elections.values())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    node = sub.add_parser("node")
    node.add_argument("--node-id", type=int, required=True)
    node.add_argument("--groups", type=int, required=True)
    node.add_argument("--ports", type=int, nargs=3, required=True)
    parser.add_argument("--groups", default="1,100,1000")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--failover", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.mode == "node":
        _node_main(args)
        return
    sizes = [int(x) for x in args.groups.split(",")]
    runs = []
    for n in sizes:
        run = measure_idle(n, args.idle_s, args.failover and n == max(sizes))
        print(json.dumps(run), flush=True)
        runs.append(run)
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"nproc": os.cpu_count(), "cpu": platform.processor() or
                          platform.machine(), "load": os.getloadavg()},
              "runs": runs}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
