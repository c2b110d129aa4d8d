"""`raftlog link`: cross-cluster links, run against the sink cluster (issue 30,
docs/REPLICATION.md).

    raftlog link create dr --source 10.0.0.1:7101,10.0.0.2:7101 --topic orders [--topic ...]
                           [--prefix P] [--source-ca ca.pem] [--source-token TOKEN]
    raftlog link create back --source B1:7101 --topic orders --restore   # disaster recovery
    raftlog link list [--json]
    raftlog link describe dr [--json]   # per partition: source hw, mirrored, lag, state, gaps
    raftlog link pause dr | resume dr | delete dr
    raftlog topic promote orders        # failover: the mirror becomes writable (topic_cmd.py)

`create` reads the source's metadata first (its cluster id, each topic's partition count),
refuses a source topic that is itself an active mirror (a loop) and a mirror name taken on
the sink, then asks the sink's controller to record the link and create the mirror topics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import trio

from raft.cli.args import json_flag, positive_float, positive_int, servers_arg
from raft.cli.link_restore import restore
from raft.cli.security import client_options
from raft.cli.status import _render
from raft.client import Client
from raft.client.address_map import split_servers
from raft.client.errors import RaftlogError
from raft.node.config import ConfigError
from raft.protocol.link_requests import (LinkAlter, LinkCreate, LinkList, LinkStatus,
                                         TopicPromote)


def _sink(args: argparse.Namespace) -> Client:
    return Client(args.servers, timeout=args.timeout, **client_options(args))


def _fail(message: str) -> int:
    print(f"raftlog link: {message}", file=sys.stderr)
    return 1


# -- create ------------------------------------------------------------------------------------
async def _create(args: argparse.Namespace) -> int:
    ca_pem = ""
    if args.source_ca:
        try:
            ca_pem = Path(args.source_ca).read_text()
        except OSError as e:
            raise ConfigError(f"--source-ca {args.source_ca}: {e.strerror or e}; give the "
                              f"source cluster's CA certificate (PEM)") from None
    servers, address_map = split_servers(args.source)
    source = Client(servers, timeout=args.timeout, tls_ca=args.source_ca or None,
                    token=args.source_token or None, address_map=address_map)
    async with source, _sink(args) as sink:
        src_meta = await source.cluster_metadata()
        if not src_meta.cluster_id:
            return _fail(f"the source at {args.source} does not report its cluster id (a "
                         f"node of a version without links?); upgrade the source first")
        sink_meta = await sink.cluster_metadata()
        if sink_meta.cluster_id == src_meta.cluster_id:
            return _fail(f"--source {args.source} is this cluster ({src_meta.cluster_id}); a "
                         f"link copies between two clusters: give the other cluster's nodes")
        if args.restore:  # link_restore.py: same names and offsets, then promoted
            return await restore(args, source, sink, src_meta, sink_meta, ca_pem, describe_link)
        mirrors: list[tuple[str, str, int]] = []
        for topic in dict.fromkeys(args.topic):
            info = src_meta.topics.get(topic)
            if info is None:
                return _fail(f"the source has no topic {topic!r} (its topics: "
                             f"{', '.join(sorted(src_meta.topics)) or 'none'})")
            if info.origin is not None and info.mirror_active:
                o = info.origin
                return _fail(f"topic {topic!r} on the source is itself a mirror of "
                             f"{o.get('source_topic')!r} of cluster "
                             f"{o.get('source_cluster_id')} (link {o.get('link')!r}); "
                             f"mirroring it would chain or loop: link to that cluster "
                             f"directly, or promote it there first")
            name = f"{args.prefix}{topic}"
            if name in sink_meta.topics:
                return _fail(f"topic {name!r} exists on this cluster; mirror {topic!r} under "
                             f"another name with --prefix (e.g. --prefix "
                             f"{src_meta.cluster_id[:8]}.), or delete {name!r} first")
            mirrors.append((topic, name, info.partition_count))
        replicas = args.replicas or min(3, max(1, len(sink_meta.nodes)))
        reply = await sink.call(LinkCreate(args.name, list(args.source),
                                           src_meta.cluster_id, mirrors, replicas, ca_pem,
                                           args.source_token or "",
                                           int(args.timeout * 1000)), timeout=args.timeout)
    link = reply["link"]
    if args.json:
        print(json.dumps(link, indent=2, sort_keys=True))
    else:
        shown = ", ".join(f"{s} -> {m} ({n} partitions)" for s, m, n in mirrors)
        print(f"created link {args.name} from cluster {src_meta.cluster_id}: {shown}. The "
              f"mirror topics are read-only here; watch `raftlog link describe {args.name}`, "
              f"fail over with `raftlog topic promote TOPIC`.")
    return 0


# -- list / describe ---------------------------------------------------------------------------
async def _links(sink: Client, args: argparse.Namespace) -> dict[str, Any]:
    """The links as the controller's leader has them: any node answers from the controller
    state it applied, and one still catching up (just restarted) may lack a link; the leader
    may not. Any node's answer when the leader cannot be asked."""
    try:
        meta = await sink.cluster_metadata()
        if meta.controller_address:
            return await sink.call(LinkList(), server=meta.controller_address, leader=False,
                                   timeout=min(args.timeout, 5.0))
    except RaftlogError:
        pass
    return await sink.call(LinkList(), timeout=args.timeout)


