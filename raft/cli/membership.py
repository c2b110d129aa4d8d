"""Operator commands for membership and leadership, part of `raftlog`:

    raftlog add-node --id 4 --address 127.0.0.1:7104
    raftlog remove-node --id 2
    raftlog transfer-leader [--to 3]

A node being added should already run with `raftlog serve --join` (it then starts outside the
configuration). It joins as a learner, recovery catches it up, and the leader promotes it to
voter once its match index reaches the leader's flushed offset; `raftlog status` shows the
progress (recovering, bytes behind, catch-up rate). A node that is not running yet can be
added too (add-node warns): it is caught up the same way once it starts.

`add-node` for a member that lost its disk (restarted with the same --node-id on an empty or
damaged data directory; `raftlog status` shows it "rejoining: lost its disk") re-adds it as a
learner with its new data directory, as the leader does by itself when it hears from it: it is
caught up and promoted like a new node (docs/DISK-LOSS.md).

Each command prints one line of text, or one JSON object with --json. A membership change is an
entry in the log, so it takes an offset (record offsets skip it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from raft.cli.args import json_flag, servers_arg
from raft.cli.security import client_options
from raft.client import BlockingClient, RaftlogError


def _client(args: argparse.Namespace) -> BlockingClient:
    return BlockingClient(args.servers, timeout=args.timeout, **client_options(args))


def _print(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    print(json.dumps(obj) if args.json else text)


def _probe(c: BlockingClient, node_id: int, address: str) -> str | None:
    """A warning when nothing answers at `address` (None when node `node_id` runs there);
    a BAD_REQUEST error when another node does."""
    try:
        st = c.status(address)
    except RaftlogError as e:
        return (f"node {node_id} does not answer at {address} ({e.code}). It is added as a "
                f"learner anyway: start it with `raftlog serve --node-id {node_id} --join "
                f"--data-dir DIR --peers <every node, {node_id}={address} included>` and "
                f"recovery catches it up from the leader; it becomes a voter once caught up")
    if st.get("node_id") != node_id:
        raise RaftlogError(f"the node at {address} says it is node {st.get('node_id')}, not "
                           f"{node_id}; check --id and --address", code="BAD_REQUEST")
    return None


def cmd_add_node(args: argparse.Namespace) -> int:
    with _client(args) as c:
        warning = _probe(c, args.id, args.address)
        if warning:
            print(f"raftlog add-node: warning: {warning}", file=sys.stderr)
        reply = c.add_node(args.id, args.address, timeout=args.timeout)
    voters, learners = reply.get("voters"), reply.get("learners")
    _print(args, {"added": args.id, "address": args.address, "voters": voters,
                  "learners": learners, "offset": reply.get("offset"),
                  "running": warning is None},
           f"added node {args.id} ({args.address}) as a learner; voters {voters}, learners "
           f"{learners}. It becomes a voter once caught up: watch `raftlog status`.")
    return 0


def cmd_remove_node(args: argparse.Namespace) -> int:
    with _client(args) as c:
        reply = c.remove_node(args.id, timeout=args.timeout)
    voters, learners = reply.get("voters"), reply.get("learners")
    _print(args, {"removed": args.id, "voters": voters, "learners": learners,
                  "offset": reply.get("offset")},
           f"removed node {args.id}; voters {voters}, learners {learners}. The removed "
           f"node no longer receives the log: stop it.")
    return 0


def cmd_transfer_leader(args: argparse.Namespace) -> int:
    with _client(args) as c:
        reply = c.transfer_leader(args.to, timeout=args.timeout)
    lid, addr = reply.get("leader_id"), reply.get("leader_addr")
    if lid is None:
        text = ("the old leader stepped down; no new leader was known within --timeout: "
                "check `raftlog status`")
    else:
        text = f"node {lid} ({addr}) leads now"
    _print(args, {"leader_id": lid, "leader_addr": addr}, text)
    return 0 if lid is not None else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        servers_arg(p, timeout=30.0, timeout_help="seconds to wait for the change to take "
                                                  "effect", profile_timeout=False)
        json_flag(p, "print the result as one JSON object")

    p = subparsers.add_parser(
        "add-node", help="add a node (as a learner, promoted to voter once caught up), or "
                         "re-add a member that lost its disk",
        description="Add a node as a learner; the leader promotes it to voter once recovery "
                    "has caught it up. Start it first with `raftlog serve --join`; if it is "
                    "not running yet, it is added anyway (with a warning) and caught up once "
                    "it starts. For a member that lost its disk (restarted with the same id "
                    "on an empty data directory), it re-adds it as a learner with its new "
                    "data directory, which the leader also does by itself "
                    "(docs/DISK-LOSS.md).")
    p.add_argument("--id", type=int, required=True, help="the new node's id")
    p.add_argument("--address", required=True, metavar="HOST:PORT",
                   help="where the new node listens (start it with `raftlog serve --join`)")
    common(p)
    p.set_defaults(func=cmd_add_node)

    p = subparsers.add_parser("remove-node", help="remove a member (the leader hands over "
                                                  "first when it is the one removed)")
    p.add_argument("--id", type=int, required=True, help="the node to remove")
    common(p)
    p.set_defaults(func=cmd_remove_node)

    p = subparsers.add_parser("transfer-leader", help="move leadership (to a caught-up voter)",
                              description="Move leadership and print the new leader once "
                                          "the cluster has one.")
    p.add_argument("--to", type=int, default=None, help="target node (default: the most "
                                                        "caught-up voter)")
    common(p)
    p.set_defaults(func=cmd_transfer_leader)
