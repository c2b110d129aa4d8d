"""`raftlog status`: every node's role, term and offsets, and the leader's view of its
followers, as tables or as JSON. `render_status` is also what `raftlog demo` prints at the end.

Nothing is cut off: when a table is wider than the terminal, each node is printed as a short
block of `name value` pairs instead (a terminal wraps those; it would have truncated table
cells). Nodes that do not answer are listed under the table with the reason, and when none
answers the command fails with one error. Nodes are asked at the same time, so one that is down
costs one --timeout at most (none when its port refuses connections).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from raft.cli.args import json_flag, servers_arg
from raft.cli.security import client_options
from raft.client import BlockingClient, RaftlogError, UnavailableError

NODE_COLUMNS = ("node", "address", "role", "term", "leader", "dirty", "flushed", "commit",
                "high watermark", "lag")
FOLLOWER_COLUMNS = ("node", "match", "next", "dirty", "flushed", "in flight", "recovering",
                    "bytes behind", "catch-up", "learner", "last heard (ticks)")
PARTITION_COLUMNS = ("node", "partitions", "leading", "following", "without leader", "topics",
                     "controller")
SHARD_COLUMNS = ("node", "shard", "address", "partitions", "leading", "groups", "cpu",
                 "memory", "loop lag max")
STORAGE_COLUMNS = ("node", "log start", "retained", "retention held by", "deleted",
                   "scrub passes", "scrub found", "subscriptions")


def cmd_status(args: argparse.Namespace) -> int:
    with BlockingClient(args.servers, timeout=args.timeout, **client_options(args)) as client:
        statuses = client.cluster_status(timeout=args.timeout)
    if all("error" in st for st in statuses.values()):
        message = (f"no node answered `status` at {', '.join(statuses)}: "
                   + "; ".join(f"{a}: {st['error']}" for a, st in statuses.items()))
        codes = {st.get("code") for st in statuses.values()} - {"UNAVAILABLE"}
        if len(codes) == 1 and None not in codes:
            # Every node that answered refused alike (a wrong token, say): that code and its
            # advice, not UNAVAILABLE's "start a cluster", even when some nodes are down too.
            raise RaftlogError(message, code=codes.pop())
        raise UnavailableError(message)
    if args.json:
        print(json.dumps(status_json(statuses), indent=2, sort_keys=True))
    else:
        render_status(statuses)
    return 0


def status_json(statuses: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`status --json`: {"nodes": [{node_id, address, role, term, leader_id, dirty_offset,
    flushed_offset, commit_index, high_watermark, lag, ..., followers (leader only)}]}; a
    node that did not answer is {"address", "node_id" (when a peer names it), "error",
    "code"}."""
    nodes = []
    ids = _ids_by_address(statuses)
    top = _top(statuses)
    for addr, st in sorted(statuses.items(), key=lambda kv: ids.get(kv[0], 1 << 30)):
        entry = {"address": addr, **st}
        if "error" in st:
            if addr in ids:
                entry["node_id"] = ids[addr]
        else:
            entry["lag"] = top - st.get("dirty_offset", -1)
            if st.get("partitions") is not None:
                entry["partition_summary"] = partition_summary(st)
        nodes.append(entry)
    return {"nodes": nodes}


def _top(statuses: dict[str, dict[str, Any]]) -> int:
    return max((st.get("dirty_offset", -1) for st in statuses.values() if "error" not in st),
               default=-1)


def _ids_by_address(statuses: dict[str, dict[str, Any]]) -> dict[str, int]:
    """address -> node id, from the nodes' own answers and their peer lists."""
    ids: dict[str, int] = {}
    for st in statuses.values():
        for k, a in (st.get("peers") or {}).items():
            ids.setdefault(a, int(k))
    for addr, st in statuses.items():
        if "node_id" in st:
            ids[addr] = st["node_id"]
    return ids


def node_rows(statuses: dict[str, dict[str, Any]]) -> list[list[str]]:
    top = _top(statuses)
    ids = _ids_by_address(statuses)
    rows = []
    for addr, st in sorted(statuses.items(), key=lambda kv: ids.get(kv[0], 1 << 30)):
        if "error" in st:
            continue
        role = st["role"]
        if st.get("standing", "member") != "member":  # e.g. "rejoining: lost its disk"
            role += f" ({st['standing']})"
        if st.get("not_member"):  # its peers refuse it: raft/node/identity.py
            role += " (not a member: add it with raftlog add-node)"
        if st.get("damaged"):  # docs/DISK-LOSS.md: not served, being fetched again
            role += " (damaged: " + ", ".join(f"{a}..{b}" for a, b in st["damaged"]) + ")"
        if st.get("damage_waiting_for"):  # no known good copy yet: who may still hold one
            role += " (waiting for voters " + ", ".join(
                str(v) for v in st["damage_waiting_for"]) + ")"
        rows.append([str(st["node_id"]), addr, role, str(st["term"]),
                     str(st.get("leader_id")), str(st["dirty_offset"]),
                     str(st["flushed_offset"]), str(st["commit_index"]),
                     str(st["high_watermark"]), str(top - st["dirty_offset"])])
    return rows


