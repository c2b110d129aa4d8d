"""Operator commands for membership and leadership, part of `raftlog`:

    raftlog add-node --id 4 --address 127.0.0.1:7104 [--servers ...]
    raftlog remove-node --id 2 [--servers ...]
    raftlog transfer-leader [--to 3] [--servers ...]

A node being added should already run with `raftlog serve --join` (it then starts outside the
configuration). It joins as a learner, recovery catches it up, and the leader promotes it to
voter once its match index reaches the leader's flushed offset; `raftlog status` shows the
progress (recovering, bytes behind, catch-up rate).

`add-node` for a member that lost its disk (restarted with the same --node-id on an empty or
damaged data directory; `raftlog status` shows it "rejoining: lost its disk") re-adds it as a
learner with its new data directory, as the leader does by itself when it hears from it: it is
caught up and promoted like a new node (docs/DISK-LOSS.md)."""

from __future__ import annotations

import argparse
import json

from raft.cli.args import DEFAULT_SERVERS
from raft.client import BlockingClient


def _client(args: argparse.Namespace) -> BlockingClient:
    return BlockingClient(args.servers, timeout=args.timeout)


def cmd_add_node(args: argparse.Namespace) -> int:
    with _client(args) as c:
        reply = c.add_node(args.id, args.address, timeout=args.timeout)
    print(json.dumps({"added": args.id, "address": args.address,
                      "voters": reply.get("voters"), "learners": reply.get("learners")}))
    return 0


def cmd_remove_node(args: argparse.Namespace) -> int:
    with _client(args) as c:
        reply = c.remove_node(args.id, timeout=args.timeout)
    print(json.dumps({"removed": args.id, "voters": reply.get("voters"),
                      "learners": reply.get("learners")}))
    return 0


def cmd_transfer_leader(args: argparse.Namespace) -> int:
    with _client(args) as c:
        reply = c.transfer_leader(args.to, timeout=args.timeout)
    print(json.dumps({"leader_id": reply.get("leader_id"),
                      "leader_addr": reply.get("leader_addr")}))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--servers", default=DEFAULT_SERVERS,
                       help=f"any nodes of the cluster (default {DEFAULT_SERVERS})")
        p.add_argument("--timeout", type=float, default=30.0,
                       help="seconds to wait for the change to commit (default 30)")

    p = subparsers.add_parser("add-node", help="add a node (as a learner, promoted to voter "
                                               "once caught up), or re-add a member that "
                                               "lost its disk")
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

    p = subparsers.add_parser("transfer-leader", help="move leadership (to a caught-up voter)")
    p.add_argument("--to", type=int, default=None, help="target node (default: the most "
                                                        "caught-up voter)")
    common(p)
    p.set_defaults(func=cmd_transfer_leader)
