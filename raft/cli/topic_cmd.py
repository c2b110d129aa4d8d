"""`raftlog topic`: create, list, describe, alter and delete topics (issue 26).

    raftlog topic create orders --partitions 8 --replicas 3 [--retention-bytes 10GiB]
                                [--retention-ms 7d] [--max-record-bytes 1MiB]
    raftlog topic list [--json]
    raftlog topic describe orders [--json]   # per partition: leader, replicas, hw, log start
    raftlog topic alter orders --partitions 16 [--retention-ms 3d ...]   # grow only
    raftlog topic delete orders
    raftlog topic move orders --partition 0 --replicas 1,2,4 [--no-wait]
    raftlog topic promote orders   # a mirror topic made writable (raft/cli/link_cmd.py)

Admin commands go to the controller's leader (the client finds it as it finds any leader) and
answer once the change is committed; `create` and `alter` then wait (within --timeout) until
every partition has a leader, so a `produce --topic` right after finds them. A topic that does
not exist is a usage error (exit 2) naming the topics that do; a name that is taken, or a
change the controller refuses (shrinking, more replicas than nodes), exits 1 with its reason.
`move` returns once the controller applied the new replica set, then (unless --no-wait) prints
the partition's configuration as its leader carries the move out, until it is the new set.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from raft.cli.args import json_flag, positive_int, servers_arg
from raft.cli.security import client_options
from raft.cli.status import _render
from raft.client import BlockingClient, TopicInfo
from raft.client.errors import RaftlogError
from raft.node.config import ConfigError
from raft.node.config_values import parse_duration_ms, parse_size

SETTING_FLAGS = (("retention_bytes", "--retention-bytes"), ("retention_ms", "--retention-ms"),
                 ("max_record_bytes", "--max-record-bytes"))


def _size(text: str) -> int:
    try:
        value = parse_size(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


def _duration_ms(text: str) -> int:
    try:
        value = parse_duration_ms(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 ms")
    return value


def _client(args: argparse.Namespace) -> BlockingClient:
    return BlockingClient(args.servers, timeout=args.timeout, **client_options(args))


def _settings(args: argparse.Namespace) -> dict[str, int]:
    return {key: getattr(args, key) for key, _ in SETTING_FLAGS
            if getattr(args, key, None) is not None}


def topic_json(info: TopicInfo) -> dict[str, Any]:
    return {"name": info.name, "partitions": info.partition_count,
            "replicas": max((len(p.replicas) for p in info.partitions), default=0),
            "settings": dict(info.settings)}


def _settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', '-')} {v}" for k, v in sorted(settings.items())) \
        or "cluster defaults"


def cmd_create(args: argparse.Namespace) -> int:
    with _client(args) as c:
        info = c.create_topic(args.name, args.partitions, args.replicas, **_settings(args),
                              timeout=args.timeout)
    if args.json:
        print(json.dumps(topic_json(info)))
    else:
        print(f"created topic {info.name}: {info.partition_count} partition"
              f"{'s' * (info.partition_count != 1)}, {args.replicas} replicas each, every "
              f"partition has a leader ({_settings_text(info.settings)}). Write to it with "
              f"`raftlog produce --topic {info.name}`.")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        topics = c.list_topics()
    if args.json:
        print(json.dumps({"topics": [topic_json(t) for t in topics]}, indent=2,
                         sort_keys=True))
        return 0
    from rich.console import Console

    rows = [[t.name, str(t.partition_count), str(topic_json(t)["replicas"]),
             str(sum(1 for p in t.partitions if p.leader is None)),
             _settings_text(t.settings)] for t in topics]
    _render(Console(), f"topics ({len(topics)})",
            ("topic", "partitions", "replicas", "without leader", "settings"), rows)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with _client(args) as c:
        desc = c.describe_topic(args.name)
    if args.json:
        print(json.dumps(desc, indent=2, sort_keys=True))
        return 0
    from rich.console import Console

    console = Console()
    parts = desc["partitions"]
    print(f"topic {desc['name']}: {len(parts)} partition{'s' * (len(parts) != 1)} "
          f"({_settings_text(desc['settings'])})")
    origin = desc.get("origin")
    if origin:
        print(f"mirror of {origin['source_topic']} on cluster {origin['source_cluster_id']} "
              f"(link {origin['link']}): " + ("read-only while the link writes it; `raftlog "
                                              f"topic promote {desc['name']}` makes it "
                                              "writable" if desc.get("mirror_active") else
                                              "promoted, writable"))
    rows = [[str(p["partition"]),
             "-" if p.get("leader") is None else f"{p['leader']} ({p.get('leader_address')})",
             ",".join(map(str, p["replicas"])),
             str(p.get("high_watermark", "-")) if "error" not in p else "?",
             str(p.get("log_start", "-")) if "error" not in p else "?"] for p in parts]
    _render(console, f"partitions of {desc['name']}",
            ("partition", "leader", "replicas", "high watermark", "log start"), rows)
    for p in parts:
        if "error" in p:
            print(f"partition {p['partition']}: its leader did not answer: {p['error']}",
                  file=sys.stderr)
    return 0


def cmd_alter(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.partitions is None and not settings:
        raise ConfigError("nothing to change: give --partitions N (grow only) and/or "
                          "--retention-bytes, --retention-ms, --max-record-bytes")
    with _client(args) as c:
        before = c.topic(args.name, refresh=True)
        if args.partitions is not None and args.partitions < before.partition_count:
            raise ConfigError(f"topic {args.name} has {before.partition_count} partitions; "
                              f"partitions can only grow (a key's records would move): give "
                              f"--partitions {before.partition_count} or more, or create a "
                              f"new topic")
        info = c.alter_topic(args.name, partitions=args.partitions, **settings,
                             timeout=args.timeout)
    if args.json:
        print(json.dumps(topic_json(info)))
    else:
        grown = info.partition_count - before.partition_count
        print(f"altered topic {info.name}: {info.partition_count} partitions"
              + (f" ({grown} added; keys hash over the new count from now on)" if grown
                 else "") + f", {_settings_text(info.settings)}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _client(args) as c:
        c.delete_topic(args.name, timeout=args.timeout)
    if args.json:
        print(json.dumps({"deleted": args.name}))
    else:
        print(f"deleted topic {args.name}; every node drops its partitions' data")
    return 0


def _node_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected node ids separated by commas (1,2,4), got "
                                         f"{text!r}") from None
    if not ids or any(n < 1 for n in ids):
        raise argparse.ArgumentTypeError(f"expected node ids >= 1 separated by commas, got "
                                         f"{text!r}")
    return ids


MOVE_POLL_S = 0.5


def cmd_move(args: argparse.Namespace) -> int:
    with _client(args) as c:
        reply = c.move_partition(args.name, args.partition, args.replicas, timeout=args.timeout)
        if not args.json:
            print(f"topic {args.name} partition {args.partition}: replicas "
                  f"{reply.get('previous')} -> {args.replicas} (applied by the controller)")
        if args.no_wait:
            if args.json:
                print(json.dumps({"name": args.name, "partition": args.partition,
                                  "replicas": args.replicas, "previous": reply.get("previous"),
                                  "done": False}))
            return 0
        deadline = time.monotonic() + args.timeout
        last = None
        want = sorted(args.replicas)
        while True:
            try:
                seen = c.partition_membership(args.name, args.partition)
            except RaftlogError:
                seen = None  # a leader change: ask again
            shown = None if seen is None else (seen["leader"], seen["voters"],
                                               seen["learners"], seen["move"])
            if shown != last and seen is not None and not args.json:
                print(f"  leader {seen['leader']}: voters {seen['voters']}, learners "
                      f"{seen['learners']}, step {seen['move']}")
            last = shown
            if seen is not None and sorted(seen["voters"] or []) == want \
                    and not seen["learners"]:
                if args.json:
                    print(json.dumps({"name": args.name, "partition": args.partition,
                                      "replicas": args.replicas,
                                      "previous": reply.get("previous"), "done": True}))
                else:
                    print(f"moved: the partition's voters are {want}")
                return 0
            if time.monotonic() >= deadline:
                print(f"the move is under way but not done within {args.timeout:g} s; the "
                      f"partition's leader goes on with it: watch `raftlog status`, or run "
                      f"this again with a longer --timeout", file=sys.stderr)
                return 1
            time.sleep(MOVE_POLL_S)


def _common(p: argparse.ArgumentParser, json_what: str) -> None:
    servers_arg(p, timeout=30.0, timeout_help="seconds to wait for the change to take effect "
                                              "(every partition led)", profile_timeout=False)
    json_flag(p, json_what)


def _settings_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retention-bytes", dest="retention_bytes", type=_size, default=None,
                   metavar="BYTES", help="keep at most this much per partition (e.g. 10GiB); "
                                         "default: the nodes' --retention-bytes")
    p.add_argument("--retention-ms", dest="retention_ms", type=_duration_ms, default=None,
                   metavar="MS", help="keep records this long (ms, or 7d, 12h); default: the "
                                      "nodes' --retention-ms")
    p.add_argument("--max-record-bytes", dest="max_record_bytes", type=_size, default=None,
                   metavar="BYTES", help="refuse larger records (e.g. 1MiB); default: the "
                                         "nodes' limit")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topic", help="create, list, describe, alter, delete or move topics",
                       description="Topics have partitions, each its own Raft group with its "
                                   "own offsets. Commands without --topic use the topic "
                                   "`default` (partition 0).", allow_abbrev=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p),
                               required=True)
    c = actions.add_parser("create", help="create a topic", allow_abbrev=False,
                           description="Create a topic and wait until every partition has a "
                                       "leader. Replicas are placed so every node holds "
                                       "about as many as the others.")
    c.add_argument("name", help="letters, digits, '.', '_' and '-'; at most 249")
    c.add_argument("--partitions", type=positive_int, required=True,
                   help="how many partitions (each its own ordered log)")
    c.add_argument("--replicas", type=positive_int, required=True,
                   help="replicas of each partition (at most the number of nodes; 3 "
                        "survives one failure)")
    _settings_args(c)
    _common(c, 'print the topic as one JSON object {"name", "partitions", "replicas", '
               '"settings"}')
    c.set_defaults(func=cmd_create)

    ls = actions.add_parser("list", help="every topic: partitions, replicas, settings",
                            allow_abbrev=False)
    _common(ls, 'machine-readable output: {"topics": [{"name", "partitions", "replicas", '
                '"settings"}]}')
    ls.set_defaults(func=cmd_list)

    d = actions.add_parser("describe", help="per partition: leader, replicas, high watermark, "
                                            "log start", allow_abbrev=False)
    d.add_argument("name")
    _common(d, 'machine-readable output: {"name", "settings", "partitions": [{"partition", '
               '"leader", "leader_address", "replicas", "high_watermark", "log_start", '
               '"group"}]}')
    d.set_defaults(func=cmd_describe)

    a = actions.add_parser("alter", help="grow a topic's partitions or change its settings",
                           allow_abbrev=False,
                           description="Grow a topic (never shrink: a key's records would "
                                       "move) and/or change its settings. After growing, "
                                       "keys hash over the new partition count.")
    a.add_argument("name")
    a.add_argument("--partitions", type=positive_int, default=None,
                   help="the new partition count (at least the current one)")
    _settings_args(a)
    _common(a, "print the topic as one JSON object")
    a.set_defaults(func=cmd_alter)

    rm = actions.add_parser("delete", help="delete a topic and its data on every node",
                            allow_abbrev=False)
    rm.add_argument("name")
    _common(rm, 'print {"deleted": NAME}')
    rm.set_defaults(func=cmd_delete)

    mv = actions.add_parser("move", help="give a partition another set of replicas",
                            allow_abbrev=False,
                            description="Set a partition's replicas (first = preferred "
                                        "leader; as many as it has). The partition's leader "
                                        "adds each new replica as a learner, promotes it once "
                                        "it caught up, then removes the old ones, one change "
                                        "at a time; the partition keeps serving throughout.")
    mv.add_argument("name")
    mv.add_argument("--partition", type=int, required=True, help="the partition (0, 1, ...)")
    mv.add_argument("--replicas", type=_node_ids, required=True, metavar="IDS",
                    help="node ids separated by commas, e.g. 1,2,4")
    mv.add_argument("--no-wait", dest="no_wait", action="store_true",
                    help="return once the controller applied the new set, without waiting "
                         "for the partition's configuration to follow")
    _common(mv, 'print {"name", "partition", "replicas", "previous", "done"}')
    mv.set_defaults(func=cmd_move)

    from raft.cli.link_cmd import register_promote
    register_promote(actions)  # `topic promote T`: a mirror topic made writable (issue 30)


__all__ = ["register", "topic_json"]
