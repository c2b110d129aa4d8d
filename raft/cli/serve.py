"""`raftlog serve` (one node until SIGTERM) and `raftlog up` (a local cluster of real node
processes until Ctrl-C; raft.cli.up supervises it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from raft.cli.argtypes import non_negative_int, positive_int
from raft.node.config import NodeConfig

if TYPE_CHECKING:
    from raft.cli.localcluster import LocalCluster
    from raft.cli.localtls import LocalTLS

# Parsed attributes that are the CLI's, not node settings.
_NOT_SETTINGS = ("func", "command", "verbose", "sub_verbose")
# The principal of the client certificate `up --tls` makes itself when its nodes require
# authentication (any certificate of the cluster CA may ask for status).
UP_PRINCIPAL = "raftlog-up"


def cmd_serve(args: argparse.Namespace) -> int:
    from raft.node.serve import serve

    return serve({k: v for k, v in vars(args).items() if k not in _NOT_SETTINGS})


def cmd_up(args: argparse.Namespace) -> int:
    from raft.cli.localcluster import LocalCluster
    from raft.cli.up import supervise, usable_data_dir
    from raft.cli import up_settings

    usable_data_dir(Path(args.data_dir))  # before --tls writes its certificates there
    up_settings.check_server_args(args.server_arg)
    config = up_settings.check_config_file(args.config) if args.config else None
    cluster = LocalCluster(Path(args.data_dir), nodes=args.nodes, base_port=args.base_port,
                           shards=args.shards or local_shards(args.nodes))
    tls = _up_tls(args, cluster)
    cluster.node_args = up_settings.node_args(args.server_arg, config, cluster.node_args)
    configs = up_settings.check_nodes(cluster)
    if tls is None and configs[0].tls_enabled:  # TLS through --server-arg/--config
        cluster.client_options = {"tls_ca": configs[0].tls_ca}
    if up_settings.wants_auth(configs):
        _up_credentials(args, cluster, tls)
    notes = up_settings.describe(configs)
    if tls is not None:
        notes.append(f"TLS: clients add {tls.client_flags()} (or: export "
                     f"RAFTLOG_TLS_CA={tls.ca})")
    return supervise(cluster, restart=args.restart, notes=notes, partitions=args.partitions)


def local_shards(nodes: int) -> int:
    """`up`'s default --shards: the nodes of a local cluster share this host's usable cores,
    so each gets its share (1 on a 2-core machine with 3 nodes; 4 with 3 nodes on 12)."""
    from raft.node.config import usable_cores

    return max(1, usable_cores() // nodes)


def _up_credentials(args: argparse.Namespace, cluster: "LocalCluster",
                    tls: "LocalTLS | None") -> None:
    """With auth on, `up` itself must authenticate to watch its nodes (status): a client
    certificate of its local CA (`up --tls`), else the token in RAFTLOG_TOKEN."""
    import os

    from raft.cli import pki
    from raft.node.config import ConfigError

    if tls is not None:
        paths = pki.client_paths(tls.directory, UP_PRINCIPAL)
        if not (paths.key.exists() and pki.valid_for(paths.cert, 7)):
            pki.issue_client(tls.directory, UP_PRINCIPAL)
        cluster.client_options = {**cluster.client_options, "tls_cert": str(paths.cert),
                                  "tls_key": str(paths.key)}
    elif os.environ.get("RAFTLOG_TOKEN"):
        cluster.client_options = {**cluster.client_options,
                                  "token": os.environ["RAFTLOG_TOKEN"]}
    else:
        raise ConfigError("with an auth file `up` must authenticate to watch its nodes: add "
                          "--tls (`up` then uses a client certificate of its local CA), or "
                          "export RAFTLOG_TOKEN with a token of the auth file")


def _up_tls(args: argparse.Namespace, cluster: "LocalCluster") -> "LocalTLS | None":
    """`up --tls`: certificates under DATA_DIR/tls/ (made once, reused), TLS flags per node."""
    if not args.tls:
        return None
    from raft.cli.localtls import prepare
    from raft.cli.up import say

    tls = prepare(Path(args.data_dir), list(cluster.addresses))
    cluster.node_args = tls.node_args
    cluster.client_options = tls.client_options
    say(f"TLS on: CA {tls.ca}, node certificates in {tls.directory}")
    return tls


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="run one node until SIGTERM",
        description="Run one node until SIGTERM or Ctrl-C (a clean stop: a leader hands "
                    "over, the log is flushed). Settings come from flags or --config FILE.toml "
                    "(keys = flag names with _; flags win); `raftlog config show` prints the "
                    "effective ones. Exit 0 after a clean stop (130 when Ctrl-C asked for "
                    "it), 2 on a configuration error (including a data dir another process "
                    "is using), 3 after a fail-stop.")
    NodeConfig.add_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "up", help="run a local cluster of real processes until Ctrl-C",
        description="Start a local cluster of `raftlog serve` processes on 127.0.0.1 and "
                    "watch it until Ctrl-C (which stops every node cleanly, exit 130). A node "
                    "that dies is reported and the others keep running; --restart restarts "
                    "it. --server-arg and --config give every node the same settings. "
                    "Each node logs to DATA_DIR/node-<id>.log. One `up` per data dir.")
    p.add_argument("--nodes", type=positive_int, default=3, help="cluster size (default 3)")
    p.add_argument("--data-dir", default="./data",
                   help="where the nodes keep their logs (default ./data)")
    p.add_argument("--base-port", type=non_negative_int, default=7101,
                   help="node i listens on base-port + (i - 1) x K, K its shards "
                        "(default 7101; 0 = pick free ports)")
    p.add_argument("--partitions", type=positive_int, default=None, metavar="N",
                   help="grow the topic `default` to N partitions once the cluster is up "
                        "(commands without --topic use its partition 0; --topic default "
                        "spreads by key over all N)")
    p.add_argument("--shards", type=positive_int, default=None, metavar="K",
                   help="shard processes per node (default: the usable cores shared by the "
                        "nodes, at least 1; docs/SHARDS.md): node i's shard k listens on its "
                        "port + k, so nodes' ports are K apart")
    p.add_argument("--tls", action="store_true",
                   help="TLS on every connection, with a throw-away CA and node certificates "
                        "made under DATA_DIR/tls/ (reused on restart); clients pass "
                        "--tls-ca DATA_DIR/tls/ca.pem")
    p.add_argument("--restart", action="store_true",
                   help="restart a node that dies (with a growing pause if it keeps dying); "
                        "by default it stays down and `up` prints how to restart it (a node "
                        "restarted that way is watched, and stopped by Ctrl-C, too)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="pass ARG to every node's `raftlog serve` (repeatable; write it with "
                        "=, as in --server-arg=--retention-ms=7d); {id} becomes the node's "
                        "id: --server-arg=--metrics-listen=127.0.0.1:91{id}0")
    p.add_argument("--config", metavar="FILE.toml",
                   help="pass --config FILE.toml to every node (`raftlog serve --config`: "
                        "keys = serve's flag names with _); not node_id, data_dir, peers, "
                        "listen or join, which `up` sets")
    p.set_defaults(func=cmd_up)
