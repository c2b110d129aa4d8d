"""`raftlog serve` (one node until SIGTERM) and `raftlog up` (a local cluster of real node
processes until Ctrl-C)."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from raft.node.config import NodeConfig

if TYPE_CHECKING:
    from rich.console import Console

    from raft.cli.localcluster import LocalCluster
    from raft.cli.localtls import LocalTLS


def cmd_serve(args: argparse.Namespace) -> int:
    from raft.node.serve import serve

    return serve({k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")})


def cmd_up(args: argparse.Namespace) -> int:
    from rich.console import Console

    from raft.cli.localcluster import LocalCluster

    console = Console(stderr=True)
    cluster = LocalCluster(Path(args.data_dir), nodes=args.nodes, base_port=args.base_port)
    tls = _up_tls(args, cluster, console)
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
        if tls is not None:
            console.print(f"TLS: clients add {tls.client_flags()} (or: export "
                          f"RAFTLOG_TLS_CA={tls.ca})", soft_wrap=True)
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


def _up_tls(args: argparse.Namespace, cluster: "LocalCluster", console: "Console") -> "LocalTLS | None":
    """`up --tls`: certificates under DATA_DIR/tls/ (made once, reused), TLS flags per node."""
    if not args.tls:
        return None
    from raft.cli.localtls import prepare

    tls = prepare(Path(args.data_dir), list(cluster.addresses))
    cluster.node_args = tls.node_args
    cluster.client_options = tls.client_options
    console.print(f"TLS on: CA {tls.ca}, node certificates in {tls.directory}", soft_wrap=True)
    return tls


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run one node until SIGTERM")
    NodeConfig.add_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("up", help="run a local cluster of real processes until Ctrl-C")
    p.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    p.add_argument("--data-dir", default="./data", help="where the nodes keep their logs")
    p.add_argument("--base-port", type=int, default=7101,
                   help="node i listens on base-port + i - 1 (default 7101)")
    p.add_argument("--tls", action="store_true",
                   help="TLS on every connection, with a throw-away CA and node certificates "
                        "made under DATA_DIR/tls/ (reused on restart); clients pass "
                        "--tls-ca DATA_DIR/tls/ca.pem")
    p.set_defaults(func=cmd_up)
