"""Running one node as a program: `raftlog serve`, `python -m raft.node`, logging and signals.

SIGTERM/SIGINT begin a graceful stop (raft.node.server.Node.request_shutdown); a second signal
during the stop is ignored on purpose. SIGHUP re-reads the auth file and the TLS files
(Node.reload_security) without a restart. Exit codes: 0 after a clean stop, 2 after a configuration
error (one line on stderr saying what to fix), 3 after a fail-stop (the node could no longer
trust its own state: a storage fault or a broken invariant; see raft.node.errors.NodeFailed).

Process-wide interpreter settings (the garbage collector, the GIL switch interval) are set by
the program (`tune_interpreter`, which the node runs once its state is loaded, before it serves:
the full collection it starts with is then a step nobody waits on). They belong to the process,
whatever number of Raft groups it runs (the test session does the same for its process:
tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import trio

from raft.node.config import ConfigError, NodeConfig, read_toml
from raft.node.errors import NodeFailed
from raft.node.identity import IdState
from raft.node.logfmt import make_formatter
from raft.node.looplag import slow_step_instruments
from raft.node.server import Node
from raft.core.types import DataLost
from storage.api import LogInconsistent, LogStorage

log = logging.getLogger("raftlog.node")

GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections (Python's default: 700)
GIL_SWITCH_INTERVAL_S = 0.001  # Python's default: 0.005


def cluster_line(node: Node) -> str:
    """Which cluster the data belongs to, as the start line says it (raft/node/identity.py)."""
    ident = node.transport.identity
    if ident.state is IdState.FIRM:
        return f"cluster {ident.cluster_id}"
    if ident.state is IdState.TENTATIVE:
        return f"cluster {ident.cluster_id} (proposed: agreed once every founder has started)"
    return "cluster id not known yet (taken from the founder or the first peer that has one)"


def tune_interpreter() -> None:
    """Keep the interpreter itself from holding the event loop (process-wide settings; run it
    once the node's state is loaded, so what is alive then is frozen, and before it serves).

    - The cyclic garbage collector: a full (generation 2) collection walks every tracked
      object; with trio, msgpack, lmdb and the rest loaded that was 50-160 ms on a busy 2-core
      machine, every few seconds under load. Objects alive once the node is up (modules,
      classes, the core) are frozen out of collections, and young collections run less often
      (refcounting frees almost everything this server allocates: batches, frames, replies).
    - The GIL switch interval: while a worker thread runs Python code (a flush encoding its
      batches), the event loop waits up to this long for the GIL at each wake-up; 1 ms instead
      of the default 5 ms."""
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, g1, g2)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def configure_logging(level: str = "WARNING", fmt: str = "text",
                      context: Callable[[], dict[str, Any]] | None = None,
                      shard: int | None = None) -> None:
    """Structured lines on stderr, key=value text or JSON (raft.node.logfmt); quiet (WARNING)
    unless asked. `context` adds node id and term to JSON lines."""
    formatter = make_formatter(fmt, context, shard)
    for name in ("raftlog", "raft"):  # the node's loggers, and the load service's
        logger = logging.getLogger(name)
        logger.setLevel(getattr(logging, level.upper(), logging.WARNING))
        mine = [h for h in logger.handlers if getattr(h, "_raftlog", False)]
        if mine:
            for handler in mine:
                handler.setFormatter(formatter)
            continue
        handler = logging.StreamHandler()
        handler.setFormatter(formatter)
        handler._raftlog = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False


async def run_node(config: NodeConfig, *, log_storage: LogStorage | None = None,
                   on_signal: Callable[[int], None] | None = None,
                   before_serving: Callable[[], None] = lambda: None,
                   task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
    """`raftlog serve`: run one node until SIGTERM/SIGINT, then stop cleanly (flush, save
    metadata, close the log) and return. A second signal during the stop is ignored on purpose:
    the stop is bounded and exiting half-way would skip the final flush. `log_storage` is for
    tests (the node otherwise opens its durable log under the data dir); `before_serving` is
    the program's process-wide setup (Node runs it once its state is loaded). `on_signal`
    hears each stop signal (serve exits 130 after Ctrl-C, as every command does)."""
    node = Node(config, log_storage=log_storage, before_serving=before_serving)

    def log_context() -> dict[str, Any]:
        core = node.group.core
        return {"node": config.node_id, "term": core.term if core is not None else None}

    configure_logging(config.log_level, config.log_format, log_context,
                      config.shard if config.shards > 1 else None)
    try:
        await _run_node(node, config, task_status, on_signal)
    except BaseExceptionGroup as group:
        # A startup configuration problem (port in use, data dir) is one clear error for the
        # CLI (exit 2), not an exception group.
        for kind in (ConfigError, NodeFailed):
            matched, _ = group.split(kind)
            if matched is not None:
                raise _leaves(matched)[0] from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


async def _run_node(node: Node, config: NodeConfig, task_status: trio.TaskStatus[Node],
                    on_signal: Callable[[int], None] | None = None) -> None:
    async with trio.open_nursery() as nursery:
        async def watch_signals(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT,
                                           signal.SIGHUP) as signals:
                task_status.started()
                async for signum in signals:
                    log.info("signal_received node=%d signal=%s", config.node_id,
                             signal.Signals(signum).name)
                    if signum == signal.SIGHUP:
                        node.reload_security()
                    else:
                        if on_signal is not None:
                            on_signal(signum)
                        node.request_shutdown()

        await nursery.start(watch_signals)
        await nursery.start(node.run)
        task_status.started(node)
        await node._stopped.wait()
        nursery.cancel_scope.cancel()


async def _serve_and_announce(config: NodeConfig, prog: str) -> int:
    """run_node, plus one line on stderr once the node listens: where, its data, its peers
    and the state of its log (an operator should not have to guess whether it started).
    The process's interpreter settings are tuned as the node starts serving. Returns the exit
    code: 0 after SIGTERM, 130 after Ctrl-C (SIGINT); both stop cleanly."""
    stops: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(functools.partial(
                run_node, config, on_signal=stops.append, before_serving=tune_interpreter))
            log_storage, core = node.log, node.core
            peers = ", ".join(f"{i}={a}" for i, a in sorted(node.peer_addresses.items()))
            print(f"{prog}: node {config.node_id} listening on {node.address}; data in "
                  f"{config.node_dir}; peers {peers or '(none)'}; term {core.term}, log "
                  f"{log_storage.start_offset}..{log_storage.dirty_offset} (flushed "
                  f"{log_storage.flushed_offset}); {cluster_line(node)}"
                  f"{'; waiting to be added (--join)' if config.join else ''}. SIGTERM or "
                  f"Ctrl-C stops it cleanly.", file=sys.stderr, flush=True)
            print(f"{prog}: {features_line(config)}", file=sys.stderr, flush=True)
    except BaseExceptionGroup as group:
        for kind in (ConfigError, NodeFailed):
            matched, _ = group.split(kind)
            if matched is not None:
                raise _leaves(matched)[0] from None
        raise
    return 130 if signal.SIGINT in stops[:1] else 0


def features_line(config: NodeConfig) -> str:
    """What is on and where, in one line at start: an operator should see at once whether a
    node runs in clear, lets anyone in, exports metrics or deletes old data."""
    if config.tls_enabled:
        tls = f"TLS on (certificate {config.tls_cert}, CA {config.tls_ca})"
    else:
        tls = "TLS off (plaintext; --tls-cert/--tls-key/--tls-ca turn it on)"
    auth = (f"auth on ({config.auth_file})" if config.auth_file
            else "auth off (every client may do everything; --auth-file turns it on)")
    metrics = (f"metrics on at http://{config.metrics_listen}/metrics" if config.metrics_listen
               else "metrics off (--metrics-listen HOST:PORT)")
    limits = []
    if config.retention_bytes is not None:
        limits.append(f"at most {config.retention_bytes:,} bytes")
    if config.retention_ms is not None:
        limits.append(f"batches younger than {_duration(config.retention_ms)}")
    retention = (f"retention on (keeps {' and '.join(limits)})" if limits
                 else "retention off (keeps everything; --retention-bytes/--retention-ms)")
    return "; ".join((tls, auth, metrics, retention))


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def main(argv: list[str] | None = None) -> int:
    """`python -m raft.node --node-id 1 --data-dir DIR --peers ...`: the node alone, without the
    full CLI (`raftlog serve` does the same). Exit codes: 0 clean stop, 2 configuration error."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m raft.node",
                                     description="Run one raftlog node until SIGTERM/SIGINT.")
    NodeConfig.add_arguments(parser)
    args = parser.parse_args(argv)
    return serve(vars(args), prog="raftlog")