def identity_lines(statuses: dict[str, dict[str, Any]],
                   ids: dict[str, int]) -> list[tuple[str, bool]]:
    """The cluster id (or the nodes' disagreement) and every refused peer connection, as
    (line, is a problem)."""
    answered = {addr: st for addr, st in statuses.items() if "error" not in st}
    known = {st.get("cluster_id") for st in answered.values()} - {None}
    lines: list[tuple[str, bool]] = []
    if len(known) == 1:
        lines.append((f"cluster id: {known.pop()}", False))
    elif known:
        lines.append(("nodes hold data of different clusters: " + ", ".join(
            f"node {ids.get(a, a)}: {st.get('cluster_id') or 'none'}"
            for a, st in sorted(answered.items(), key=lambda kv: ids.get(kv[0], 1 << 30))),
            True))
    for addr, st in sorted(answered.items(), key=lambda kv: ids.get(kv[0], 1 << 30)):
        for peer, why in sorted((st.get("refused_peers") or {}).items()):
            lines.append((f"node {st.get('node_id')} and node {peer} refuse each other: {why}",
                          True))
    return lines


def partition_summary(st: dict[str, Any]) -> dict[str, Any]:
    """One node's partitions (issue 26: a line per partition replica it runs) summed up:
    how many it holds, leads, follows, how many have no leader it knows, and of which topics.
    A node of K shards: shard 0's own lines and those of its other shards (`shard_partitions`,
    docs/SHARDS.md)."""
    lines = [*(st.get("partitions") or []), *(st.get("shard_partitions") or [])]
    return {"replicas": len(lines),
            "leading": sum(1 for p in lines if p.get("role") == "leader"),
            "following": sum(1 for p in lines if p.get("role") == "follower"),
            "without_leader": sum(1 for p in lines if p.get("leader") is None),
            "topics": sorted({p["topic"] for p in lines if p.get("topic") is not None})}


