"""`raftlog recover --force-new-cluster`: the way out of a lost majority (docs/DISK-LOSS.md,
"A lost majority: force a new cluster").

    raftlog recover --force-new-cluster --data-dir DIR --node-id 1 [--yes] [--json]

Run on one surviving node's data directory while that node is stopped. It makes the node the
only voter of a new cluster from its own flushed log (the rule is raft/core/force_new.py; this
module does the I/O): it prints what may be lost (this node's flushed offset and commit index,
and that anything committed elsewhere beyond them is gone) and proceeds only with --yes or a
typed confirmation. It refuses while the node runs (the data directory's lock,
storage/dirlock.py). Every run leaves an audit record: in the forced configuration entry itself
(replicated to the nodes re-added later) and as a JSON line in <node dir>/recover-audit.log.
Start the node again with its usual command; re-add the others with `raftlog add-node` once
each runs on an empty data directory.

Topics (issue 26): the data directory holds the default topic's log (the legacy key space, the
one the plan is shown for) and the controller's (group 0). The controller is forced the same way
from its own flushed log, so the new cluster's controller can elect this node too; other
topics' partitions keep their configurations (re-place them after re-adding the nodes).
A node of K shards (docs/SHARDS.md) has a store per shard, DATA_DIR/node-<id>/shard-<k>/: each
is forced, shard 0's holding the controller and the default topic.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from raft.cli.args import json_flag
from raft.core.force_new import ForcePlan, NodeFacts, plan_force_new_cluster
from raft.core.membership import ClusterConfig
from raft.core.snapshot_sections import stored_config
from raft.node.config import ConfigError
from storage import open_log
from storage.api import DataDirLocked, LogStorage, Meta, StorageError
from storage.batch import BatchKind

AUDIT_FILE = "recover-audit.log"
CONTROLLER_GROUP = 0  # the controller's log in the node's store (raft.node.controller)
CONFIRM_WORD = "force"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "recover", help="force a way out of a lost majority (run on a stopped node)",
        description="Make one stopped node the only voter of a new cluster from its own "
                    "flushed log, when a majority of the voters lost their data for good and "
                    "no leader can be elected. Anything committed elsewhere beyond this node's "
                    "flushed log is lost. See docs/DISK-LOSS.md.")
    p.add_argument("--force-new-cluster", action="store_true",
                   help="make this node a single-voter cluster of itself (required: the only "
                        "recovery this command does)")
    p.add_argument("--data-dir", required=True, help="the node's --data-dir (it uses "
                                                     "DATA_DIR/node-<id>/)")
    p.add_argument("--node-id", type=int, required=True, help="the node's --node-id")
    p.add_argument("--yes", action="store_true",
                   help="proceed without asking (after printing what may be lost)")
    json_flag(p, "print the plan and the result as one JSON object")
    p.set_defaults(func=cmd_recover)


def store_dirs(node_dir: Path) -> list[Path]:
    """The node's store directories: DATA_DIR/node-<id>/ itself, or for a node of K shards
    (its `shards` file, raft.node.supervisor) each DATA_DIR/node-<id>/shard-<k>/ (docs/SHARDS.md).
    Shard 0's holds the controller and the default topic; each other shard's holds the groups
    0 and 1 of its own cell, which its runtime needs to start, and its partitions."""
    marker = node_dir / "shards"
    if not marker.exists():
        return [node_dir]
    try:
        shards = int(marker.read_text().strip())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{marker} cannot be read ({e}); it records how many shards wrote "
                          f"this data: restore it (a number)") from None
    dirs = [node_dir / f"shard-{k}" for k in range(shards)]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise ConfigError(f"node {node_dir.name} ran {shards} shards but {', '.join(missing)} "
                          f"is missing; recover needs every shard's directory")
    return dirs


def _open(path: Path, node_id: int) -> LogStorage:
    try:
        return open_log(path)
    except DataDirLocked as e:
        raise ConfigError(f"node {node_id} is running ({e}); stop it first: recover "
                          f"rewrites its state and must own its data directory") from None
    except StorageError as e:
        raise ConfigError(f"cannot open node {node_id}'s log in {path}: {e}") from None


def cmd_recover(args: argparse.Namespace) -> int:
    if not args.force_new_cluster:
        raise ConfigError("say what to recover: --force-new-cluster (the only recovery there "
                          "is; read docs/DISK-LOSS.md first)")
    node_dir = Path(args.data_dir) / f"node-{args.node_id}"
    if not node_dir.is_dir():
        raise ConfigError(f"no data directory for node {args.node_id} at {node_dir}; give the "
                          f"node's own --data-dir and --node-id")
    dirs = store_dirs(node_dir)
    logs: list[LogStorage] = []
    try:
        for path in dirs:  # every shard's, before anything is shown or changed
            logs.append(_open(path, args.node_id))
        plans = [plan_force_new_cluster(read_facts(log, args.node_id)) for log in logs]
        _show(args, plans[0])  # shard 0's: the default topic's log
        if len(dirs) > 1 and not args.json:
            print(f"raftlog recover: node {args.node_id} runs {len(dirs)} shards: each shard's "
                  f"own groups 0 and 1 (in {node_dir}/shard-<k>/) are forced the same way",
                  file=sys.stderr)
        if not _confirmed(args):
            raise ConfigError("not confirmed: nothing was changed. Run it again with --yes (or "
                              f"type {CONFIRM_WORD!r} when asked) to proceed")
        now_ms = int(time.time() * 1000)
        controllers = []
        for log, plan in zip(logs, plans):
            controllers.append(_force_controller(log, args.node_id, now_ms))
            apply_plan(log, plan, now_ms)
    finally:
        for log in logs:
            log.close()
    for path, plan in zip(dirs, plans):
        _write_audit(path, plan, now_ms)
    plan = plans[0]
    done = (f"node {args.node_id} is now the only voter of a new cluster (term {plan.term}, "
            f"log kept up to offset {plan.keep_upto}); start it with its usual command, then "
            f"re-add each other node with `raftlog add-node --id N --address HOST:PORT` once "
            f"it runs on an empty data directory")
    if args.json:
        print(json.dumps({"forced": True, **plan.audit, "message": done,
                          "controller": controllers[0],
                          **({"shards": len(dirs)} if len(dirs) > 1 else {})}))
    else:
        print(f"raftlog recover: {done}", file=sys.stderr)
    return 0


def _force_controller(log: LogStorage, node_id: int, now_ms: int) -> dict[str, Any] | None:
    """Force the controller's log (group 0 of the same store) like the default topic's, so
    this node alone can lead the controller of the new cluster; its audit (None: no
    controller log in this directory, written before topics)."""
    store = log.store
    if CONTROLLER_GROUP not in store.group_ids():
        return None
    ctl = store.open_log(CONTROLLER_GROUP)
    try:
        plan = plan_force_new_cluster(read_facts(ctl, node_id))
        apply_plan(ctl, plan, now_ms)
        return dict(plan.audit)
    finally:
        ctl.close()


def read_facts(log: LogStorage, node_id: int) -> NodeFacts:
    """What the rule needs from the node's log, read whole: every batch is checked (a scrub
    pass), so damage the open did not reach is found before the log is trusted as the truth."""
    offset = log.start_offset
    while log.flushed_offset >= log.start_offset:
        got = log.scrub(offset, 64 << 20)
        offset = got.next_offset
        if got.wrapped:
            break
    meta = log.load_meta()
    first_damaged = log.first_damaged()
    last_config = _last_config(log, meta, first_damaged)
    commit = int((meta.config or {}).get("commit", -1))
    return NodeFacts(node_id, log.incarnation, meta.term, log.start_offset, log.flushed_offset,
                     log.term_at(log.flushed_offset), commit, first_damaged, log.lost_position,
                     last_config)


def _last_config(log: LogStorage, meta: Meta, first_damaged: int | None) -> ClusterConfig | None:
    """The configuration in force: the last CONFIG entry in the log, else the one stored with
    the log start, else the metadata's (None: the bootstrap members given by --peers)."""
    found: ClusterConfig | None = None
    end = log.flushed_offset if first_damaged is None else first_damaged - 1
    offset = log.start_offset
    while offset <= end:
        batches = log.read(offset, 8 << 20, 4096)
        if not batches:
            break
        for b in batches:
            if b.last_offset > end:
                break
            if b.kind == BatchKind.CONFIG:
                found = ClusterConfig.from_batch(b)
        offset = batches[-1].last_offset + 1
    if found is not None:
        return found
    at_start = stored_config(log.snapshot)
    if at_start is not None:
        return at_start.config
    history = (meta.config or {}).get("history") or []
    return ClusterConfig.from_dict(history[-1]["config"]) if history else None


