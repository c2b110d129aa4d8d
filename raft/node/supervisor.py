"""`raftlog serve --shards K`: one node as a supervisor and K shard processes (docs/SHARDS.md).

Each shard is a node runtime of its own (raft.node.serve, one trio loop, one LMDB environment in
DATA_DIR/node-<id>/shard-<k>/, listening on the listen port + k, its peers' ports + k), so a
node uses K cores with nothing shared. Shard 0 holds the controller group and feeds what it
applied to the others over one private pipe each (raft.node.shard_feed).

The supervisor:
- checks the data directory's shard layout first (`check_layout`): a node's shard count is
  recorded in DATA_DIR/node-<id>/shards and a start with another count is refused, saying how
  to change it (partitions never move between shards of a node by themselves);
- starts the shards (each told, through the environment, its settings and its feed), each dies
  with the supervisor (PR_SET_PDEATHSIG) so no shard outlives it;
- forwards SIGTERM, SIGINT and SIGHUP to every shard (SIGTERM: each stops gracefully, handing its
  leaderships over, as a one-shard node does);
- is fail-stop as a whole: a shard that exits while the node is not stopping (a crash, SIGKILL,
  a fail-stop of its own) stops every other shard (SIGTERM, then SIGKILL after STOP_GRACE_S) and
  the supervisor exits 3 naming the shard and how it ended. A restart brings every shard back
  from its own data.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from raft.controller.state import shard_address
from raft.node.config import ConfigError, NodeConfig, parse_address, usable_cores
from raft.node.shard_feed import FEED_ENV, FEEDS_ENV, REPORT_ENV, REPORTS_ENV

SETTINGS_ENV = "RAFTLOG_SHARD_SETTINGS"  # a shard's settings, as JSON
LAYOUT_FILE = "shards"  # DATA_DIR/node-<id>/shards: how many shards wrote this data
STOP_GRACE_S = 30.0  # after SIGTERM, how long the shards may take before SIGKILL
EXIT_FAILED = 3


def recorded_shards(config: NodeConfig) -> int | None:
    """How many shards wrote this node's data (DATA_DIR/node-<id>/shards; 1 for data a
    one-shard node wrote), None for a node with no data yet."""
    base = config.base_node_dir
    marker = base / LAYOUT_FILE
    if marker.exists():
        try:
            return int(marker.read_text().strip())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{marker} cannot be read ({e}); it records how many shards "
                              f"wrote this data: restore it (a number)") from None
    if base.is_dir() and any(p.name != ".write-test" for p in base.iterdir()):
        return 1  # data written by a one-shard node (before shards, or --shards 1)
    return None


def default_shards(config: NodeConfig) -> int:
    """`--shards` left out (flag and config file): the count this node's data was written
    with, so a restart never changes it; for a new node the usable cores (its CPU affinity),
    one shard per core, but no more than the smallest port gap between two nodes of --peers
    on one host, so no shard takes another node's port (nodes on consecutive ports, as a
    hand-made local cluster has them, run one shard each). Every node given the same --peers
    on alike machines so computes the same K. One when the port is 0 (shard k listens on
    port + k: a fixed port is needed)."""
    recorded = recorded_shards(config)
    if recorded is not None:
        return recorded
    if config.listen_address[1] == 0:
        return 1
    shards = usable_cores()
    by_host: dict[str, list[int]] = {}
    for address in config.peers.values():
        host, port = parse_address(address)
        by_host.setdefault(host, []).append(port)
    for ports in by_host.values():
        ports.sort()
        for low, high in zip(ports, ports[1:]):
            shards = min(shards, max(1, high - low))
    return shards


def check_layout(config: NodeConfig) -> None:
    """Refuse to start with a shard count other than the one the data was written with
    (ConfigError saying what to do); record it on the first start."""
    base = config.base_node_dir
    marker = base / LAYOUT_FILE
    wanted = config.shards
    recorded = recorded_shards(config)
    if recorded is not None and recorded != wanted:
        raise ConfigError(
            f"{base} holds data written with --shards {recorded}; this start asks for "
            f"{wanted}. A node keeps its shard count: start it with --shards {recorded}. To "
            f"change it, start a new node (another id, empty --data-dir) with --shards "
            f"{wanted}, move this node's replicas to it (`raftlog topic move`), then remove "
            f"this node (docs/SHARDS.md \"Changing the shard count\")")
    if wanted > 1 and recorded is None:
        base.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(f"{wanted}\n")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        tmp.replace(marker)


def shard_settings(config: NodeConfig, shard: int) -> dict[str, Any]:
    """Shard `shard`'s settings: the node's, with its ports moved up by `shard`."""
    values = asdict(config)
    values["shard"] = shard
    values["data_dir"] = str(config.data_dir)
    values["peers"] = {str(n): shard_address(a, shard) for n, a in config.peers.items()}
    if config.listen is not None:
        values["listen"] = shard_address(config.listen, shard)
    if config.metrics_listen is not None:
        values["metrics_listen"] = shard_address(config.metrics_listen, shard)
    return {k: v for k, v in values.items() if v is not None}


def check_ports(config: NodeConfig) -> None:
    """Refuse (ConfigError naming what to change) when a port a shard above 0 needs is taken:
    shard k listens on the listen port + k (its metrics on the metrics port + k), so a node
    of K shards needs K free ports from each, and a node next to it K ports away. (Shard 0's
    own port is checked by its bind, as a one-shard node's is.)"""
    wanted = [("--listen", config.listen or config.peers[config.node_id])]
    if config.metrics_listen is not None:
        wanted.append(("--metrics-listen", config.metrics_listen))
    for flag, address in wanted:
        host, port = parse_address(address)
        for k in range(1, config.shards):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the shards bind
                try:
                    s.bind((host, port + k))
                except OSError as e:
                    raise ConfigError(
                        f"shard {k} of {config.shards} needs port {port + k} ({flag} port "
                        f"{port} + {k}) and it is taken ({e.strerror or e}): a node of "
                        f"--shards {config.shards} uses ports {port}..{port + config.shards - 1}"
                        f". Give {flag} a port with {config.shards} free ports from it (nodes "
                        f"on one host {config.shards} apart), or fewer --shards (--shards 1: one "
                        f"process, one port); docs/SHARDS.md") from None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the supervisor dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    """See the module docstring."""

    def __init__(self, config: NodeConfig, prog: str = "raftlog serve") -> None:
        self.config = config
        self.prog = prog
        self.shards: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.stop_signal: int | None = None

    def start(self) -> None:
        config = self.config
        if config.listen_address[1] == 0:
            raise ConfigError("with --shards above 1 give a fixed port (--listen or --peers): "
                              "shard k listens on that port + k")
        check_layout(config)
        check_ports(config)
        feeds = [os.pipe() for _ in range(1, config.shards)]  # shard 0 -> shard k
        reports = [os.pipe() for _ in range(1, config.shards)]  # shard k -> shard 0
        for shard in range(config.shards):
            env = dict(os.environ)
            env[SETTINGS_ENV] = json.dumps(shard_settings(config, shard))
            if shard == 0:
                fds = [w for _, w in feeds] + [r for r, _ in reports]
                env[FEEDS_ENV] = ",".join(str(w) for _, w in feeds)
                env[REPORTS_ENV] = ",".join(str(r) for r, _ in reports)
            else:
                fds = [feeds[shard - 1][0], reports[shard - 1][1]]
                env[FEED_ENV], env[REPORT_ENV] = str(fds[0]), str(fds[1])
            self.shards.append(subprocess.Popen(
                [sys.executable, "-m", "raft.node.shard_main"], env=env, pass_fds=fds,
                preexec_fn=_die_with_parent))
        for r, w in feeds + reports:  # the shards hold them now
            os.close(r)
            os.close(w)
        print(f"{self.prog}: node {config.node_id} runs {config.shards} shards (pids "
              f"{', '.join(str(p.pid) for p in self.shards)}): shard k listens on "
              f"{shard_address(config.listen or config.peers[config.node_id], 0)} port + k, "
              f"data in {config.base_node_dir}/shard-<k>/", file=sys.stderr, flush=True)

    def _forward(self, signum: int, _frame: Any) -> None:
        if signum != signal.SIGHUP:
            if self.stopping:
                return  # a second signal during the stop is ignored, as a shard does
            self.stopping = True
            self.stop_signal = signum
        for p in self.shards:
            if p.returncode is None:  # (not poll(): only the wait loop reaps, so no exit
                os.kill(p.pid, signum)  # goes unexamined; an unreaped pid is not reused)

    def run(self) -> int:
        """Start the shards and wait; the exit code (0 clean stop, 130 Ctrl-C, 3 fail-stop)."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._forward)
        self.start()
        failed: tuple[int, int] | None = None
        while any(p.returncode is None for p in self.shards):
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            shard = next((k for k, p in enumerate(self.shards) if p.pid == pid), None)
            if shard is None:
                continue
            self.shards[shard].returncode = os.waitstatus_to_exitcode(status)
            code = self.shards[shard].returncode
            # Stopping, a shard ends cleanly (0, or 130 after Ctrl-C), or by the signal it
            # was sent if it had not started listening for it yet.
            clean = (0, 130, -signal.SIGTERM, -signal.SIGINT)
            if failed is None and (not self.stopping or code not in clean):
                failed = (shard, code)
                self._fail_stop(shard, code)
        if failed is not None:
            return EXIT_FAILED
        return 130 if self.stop_signal == signal.SIGINT else 0

    def _fail_stop(self, shard: int, code: int) -> None:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else \
            f"exited with code {code}"
        print(f"{self.prog}: node {self.config.node_id} shard {shard} {how}; stopping the "
              f"whole node (fail-stop: a node runs all of its shards or none). Restart it: "
              f"each shard recovers from its own data in {self.config.base_node_dir}/"
              f"shard-<k>/", file=sys.stderr, flush=True)
        self.stopping = True
        for p in self.shards:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.shards:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def supervise(config: NodeConfig, prog: str = "raftlog serve") -> int:
    return Supervisor(config, prog).run()


def shard_dirs(config: NodeConfig) -> list[Path]:
    return [config.base_node_dir / f"shard-{k}" for k in range(config.shards)]
