"""`raftlog status`: every node's role, term and offsets, and the leader's view of its
followers, as tables or as JSON. `render_status` is also what `raftlog demo` prints at the end."""

from __future__ import annotations

import argparse
import json
from typing import Any

from raft.cli.args import servers_arg
from raft.client import BlockingClient


def cmd_status(args: argparse.Namespace) -> int:
    with BlockingClient(args.servers, timeout=args.timeout) as client:
        statuses = client.cluster_status(timeout=args.timeout)
    if args.json:
        print(json.dumps(status_json(statuses), indent=2, sort_keys=True))
    else:
        render_status(statuses)
    return 0 if any("error" not in st for st in statuses.values()) else 1


def status_json(statuses: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`status --json`: {"nodes": [{node_id, address, role, term, leader_id, dirty_offset,
    flushed_offset, commit_index, high_watermark, lag, ..., followers (leader only)}]}."""
    nodes = []
    top = max((st.get("dirty_offset", -1) for st in statuses.values() if "error" not in st),
              default=-1)
    for addr, st in sorted(statuses.items(), key=lambda kv: kv[1].get("node_id", 1 << 30)):
        entry = {"address": addr, **st}
        if "error" not in st:
            entry["lag"] = top - st.get("dirty_offset", -1)
        nodes.append(entry)
    return {"nodes": nodes}


def render_status(statuses: dict[str, dict[str, Any]], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    nodes = Table(title="raftlog nodes")
    for col in ("node", "address", "role", "term", "leader", "dirty", "flushed", "commit",
                "high watermark", "lag"):
        nodes.add_column(col, justify="right" if col not in ("address", "role") else "left")
    leader_st = None
    top = max((st.get("dirty_offset", -1) for st in statuses.values() if "error" not in st),
              default=-1)
    for addr, st in sorted(statuses.items(), key=lambda kv: kv[1].get("node_id", 1 << 30)):
        if "error" in st:
            nodes.add_row("?", addr, f"[red]{st['error']}[/]", *[""] * 7)
            continue
        if st.get("role") == "leader":
            leader_st = st
        role = st["role"]
        if st.get("standing", "member") != "member":  # e.g. "rejoining: lost its disk"
            role = f"{role} [yellow]({st['standing']})[/]"
        if st.get("damaged"):
            role += " [red](damaged: " + ", ".join(f"{a}..{b}" for a, b in st["damaged"]) + ")[/]"
        nodes.add_row(str(st["node_id"]), addr, role, str(st["term"]),
                      str(st.get("leader_id")), str(st["dirty_offset"]),
                      str(st["flushed_offset"]), str(st["commit_index"]),
                      str(st["high_watermark"]), str(top - st["dirty_offset"]))
    console.print(nodes)
    if leader_st and leader_st.get("followers"):
        prog = Table(title=f"followers of leader {leader_st['node_id']}")
        for col in ("node", "match", "next", "dirty", "flushed", "in flight", "recovering",
                    "bytes behind", "catch-up", "learner", "last heard (ticks)"):
            prog.add_column(col, justify="right")
        for f in leader_st["followers"]:
            prog.add_row(str(f["node_id"]), str(f["match_index"]), str(f["next_index"]),
                         str(f["dirty_offset"]), str(f["flushed_offset"]),
                         f"{f['inflight']} / {f['inflight_bytes']} B",
                         "yes" if f.get("recovering") else "no",
                         f"{f.get('bytes_behind', 0):,}",
                         f"{f.get('catchup_bytes_per_s', 0) / 1e6:.1f} MB/s",
                         ("yes" if f.get("learner") else "no")
                         + (" (rejoining)" if f.get("rejoining") else ""),
                         str(f["last_heard_ticks"]))
        console.print(prog)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="every node's role, term, offsets and follower progress")
    servers_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