def apply_plan(log: LogStorage, plan: ForcePlan, now_ms: int) -> None:
    """Write the plan: metadata first (its term above every term the log holds), then the cut
    and the forced configuration entry, flushed. Stopped half-way, a run again finishes it."""
    meta = log.load_meta()
    log.save_meta(Meta(plan.term, None, plan.meta_config(), dict(meta.extra)))
    if log.dirty_offset > plan.keep_upto:
        log.truncate_suffix(plan.keep_upto)
    log.append([plan.config_batch(now_ms)])
    log.flush()


def _show(args: argparse.Namespace, plan: ForcePlan) -> None:
    lines = [f"FORCING A NEW CLUSTER from node {plan.node_id}'s log. This throws away the "
             f"other nodes' view of the cluster:"]
    lines += [f"  - {w}" for w in plan.warnings()]
    lines.append("  Use it only when a majority of the voters lost their data for good and no "
                 "leader can be elected (docs/DISK-LOSS.md). Run it on ONE node, the one with "
                 "the longest log, never on two.")
    if args.json:
        print(json.dumps({"plan": {**plan.audit, "warnings": plan.warnings()}}), file=sys.stderr)
    else:
        print("\n".join(f"raftlog recover: {line}" for line in lines), file=sys.stderr)


def _confirmed(args: argparse.Namespace) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        return False
    print(f"Type {CONFIRM_WORD!r} to proceed: ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip() == CONFIRM_WORD


def _write_audit(node_dir: Path, plan: ForcePlan, now_ms: int) -> None:
    record: dict[str, Any] = {"action": "force-new-cluster", "at_ms": now_ms, **plan.audit}
    fd = os.open(node_dir / AUDIT_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