def partition_rows(statuses: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Per node: its partitions summed up (only nodes that report partitions)."""
    rows = []
    for st in sorted((s for s in statuses.values() if "error" not in s
                      and s.get("partitions") is not None),
                     key=lambda s: s.get("node_id", 1 << 30)):
        sm = partition_summary(st)
        topics = sm["topics"]
        shown = ", ".join(topics[:5]) + (f" +{len(topics) - 5}" if len(topics) > 5 else "")
        ctl = st.get("controller") or {}
        rows.append([str(st["node_id"]), str(sm["replicas"]), str(sm["leading"]),
                     str(sm["following"]), str(sm["without_leader"]), shown or "-",
                     ctl.get("role") or "-"])
    return rows


def shard_rows(statuses: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Per node of K > 1 shard processes (docs/SHARDS.md): each shard's figures as its shard
    0 reports them, then the node's totals (shard "all")."""
    rows = []
    for st in sorted((s for s in statuses.values() if "error" not in s and s.get("node_shards")),
                     key=lambda s: s.get("node_id", 1 << 30)):
        node = str(st.get("node_id"))
        lines = [*st["node_shards"], {"shard": "all", "address": "",
                                      **(st.get("node_totals") or {})}]
        for line in lines:
            reported = line.get("reported", True)
            rows.append([node, str(line["shard"]), line.get("address") or "",
                         str(line.get("partitions", "-")), str(line.get("leading", "-")),
                         *(_figure(line, k) if reported else "not reported yet"
                           for k in ("groups", "cpu_seconds", "rss_bytes",
                                     "loop_lag_max_ms"))])
    return rows


def _figure(line: dict[str, Any], key: str) -> str:
    value = line.get(key)
    if value is None:
        return "-"
    if key == "cpu_seconds":
        return f"{value:,.1f} s"
    if key == "rss_bytes":
        return f"{value / 1e6:,.0f} MB"
    if key == "loop_lag_max_ms":
        return f"{value:,.1f} ms"
    return str(value)


def storage_rows(statuses: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Per node: what the log holds, what holds retention back (docs/RETENTION.md), the
    scrubber (docs/DISK-LOSS.md) and the subscription table (docs/SUBSCRIPTIONS.md)."""
    rows = []
    for st in sorted((s for s in statuses.values() if "error" not in s),
                     key=lambda s: s.get("node_id", 1 << 30)):
        ret, scrub = st.get("retention") or {}, st.get("scrub") or {}
        subs = st.get("subscriptions")
        active = ret.get("active")
        rows.append([str(st["node_id"]), str(st.get("start_offset", 0)),
                     f"{st.get('retained_bytes', 0):,} B",
                     (ret.get("held_by") or "-") if active else "retention off",
                     f"{ret.get('deleted_bytes', 0):,} B" if active else "-",
                     str(scrub.get("passes", "-")), str(scrub.get("found", "-")),
                     "-" if subs is None else f"{subs['subscriptions']} (applied to "
                                              f"{subs['applied']})"])
    return rows


def follower_rows(leader_st: dict[str, Any]) -> list[list[str]]:
    return [[str(f["node_id"]), str(f["match_index"]), str(f["next_index"]),
             str(f["dirty_offset"]), str(f["flushed_offset"]),
             f"{f['inflight']} / {f['inflight_bytes']} B",
             "yes" if f.get("recovering") else "no", f"{f.get('bytes_behind', 0):,}",
             f"{f.get('catchup_bytes_per_s', 0) / 1e6:.1f} MB/s",
             ("yes" if f.get("learner") else "no") + (" (rejoining)" if f.get("rejoining")
                                                      else ""),
             str(f["last_heard_ticks"])]
            for f in leader_st.get("followers") or []]


def render_status(statuses: dict[str, dict[str, Any]], console: Any = None) -> None:
    from rich.console import Console

    if console is None:
        # Off a terminal (a pipe, a file) nothing limits the width, unless COLUMNS says so.
        piped = not Console().is_terminal and "COLUMNS" not in os.environ
        console = Console(width=1 << 12) if piped else Console()
    _render(console, "raftlog nodes", NODE_COLUMNS, node_rows(statuses))
    ids = _ids_by_address(statuses)
    for addr, st in statuses.items():
        if "error" in st:
            who = f"node {ids[addr]}" if addr in ids else "node"
            console.print(f"[red]{who} at {addr} did not answer:[/] {st['error']}",
                          soft_wrap=True, markup=True, highlight=False)
    for line, bad in identity_lines(statuses, ids):
        console.print(f"[red]{line}[/]" if bad else line, soft_wrap=True, markup=bad,
                      highlight=False)
    partitions = partition_rows(statuses)
    if partitions:
        _render(console, "partitions per node (`raftlog topic describe NAME` for each topic)",
                PARTITION_COLUMNS, partitions)
    shards = shard_rows(statuses)
    if shards:
        _render(console, "shards per node (docs/SHARDS.md; `all`: the node's totals)",
                SHARD_COLUMNS, shards)
    storage = storage_rows(statuses)
    if storage:
        _render(console, "log storage", STORAGE_COLUMNS, storage)
    leader_st = next((st for st in statuses.values() if st.get("role") == "leader"), None)
    if leader_st and leader_st.get("followers"):
        _render(console, f"followers of leader {leader_st['node_id']}", FOLLOWER_COLUMNS,
                follower_rows(leader_st))


def _render(console: Any, title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    """A table when it fits the console's width; otherwise one block per row."""
    from rich.measure import Measurement
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, no_wrap=True,
                         justify="left" if col in ("address", "role") else "right")
    for row in rows:
        table.add_row(*row)
    needed = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    if needed <= console.width:
        console.print(table)
        return
    console.print(f"[bold]{title}[/]", highlight=False)
    for row in rows:
        head = f"{columns[0]} {row[0]}"
        rest = "  ".join(f"{c} {v}" for c, v in zip(columns[1:], row[1:]))
        console.print(f"{head}: {rest}", soft_wrap=True, highlight=False, markup=False)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="every node's role, term, offsets and follower progress",
                       description="Every node's role, term and offsets (dirty = appended, "
                                   "flushed = fsynced, commit = flushed on a majority, high "
                                   "watermark = readable), how many partitions each node "
                                   "holds and leads, and the leader's view of its "
                                   "followers. Exit 1 when no node answers.")
    servers_arg(p, timeout=2.0, timeout_help="seconds to wait for each node",
                profile_timeout=False)
    json_flag(p, "machine-readable output")
    p.set_defaults(func=cmd_status)
