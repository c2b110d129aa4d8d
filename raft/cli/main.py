"""`raftlog`: the command line that people, scripts and the tests use.

    raftlog serve --node-id 1 --data-dir ./data --peers 1=127.0.0.1:7101,2=...,3=...
    raftlog up [--nodes 3] [--data-dir ./data] [--base-port 7101]
    raftlog produce --servers H:P,... [--acks quorum|leader|none] [--json]   < lines
    raftlog consume --servers H:P,... [--offset N] [--count N] [--follow] [--json]
    raftlog consume --subscription NAME [--from-start|--from-end|--from N] [--count N]
    raftlog subscriptions [--json] | reset NAME --to OFFSET|start|end | delete NAME
    raftlog status --servers H:P,... [--json]
    raftlog demo                    (what `make run` runs)
    raftlog add-node | remove-node | transfer-leader   (membership, raft/cli/membership.py)

Each command group is its own module in this package with a `register(subparsers)`: serve.py
(serve, up), produce.py, consume.py, subscriptions.py, status.py, demo.py, membership.py.
Other packages add their commands the same way, as plugins that may be missing: bench.cli
(`raftlog bench`) and sparkio.cli (`raftlog load`).
Exit codes: 0 success, 1 the operation failed, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from raft.cli import consume, demo, membership, produce, serve, status, subscriptions
from raft.client import RaftlogError
from raft.node.config import ConfigError

# Optional packages whose commands join `raftlog` when they (and their extras) are installed.
PLUGINS = ("bench.cli", "sparkio.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftlog", description="A Raft-replicated log of record batches.",
        epilog="Start with `raftlog demo`, or `raftlog up` and then produce/consume/status.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug); quiet by default")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (serve, produce, consume, subscriptions, status, demo):
        module.register(sub)
    for name in PLUGINS:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            if e.name and (e.name == name or name.startswith(e.name)):
                continue  # that package (or its extra) is not installed
            raise
        register = getattr(mod, "register", None)
        if register is not None:
            register(sub)
    # Last, after the plugins' commands: the order `raftlog --help` has always shown.
    membership.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except ConfigError as e:
        print(f"raftlog {args.command}: {e}", file=sys.stderr)
        return 2
    except RaftlogError as e:
        print(f"raftlog {args.command}: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
