"""Node settings for `raftlog up`: `--server-arg ARG` (repeatable, `{id}` becomes each node's
id) and `--config FILE.toml` (passed to every node as `serve --config FILE`), so metrics, auth
and retention need no hand-written file per node.

Everything is checked before any node starts, by parsing each node's complete `serve` command
as `serve` itself would (one line, exit 2): a typo in a server argument must not start three
nodes that each fail. What `up` sets for each node (id, data dir, peers, listen address, join)
is refused in either place, and so is one metrics address for several nodes (they would fight
over the port): `--server-arg=--metrics-listen=127.0.0.1:91{id}0` gives each its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raft.node.config import ConfigError, NodeConfig, read_toml

if TYPE_CHECKING:
    from raft.cli.localcluster import LocalCluster

# Settings `up` gives each node itself.
UP_SETS = ("node_id", "data_dir", "peers", "listen", "join")
ID_PLACEHOLDER = "{id}"


class _Refusing(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def node_args(server_args: list[str], config: str | None,
              tls_args: Callable[[int], list[str]] | None) -> Callable[[int], list[str]]:
    """The extra `serve` arguments of node i: TLS (from `up --tls`), --config, --server-arg."""
    def args(node_id: int) -> list[str]:
        out = list(tls_args(node_id)) if tls_args else []
        if config:
            out += ["--config", config]
        return out + [a.replace(ID_PLACEHOLDER, str(node_id)) for a in server_args]
    return args


def check_config_file(path: str) -> str:
    """The file's absolute path (the printed restart command works from any directory), after
    refusing what `up` sets for each node. Its other keys are checked with each node's
    settings."""
    values = read_toml(path, f"--config {path}")
    managed = [k for k in UP_SETS if k in values]
    if managed:
        raise ConfigError(f"--config {path} sets {', '.join(managed)}, which `up` sets for each "
                          f"node; remove {'them' if len(managed) > 1 else 'it'} from the file "
                          f"(--nodes, --data-dir and --base-port choose them)")
    return str(Path(path).resolve())


def check_server_args(server_args: list[str]) -> None:
    flags = {"--" + k.replace("_", "-") for k in UP_SETS}
    for arg in server_args:
        name = arg.split("=", 1)[0]
        if name in flags:
            raise ConfigError(f"--server-arg {arg}: `up` sets {name} for each node itself "
                              f"(--nodes, --data-dir and --base-port choose it)")


def check_nodes(cluster: "LocalCluster") -> list[NodeConfig]:
    """Every node's settings as its `serve` will read them; ConfigError naming the node."""
    parser = _Refusing(prog="raftlog serve", add_help=False)
    NodeConfig.add_arguments(parser)
    configs = []
    for i in cluster.addresses:
        argv = cluster.command(i)[4:]  # after `python -m raft.cli serve`
        try:
            configs.append(NodeConfig.from_args(parser.parse_args(argv)))
        except ConfigError as e:
            raise ConfigError(f"node {i}'s settings (--server-arg/--config): {e}") from None
    metrics = [c.metrics_listen for c in configs if c.metrics_listen]
    if len(set(metrics)) < len(metrics):
        raise ConfigError(f"every node would serve metrics at {metrics[0]}; give each its own "
                          f"port with {ID_PLACEHOLDER}, e.g. "
                          f"--server-arg=--metrics-listen=127.0.0.1:910{ID_PLACEHOLDER}")
    return configs


def wants_auth(configs: list[NodeConfig]) -> bool:
    return any(c.auth_file for c in configs)


def describe(configs: list[NodeConfig]) -> list[str]:
    """Lines for `up`'s start: what the node settings turned on."""
    out = []
    metrics = [(c.node_id, c.metrics_listen) for c in configs if c.metrics_listen]
    if metrics:
        out.append("metrics: " + ", ".join(f"node {i} http://{a}/metrics" for i, a in metrics))
    auth = {c.auth_file for c in configs if c.auth_file}
    if auth:
        out.append(f"auth on ({', '.join(sorted(auth))}): clients need a token "
                   f"(RAFTLOG_TOKEN; `raftlog token create`) or a client certificate")
    return out


__all__: list[Any] = ["check_config_file", "check_nodes", "check_server_args", "describe",
                      "node_args", "wants_auth"]