def serve(settings: dict[str, Any], prog: str = "raftlog serve", *,
          as_shard: bool = False) -> int:
    """Validate settings (flag values, or --config's TOML plus flags) and run the node until
    SIGTERM. Exit code 0 after a clean stop, 2 after a configuration error (one line on
    stderr saying what to fix). With --shards above 1 this process supervises that many
    shard processes (raft.node.supervisor); `as_shard` is one of them. Without --shards the
    node runs what its data was written with, else the usable cores
    (supervisor.default_shards)."""
    from raft.node import supervisor

    try:
        config = NodeConfig.from_args(settings)
        if not as_shard:
            if not _shards_given(settings):  # the default (docs/SHARDS.md "Sizing K")
                config = dataclasses.replace(config, shards=supervisor.default_shards(config))
            supervisor.check_layout(config)
            if config.shards > 1:
                return supervisor.supervise(config, prog)
        config.check_data_dir()
        code = trio.run(_serve_and_announce, config, prog, instruments=slow_step_instruments())
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except NodeFailed as e:
        if isinstance(e.__cause__, (DataLost, LogInconsistent)):
            # A restart finds the same log: its message says what to do (docs/DISK-LOSS.md).
            print(f"{prog}: {e}", file=sys.stderr)
        else:
            print(f"{prog}: {e}; restart it (it recovers from its flushed log), and see "
                  f"docs/STORAGE-SAFETY.md if it fails again", file=sys.stderr)
        return 3
    return code


def _shards_given(settings: dict[str, Any]) -> bool:
    """Whether --shards (or `shards` in the --config file) was given."""
    if settings.get("shards") is not None:
        return True
    path = settings.get("config")
    return bool(path) and "shards" in read_toml(path)


if __name__ == "__main__":
    raise SystemExit(main())
