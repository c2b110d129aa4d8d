"""`raftlog subscriptions`: list, reset and delete subscriptions; and `raftlog consume
--subscription NAME`, which reads from a subscription and commits as it prints.

    raftlog subscriptions [--json] [--prefix P]
    raftlog subscriptions reset NAME --to OFFSET|start|end
    raftlog subscriptions delete NAME
    raftlog consume --subscription NAME [--from-start | --from-end | --from OFFSET] [--count N]

`consume --subscription` resumes where the last run of the same subscription stopped: a record
counts as done once its line is printed and flushed, and what is done is committed every
`--commit-ms` and at exit. The first run creates the subscription at the log start (or
`--from-end` / `--from OFFSET`); later runs ignore those flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import trio

from raft.cli.args import json_flag, positive_int, servers_arg
from raft.cli.output import Undecodable
from raft.cli.security import client_options
from raft.client import BlockingClient, Client, Consumer, FetchedRecord
from raft.node.config import ConfigError


# -- consume --subscription (the hook raft/cli/consume.py calls) -------------------------------------
def add_consume_arguments(p: argparse.ArgumentParser) -> None:
    """The subscription flags of `raftlog consume`."""
    p.add_argument("--subscription", metavar="NAME", default=None,
                   help="read from this subscription's committed position and commit as "
                        "lines are printed; the next run resumes there")
    first = p.add_mutually_exclusive_group()
    first.add_argument("--from-start", dest="sub_start", action="store_const", const="start",
                       help="with --subscription, on first use: begin at the log start "
                            "(the default)")
    first.add_argument("--from-end", dest="sub_start", action="store_const", const="end",
                       help="with --subscription, on first use: begin after the last record")
    p.add_argument("--commit-ms", type=positive_int, default=500, metavar="MS",
                   help="with --subscription, commit what was printed this often "
                        "(default 500) and at exit")
    p.add_argument("--exclusive", action="store_true",
                   help="with --subscription: take the single-consumer lease (another "
                        "exclusive consumer of the same name is refused while this runs)")


def consume_subscription(args: argparse.Namespace,
                         print_record: Callable[[FetchedRecord, bool], None]) -> int:
    """`raftlog consume --subscription NAME`: print from the committed position, commit as
    lines are flushed. `--from OFFSET|start|end` picks the first-use position like
    --from-start/--from-end."""
    start: Any = args.sub_start or "start"
    frm = args.from_offset
    if frm is not None:
        if args.sub_start:
            raise ConfigError("give one of --from, --from-start, --from-end")
        if isinstance(frm, int) and frm < 0:
            raise ConfigError(f"--from {frm} (the last N records) does not combine with "
                              f"--subscription; use --from start, end or an offset (the "
                              f"position on first use)")
        start = frm
    if args.to is not None or args.node is not None or args.since is not None:
        raise ConfigError("--to, --node and --since do not combine with --subscription (a "
                          "subscription reads in order from its position; use --count)")

    bad = Undecodable(as_json=args.json)  # on stderr, read on past it; exit status 1

    async def run() -> int:
        printed = 0
        async with Client(args.servers, timeout=args.timeout, **client_options(args)) as client:
            async with Consumer(client, args.subscription, auto_commit_ms=args.commit_ms,
                                start=start, exclusive=args.exclusive,
                                max_bytes=args.max_bytes, follow=args.follow,
                                max_wait=args.max_wait,
                                on_undecodable=bad.report) as consumer:
                async for record in consumer:
                    print_record(record, args.json)
                    sys.stdout.flush()  # done once flushed: the next step may commit it
                    printed += 1
                    if args.count is not None and printed >= args.count:
                        break
        return bad.status

    try:
        return trio.run(run)
    except KeyboardInterrupt:
        return bad.status


# -- raftlog subscriptions ------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    with BlockingClient(args.servers, timeout=args.timeout, **client_options(args)) as client:
        subs = client.subscriptions(args.prefix)
    if args.json:
        print(json.dumps({"subscriptions": subs}, indent=2, sort_keys=True))
        return 0
    render(subs)
    return 0


def render(subs: list[dict[str, Any]], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"subscriptions ({len(subs)})")
    for col in ("name", "position", "lag (records)", "lag (bytes)", "last commit",
                "last committer", "lease holder"):
        table.add_column(col, justify="right" if col.startswith(("position", "lag")) else "left")
    for s in subs:
        lag = f"{s['lag_records']:,}" + ("" if s.get("lag_exact", True) else " ~")
        table.add_row(s["name"], str(s["position"]), lag, f"{s['lag_bytes']:,}",
                      _age(s.get("last_commit_age_ms")), s.get("last_committer") or "-",
                      s.get("lease_holder") or "-")
    console.print(table)


def _age(ms: int | None) -> str:
    if ms is None:
        return "never"
    if ms < 1000:
        return f"{ms} ms ago"
    secs = ms / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if secs >= size:
            return f"{secs / size:.1f} {unit} ago"
    return f"{secs:.1f} s ago"


def _position(text: str) -> int | str:
    if text in ("start", "end"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset, 'start' or 'end'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"offset {value} must be >= 0")
    return value


def cmd_reset(args: argparse.Namespace) -> int:
    with BlockingClient(args.servers, timeout=args.timeout, **client_options(args)) as client:
        sub = client.subscription_reset(args.name, args.to)
    print(f"subscription {sub['name']} reset to position {sub['position']}", file=sys.stderr)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with BlockingClient(args.servers, timeout=args.timeout, **client_options(args)) as client:
        client.subscription_delete(args.name)
    print(f"subscription {args.name} deleted", file=sys.stderr)
    return 0


def _servers_again(p: argparse.ArgumentParser) -> None:
    """--servers, --timeout and the security flags after the action too, without their defaults
    overriding values given before it (`raftlog subscriptions --servers X reset ...`)."""
    before = set(map(id, p._actions))
    servers_arg(p)
    for action in p._actions:
        if id(action) not in before:
            action.default = argparse.SUPPRESS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("subscriptions", help="list, reset or delete subscriptions (named "
                                             "consumer positions kept by the cluster)",
                       description="Subscriptions are named consumer positions kept by the "
                                   "cluster, replicated with the log (docs/SUBSCRIPTIONS.md). "
                                   "Without an action: list them with their lag.")
    servers_arg(p)
    json_flag(p, "machine-readable output: {\"subscriptions\": [...]}")
    p.add_argument("--prefix", default="", help="only names starting with this")
    p.set_defaults(func=cmd_list)
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    r = actions.add_parser("reset", help="move a subscription to an offset (back or forward); "
                                         "creates it if missing")
    _servers_again(r)
    r.add_argument("name")
    r.add_argument("--to", required=True, type=_position, metavar="OFFSET|start|end",
                   help="the next offset to deliver")
    r.set_defaults(func=cmd_reset)
    d = actions.add_parser("delete", help="forget a subscription")
    _servers_again(d)
    d.add_argument("name")
    d.set_defaults(func=cmd_delete)


__all__ = ["add_consume_arguments", "consume_subscription", "register", "render"]
