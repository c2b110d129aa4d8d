"""`raftlog serve` (one node until SIGTERM) and `raftlog up` (a local cluster of real node
processes until Ctrl-C)."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from raft.node.config import NodeConfig


def cmd_serve(args: argparse.Namespace) -> int:
    from raft.node.serve import serve

    return serve({k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")})


def cmd_up(args: argparse.Namespace) -> int:
    from rich.console import Console

    from raft.cli.localcluster import LocalCluster

    console = Console(stderr=True)
    cluster = LocalCluster(Path(args.data_dir), nodes=args.nodes, base_port=args.base_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster.start()
    try:
        for i, addr in cluster.addresses.items():
            console.print(f"node {i}: {addr}  (log: {cluster.data_dir / f'node-{i}.log'})")
        try:
            with console.status("waiting for a leader..."):
                leader = cluster.wait_leader(timeout=30)
        except TimeoutError:
            console.print("[red]no leader within 30 s[/]; see the node logs above")
            return 1
        console.print(f"leader: node {leader}. servers: [bold]{cluster.servers}[/]")
        console.print(f"try: echo hello | raftlog produce --servers {cluster.servers}")
        console.print("Ctrl-C stops every node cleanly.")
        while not stop.wait(0.5):
            dead = [i for i in cluster.addresses if not cluster.alive(i)]
            if dead:
                console.print(f"[red]node(s) {dead} exited[/]; see their logs. Stopping.")
                return 1
        return 0
    finally:
        codes = cluster.stop()
        console.print(f"stopped: exit codes {codes}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run one node until SIGTERM")
    NodeConfig.add_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("up", help="run a local cluster of real processes until Ctrl-C")
    p.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    p.add_argument("--data-dir", default="./data", help="where the nodes keep their logs")
    p.add_argument("--base-port", type=int, default=7101,
                   help="node i listens on base-port + i - 1 (default 7101)")
    p.set_defaults(func=cmd_up)
