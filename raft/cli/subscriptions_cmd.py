"""`raftlog subscriptions`: list, reset and delete subscriptions; and `raftlog consume
--subscription NAME`, which reads from a subscription and commits as it prints.

    raftlog subscriptions [list] [--json] [--prefix P] [--topic T [--partition P]]
    raftlog subscriptions reset NAME --to OFFSET|start|end
    raftlog subscriptions delete NAME
    (each with --topic T --partition P for a subscription of a topic partition)
    raftlog consume --subscription NAME [--from-start | --from-end | --from OFFSET] [--count N]
                    [--auto-reset earliest|latest|none]
    raftlog consume --topic T --subscription NAME [--member M]   # one member of many

`consume --topic T --subscription NAME` without --partition is one member of a subscription
over every partition of T (raft/client/topic_subscription.py): it reads the partitions leased
to it, each in order, commits each, and shares the topic with the other members running the
same command (`--member` names it; default host:pid:random). Without --follow it reads what
its partitions hold, commits, releases them and leaves. `raftlog subscriptions --topic T` lists
every partition's row: position, lag, holder and members.

`consume --subscription` resumes where the last run of the same subscription stopped: a record
counts as done once its line is printed and flushed, and what is done is committed every
`--commit-ms` and at exit. The first run creates the subscription at the log start (or
`--from-end` / `--from OFFSET`); on a subscription that exists those flags are refused (exit 2,
naming `raftlog subscriptions reset`, which moves it).

When retention has removed records the subscription had not read, its reset policy decides:
`none` (the default) stops with an error naming the commands that move it on; `--auto-reset
earliest` (or `latest`) resets it to the log start (or end), says on stderr how many offsets it
skipped, and reads on. `--auto-reset` is stored as the subscription's policy, so later runs
without it do the same. The skipped count is kept in the cluster's table: `raftlog
subscriptions` shows it (the `skipped` column, `skipped_offsets` in --json).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import trio

from raft.cli.args import json_flag, non_negative_int, positive_int, servers_arg
from raft.cli.output import Undecodable
from raft.cli.security import client_options
from raft.client import (BlockingClient, Client, Consumer, FetchedRecord, TopicSubscription,
                         UnknownSubscription)
from raft.node.config import ConfigError

COMMIT_MS = 500  # consume --subscription's commit interval unless --commit-ms says otherwise

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
    p.add_argument("--commit-ms", type=positive_int, default=None, metavar="MS",
                   help=f"with --subscription, commit what was printed this often "
                        f"(default {COMMIT_MS}) and at exit")
    p.add_argument("--auto-reset", dest="auto_reset", choices=("earliest", "latest", "none"),
                   default=None,
                   help="with --subscription: what to do when retention removed records it "
                        "had not read: reset to the log start (earliest) or end (latest) and "
                        "read on, or stop with an error (none); stored as the subscription's "
                        "policy (default: the stored one, else none)")
    p.add_argument("--exclusive", action="store_true",
                   help="with --subscription: take the single-consumer lease (another "
                        "exclusive consumer of the same name is refused while this runs)")
    p.add_argument("--member", metavar="ID", default=None,
                   help="with --topic T --subscription NAME (no --partition): this member's "
                        "id among the consumers sharing T's partitions (default "
                        "host:pid:random)")


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

    if args.topic is not None and args.partition is None:
        return _consume_topic(args, start, print_record)
    if args.member is not None:
        raise ConfigError("--member names a member of a subscription over a whole topic: add "
                          "--topic T (without --partition), or drop --member")
    bad = Undecodable(as_json=args.json)  # on stderr, read on past it; exit status 1
    first_use_flag = _first_use_flag(args)

    async def run() -> int:
        printed = 0
        async with Client(args.servers, timeout=args.timeout, **client_options(args)) as client:
            where = await _partition_of(client, args)
            if first_use_flag is not None:
                await _refuse_first_use_flag(client, args.subscription, first_use_flag, where)
            async with Consumer(client, args.subscription, **where,
                                auto_commit_ms=args.commit_ms or COMMIT_MS,
                                start=start, exclusive=args.exclusive,
                                max_bytes=args.max_bytes, follow=args.follow,
                                max_wait=args.max_wait,
                                on_undecodable=bad.report,
                                auto_reset=args.auto_reset,
                                on_reset=_report_reset) as consumer:
                async for record in consumer:
                    print_record(record, args.json)
                    sys.stdout.flush()  # done once flushed: the next step may commit it
                    printed += 1
                    if args.count is not None and printed >= args.count:
                        break
        return bad.status

    return trio.run(run)  # Ctrl-C: main() exits 130 (what was printed is committed first)


async def _partition_of(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """The topic partition whose log keeps the subscription (--topic, --partition)."""
    return {"topic": getattr(args, "topic", None),
            "partition": getattr(args, "partition", None) or 0}


def _consume_topic(args: argparse.Namespace, start: Any,
                   print_record: Callable[[FetchedRecord, bool], None]) -> int:
    """`consume --topic T --subscription NAME`: one member of the subscription over T's
    partitions; prints the records of the partitions leased to it, commits each partition."""
    if args.exclusive:
        raise ConfigError("members of a subscription over a topic always hold leases on the "
                          "partitions they read; drop --exclusive (or add --partition P for "
                          "one partition's single-consumer lease)")
    if args.from_offset is not None or args.sub_start is not None:
        raise ConfigError("--from/--from-start/--from-end place a single partition's new "
                          "subscription; a topic subscription starts every new partition at "
                          "the log start: move one with `raftlog subscriptions reset NAME "
                          "--topic T --partition P --to ...`")
    bad = Undecodable(as_json=args.json)

    async def run() -> int:
        printed = 0
        async with Client(args.servers, timeout=args.timeout, **client_options(args)) as client:
            async with TopicSubscription(client, args.topic, args.subscription,
                                         member_id=args.member, start=start,
                                         auto_commit_ms=args.commit_ms or COMMIT_MS,
                                         max_bytes=args.max_bytes, follow=args.follow,
                                         max_wait=args.max_wait, on_undecodable=bad.report,
                                         auto_reset=args.auto_reset,
                                         on_reset=_report_reset) as member:
                async for record in member:
                    print_record(record, args.json)
                    sys.stdout.flush()  # done once flushed: the next step may commit it
                    printed += 1
                    if args.count is not None and printed >= args.count:
                        break
        return bad.status

    return trio.run(run)


def _report_reset(reset: dict[str, Any]) -> None:
    """Say on stderr that records were skipped (stdout stays the records)."""
    print(f"subscription {reset['name']}: retention removed the log below offset "
          f"{reset['start_offset']} before position {reset['from']} was read; reset to "
          f"{reset['to']} (--auto-reset {reset['policy']}), skipping "
          f"{reset['skipped_offsets']:,} offsets (`raftlog subscriptions` shows the total)",
          file=sys.stderr, flush=True)


def _first_use_flag(args: argparse.Namespace) -> str | None:
    """The flag (as typed) that picks the position on first use, if one was given."""
    if args.from_offset is not None:
        return f"--from {args.from_offset}"
    if args.sub_start is not None:
        return f"--from-{args.sub_start}"
    return None


async def _refuse_first_use_flag(client: Client, name: str, flag: str,
                                 where: dict[str, Any]) -> None:
    """--from and --from-start/-end set where a new subscription begins; on an existing one
    they would be silently ignored, so they are refused with the command that moves it."""
    try:
        sub = await client.subscription(name, **where)
    except UnknownSubscription:
        return
    to = flag.split()[-1] if flag.startswith("--from ") else flag.removeprefix("--from-")
    raise ConfigError(f"{flag} sets where a new subscription begins, and subscription {name} "
                      f"exists (position {sub['position']}); to move it run `raftlog "
                      f"subscriptions reset {name} --to {to}`, or drop {flag} to resume "
                      f"where it is")


# -- raftlog subscriptions ------------------------------------------------------------------------
def _where(args: argparse.Namespace) -> dict[str, Any]:
    """--topic/--partition of the subscriptions commands: whose log keeps them."""
    return {"topic": getattr(args, "topic", None), "partition": getattr(args, "partition", 0)
            or 0}


def cmd_list(args: argparse.Namespace) -> int:
    """One partition's table, or with --topic and no --partition every partition's (each row
    with its `partition`: a subscription over a topic has one per partition)."""
    with BlockingClient(args.servers, timeout=args.timeout, **client_options(args)) as client:
        topic = getattr(args, "topic", None)
        if topic is not None and getattr(args, "partition", None) is None:
            count = client.topic(topic).partition_count
            subs = [{**sub, "partition": p} for p in range(count)
                    for sub in client.subscriptions(args.prefix, topic=topic, partition=p)]
            subs.sort(key=lambda sub: (sub["name"], sub["partition"]))
        else:
            subs = client.subscriptions(args.prefix, **_where(args))
    if args.json:
        print(json.dumps({"subscriptions": subs}, indent=2, sort_keys=True))
        return 0
    render(subs)
    return 0


def render(subs: list[dict[str, Any]], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    partitioned = any("partition" in s for s in subs)
    table = Table(title=f"subscriptions ({len(subs)})")
    for col in ("name", *(("partition",) if partitioned else ()), "position", "lag (records)",
                "lag (bytes)", "skipped", "auto-reset", "last commit", "last committer",
                "lease holder", *(("members",) if partitioned else ())):
        table.add_column(col, justify="right" if col.startswith(
            ("partition", "position", "lag", "skipped")) else "left")
    for s in subs:
        lag = f"{s['lag_records']:,}" + ("" if s.get("lag_exact", True) else " ~")
        row = [s["name"], str(s["position"]), lag, f"{s['lag_bytes']:,}",
               f"{s.get('skipped_offsets', 0):,}", s.get("auto_reset") or "none",
               _age(s.get("last_commit_age_ms")), s.get("last_committer") or "-",
               s.get("lease_holder") or "-"]
        if partitioned:
            row.insert(1, str(s["partition"]))
            row.append(", ".join(s.get("members") or ()) or "-")
        table.add_row(*row)
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
        sub = client.subscription_reset(args.name, args.to, **_where(args))
    if args.json:
        print(json.dumps({"name": sub["name"], "position": sub["position"]}))
    else:
        print(f"subscription {sub['name']} reset to position {sub['position']}",
              file=sys.stderr)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with BlockingClient(args.servers, timeout=args.timeout, **client_options(args)) as client:
        client.subscription_delete(args.name, **_where(args))
    if args.json:
        print(json.dumps({"deleted": args.name}))
    else:
        print(f"subscription {args.name} deleted", file=sys.stderr)
    return 0


def _servers_again(p: argparse.ArgumentParser, json_what: str) -> None:
    """--servers, --timeout, --json and the security flags after the action too, without
    their defaults overriding values given before it (`raftlog subscriptions --servers X
    reset ...`, `raftlog subscriptions delete x --json`)."""
    before = set(map(id, p._actions))
    servers_arg(p)
    json_flag(p, json_what)
    _partition_args(p)
    for action in p._actions:
        if id(action) not in before:
            action.default = argparse.SUPPRESS


def _partition_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", default=None, metavar="TOPIC",
                   help="subscriptions kept in this topic's partition (default: the topic "
                        "`default`)")
    p.add_argument("--partition", type=non_negative_int, default=None, metavar="P",
                   help="the partition of --topic (listing: default every partition; "
                        "reset/delete: default 0)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("subscriptions", help="list, reset or delete subscriptions (named "
                                             "consumer positions kept by the cluster)",
                       description="Subscriptions are named consumer positions kept by the "
                                   "cluster, replicated with the log (docs/SUBSCRIPTIONS.md). "
                                   "Without an action: list them with their lag.",
                       # argparse classifies every word with this parser's flags first:
                       # `reset --to` would be an ambiguous abbreviation of --token and
                       # --token-file here before `reset` ever saw its own --to.
                       allow_abbrev=False)
    servers_arg(p)
    json_flag(p, "machine-readable output (before or after the action): "
                 "{\"subscriptions\": [...]} when listing")
    p.add_argument("--prefix", default="", help="only names starting with this")
    _partition_args(p)
    p.set_defaults(func=cmd_list)
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    ls = actions.add_parser("list", help="list subscriptions with position, lag and holder "
                                         "(the default action); --topic T: every partition")
    _servers_again(ls, "machine-readable output: {\"subscriptions\": [...]}")
    ls.add_argument("--prefix", default=argparse.SUPPRESS, help="only names starting with this")
    ls.set_defaults(func=cmd_list)
    r = actions.add_parser("reset", help="move a subscription to an offset (back or forward); "
                                         "creates it if missing")
    _servers_again(r, 'print {"name": ..., "position": ...} on stdout')
    r.add_argument("name")
    r.add_argument("--to", required=True, type=_position, metavar="OFFSET|start|end",
                   help="the next offset to deliver")
    r.set_defaults(func=cmd_reset)
    d = actions.add_parser("delete", help="forget a subscription")
    _servers_again(d, 'print {"deleted": NAME} on stdout')
    d.add_argument("name")
    d.set_defaults(func=cmd_delete)


__all__ = ["add_consume_arguments", "consume_subscription", "register", "render"]