async def _list(args: argparse.Namespace) -> int:
    async with _sink(args) as sink:
        reply = await _links(sink, args)
    if args.json:
        print(json.dumps({"links": reply["links"], "mirrors": reply["mirrors"]}, indent=2,
                         sort_keys=True))
        return 0
    from rich.console import Console

    rows = [[ln["name"], ln["state"], ln["source_cluster_id"], ",".join(ln["source_servers"]),
             ", ".join(f"{t['source_topic']}->{t['topic']}" for t in ln["topics"]),
             str(sum(g["bootstraps"] for g in ln["gaps"]))] for ln in reply["links"]]
    _render(Console(), f"links ({len(rows)})",
            ("link", "state", "source cluster", "source", "topics", "bootstraps"), rows)
    return 0


async def _pullers(sink: Client, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every sink node's pullers (each node reports the mirror partitions it leads)."""
    meta = await sink.cluster_metadata()
    found: list[dict[str, Any]] = []

    async def one(address: str) -> None:
        try:
            reply = await sink.call(LinkStatus(), server=address, leader=False,
                                    timeout=min(args.timeout, 5.0))
        except (RaftlogError, OSError):
            return  # a node down: its partitions show "no puller"
        found.extend(reply.get("partitions") or [])

    async with trio.open_nursery() as nursery:
        for address in sorted(set(meta.nodes.values())):
            nursery.start_soon(one, address)
    return found


async def describe_link(sink: Client, name: str, timeout: float) -> dict[str, Any] | None:
    """The link, and one row per mirror partition (what `link describe --json` prints)."""
    args = argparse.Namespace(timeout=timeout)
    reply = await _links(sink, args)
    link = next((ln for ln in reply["links"] if ln["name"] == name), None)
    if link is None:
        return None
    pullers = {(p["topic"], p["partition"]): p for p in await _pullers(sink, args)
               if p["link"] == name}
    gaps = {(g["topic"], g["partition"]): g for g in link["gaps"]}
    mirrors = {m["topic"]: m for m in reply["mirrors"] if m["link"] == name}
    rows = []
    for t in link["topics"]:
        m = mirrors.get(t["topic"])
        for partition in range(m["partitions"] if m else 0):
            p = pullers.get((t["topic"], partition), {})
            g = gaps.get((t["topic"], partition), {})
            state = p.get("state") or ("promoted" if m and not m["mirror_active"] else
                                       "paused" if link["state"] == "paused" else "no puller")
            rows.append({"topic": t["topic"], "source_topic": t["source_topic"],
                         "partition": partition, "state": state,
                         "source_high_watermark": p.get("source_high_watermark"),
                         "mirrored_offset": p.get("mirrored_offset"),
                         "lag_records": p.get("lag_records"), "lag_bytes": p.get("lag_bytes"),
                         "lag_seconds": p.get("lag_seconds"),
                         "bootstraps": g.get("bootstraps", 0),
                         "offsets_lost": g.get("offsets_lost", 0), "gaps": g.get("latest", []),
                         "message": p.get("message", "")})
    return {**link, "partitions": rows}


async def _describe(args: argparse.Namespace) -> int:
    async with _sink(args) as sink:
        desc = await describe_link(sink, args.name, args.timeout)
    if desc is None:
        return _fail(f"no link named {args.name!r}; `raftlog link list` shows them")
    if args.json:
        print(json.dumps(desc, indent=2, sort_keys=True))
        return 0
    from rich.console import Console

    def s(v: Any) -> str:
        return "-" if v is None else str(v)

    rows = [[r["topic"], str(r["partition"]), r["state"], s(r["source_high_watermark"]),
             s(r["mirrored_offset"]), s(r["lag_records"]), s(r["lag_bytes"]),
             s(r["lag_seconds"]), f"{r['bootstraps']} ({r['offsets_lost']} offsets)"]
            for r in desc["partitions"]]
    _render(Console(), f"link {desc['name']} ({desc['state']}) from cluster "
                       f"{desc['source_cluster_id']}",
            ("topic", "partition", "state", "source hw", "mirrored", "lag records",
             "lag bytes", "lag s", "bootstraps"), rows)
    for r in desc["partitions"]:  # what a stopped partition says to do (source_behind, ...)
        if r["message"] and r["state"] not in ("mirroring", "caught_up"):
            print(f"{r['topic']}[{r['partition']}] {r['state']}: {r['message']}")
    return 0


async def _alter(args: argparse.Namespace) -> int:
    async with _sink(args) as sink:
        await sink.call(LinkAlter(args.name, args.action, int(args.timeout * 1000)),
                        timeout=args.timeout)
    done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[args.action]
    if args.json:
        print(json.dumps({"link": args.name, "done": done}))
    else:
        after = (" Its mirror topics stay read-only: promote them with `raftlog topic "
                 "promote TOPIC`, or delete them." if args.action == "delete" else "")
        print(f"{done} link {args.name}.{after}")
    return 0


async def _promote(args: argparse.Namespace) -> int:
    async with _sink(args) as sink:
        await sink.call(TopicPromote(args.name, int(args.timeout * 1000)), timeout=args.timeout)
    if args.json:
        print(json.dumps({"topic": args.name, "promoted": True}))
    else:
        print(f"promoted {args.name}: its link no longer writes it and it takes produces, its "
              f"offsets continuing from the mirrored ones.")
    return 0


def _run(fn: Any) -> Any:
    return lambda args: trio.run(fn, args)


def _servers_list(text: str) -> list[str]:
    out = [s.strip() for s in text.split(",") if s.strip()]
    try:
        split_servers(out)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(f"{e}; give the source's nodes as HOST:PORT,... "
                                         f"(ADVERTISED=HOST:PORT to dial another address "
                                         f"than the one a node advertises)") from None
    return out


def _common(p: argparse.ArgumentParser, what: str) -> None:
    servers_arg(p, timeout=30.0, timeout_help="seconds to wait for the change",
                profile_timeout=False)
    json_flag(p, what)


def register_promote(actions: argparse._SubParsersAction) -> None:
    """`raftlog topic promote T` (registered by topic_cmd)."""
    p = actions.add_parser("promote", help="make a mirror topic writable (failover)",
                           allow_abbrev=False,
                           description="Stop the link writing this mirror topic, for good, "
                                       "and take produces on it; its offsets continue from "
                                       "the mirrored ones. To mirror it back later, create a "
                                       "link in the other direction (docs/REPLICATION.md).")
    p.add_argument("name")
    _common(p, 'print {"topic", "promoted"}')
    p.set_defaults(func=_run(_promote))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("link", help="mirror topics from another cluster (cross-cluster links)",
                       description="Links are pulled by this (the sink) cluster: each mirror "
                                   "partition's leader fetches from the source and appends "
                                   "at the same offsets. docs/REPLICATION.md.",
                       allow_abbrev=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p),
                               required=True)
    c = actions.add_parser("create", help="create a link and its mirror topics",
                           allow_abbrev=False)
    c.add_argument("name", help="letters, digits, '_' and '-'")
    c.add_argument("--source", type=_servers_list, required=True, metavar="HOST:PORT,...",
                   help="nodes of the source cluster; ADVERTISED=HOST:PORT dials HOST:PORT "
                        "whenever the source names ADVERTISED (NAT, proxies)")
    c.add_argument("--topic", action="append", required=True,
                   help="a source topic to mirror (repeatable)")
    c.add_argument("--prefix", default="", help="mirror topic names are PREFIX + the source's "
                                               "(default none; two-way setups use "
                                               "'<source-cluster-id>.')")
    c.add_argument("--source-ca", dest="source_ca", default=None, metavar="FILE",
                   help="the source cluster's CA certificate (PEM): the link speaks TLS")
    c.add_argument("--source-token", dest="source_token", default=None, metavar="TOKEN",
                   help="a token of the source cluster allowed to read the topics")
    c.add_argument("--replicas", type=positive_int, default=None,
                   help="replicas of each mirror partition (default: 3, or fewer nodes)")
    c.add_argument("--restore", action="store_true",
                   help="disaster recovery: recreate the topics this cluster lost from the "
                        "source's copy under their own names, offsets and subscriptions "
                        "with them, then promote them and delete the link "
                        "(docs/REPLICATION.md, DR runbook)")
    c.add_argument("--no-wait", dest="no_wait", action="store_true",
                   help="with --restore: create the link and return (promote by hand)")
    c.add_argument("--restore-timeout", dest="restore_timeout", type=positive_float,
                   default=3600.0, help="with --restore: seconds to wait for the copy "
                                        "(default 3600)")
    _common(c, "print the link as JSON")
    c.set_defaults(func=_run(_create))

    ls = actions.add_parser("list", help="the links of this cluster", allow_abbrev=False)
    _common(ls, 'print {"links": [...], "mirrors": [...]}')
    ls.set_defaults(func=_run(_list))

    d = actions.add_parser("describe", help="per mirror partition: source high watermark, "
                                            "mirrored offset, lag, state, bootstraps",
                           allow_abbrev=False)
    d.add_argument("name")
    _common(d, "print the link and its partitions as JSON")
    d.set_defaults(func=_run(_describe))

    for action, text in (("pause", "stop pulling (mirrors stay read-only)"),
                         ("resume", "pull again"),
                         ("delete", "delete the link (its mirror topics stay, read-only)")):
        a = actions.add_parser(action, help=text, allow_abbrev=False)
        a.add_argument("name")
        _common(a, 'print {"link", "done"}')
        a.set_defaults(func=_run(_alter))


__all__ = ["describe_link", "register", "register_promote"]
