"""`raftlog`: the command line that people, scripts and the tests use.

    raftlog serve --node-id 1 --data-dir ./data --peers 1=127.0.0.1:7101,2=...,3=...
    raftlog up [--nodes 3] [--data-dir ./data] [--base-port 7101]
    raftlog produce --servers H:P,... [--acks quorum|leader|none] [--json]   < lines
    raftlog consume --servers H:P,... [--offset N] [--count N] [--follow] [--json]
    raftlog status --servers H:P,... [--json]
    raftlog demo                    (what `make run` runs)

Other packages add their commands through `register(subparsers)`: bench.cli (`raftlog bench`),
sparkio.cli (`raftlog load`), recovery.cli (`add-node`, `remove-node`, `transfer-leader`).
Exit codes: 0 success, 1 the operation failed, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import trio

from raft.client import (BlockingClient, Client, FetchedRecord, Producer, RaftlogError,
                         parse_servers)
from raft.node.config import ConfigError, NodeConfig

PLUGINS = ("bench.cli", "sparkio.cli", "raft.cli.membership")
DEFAULT_SERVERS = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"


# ============================================================================ serve
def cmd_serve(args: argparse.Namespace) -> int:
    from raft.node.serve import serve

    return serve({k: v for k, v in vars(args).items() if k not in ("func", "command", "verbose")})


# ============================================================================ up
def cmd_up(args: argparse.Namespace) -> int:
    from rich.console import Console

    from raft.cli.localcluster import LocalCluster

    console = Console(stderr=True)
    cluster = LocalCluster(Path(args.data_dir), nodes=args.nodes, base_port=args.base_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster.start()
    try:
        for i, addr in cluster.addresses.items():
            console.print(f"node {i}: {addr}  (log: {cluster.data_dir / f'node-{i}.log'})")
        try:
            with console.status("waiting for a leader..."):
                leader = cluster.wait_leader(timeout=30)
        except TimeoutError:
            console.print("[red]no leader within 30 s[/]; see the node logs above")
            return 1
        console.print(f"leader: node {leader}. servers: [bold]{cluster.servers}[/]")
        console.print(f"try: echo hello | raftlog produce --servers {cluster.servers}")
        console.print("Ctrl-C stops every node cleanly.")
        while not stop.wait(0.5):
            dead = [i for i in cluster.addresses if not cluster.alive(i)]
            if dead:
                console.print(f"[red]node(s) {dead} exited[/]; see their logs. Stopping.")
                return 1
        return 0
    finally:
        codes = cluster.stop()
        console.print(f"stopped: exit codes {codes}")


# ============================================================================ produce
def cmd_produce(args: argparse.Namespace) -> int:
    lines = [line.rstrip("\n") for line in sys.stdin]
    if not lines:
        return 0

    async def run() -> int:
        failed = 0
        results: list[dict[str, Any]] = []
        async with Client(args.servers, timeout=args.timeout) as client, \
                Producer(client, acks=args.acks, batch_bytes=args.batch_bytes,
                         linger=args.linger, timeout=args.timeout) as producer:
            chunk = max(1, args.batch_records)
            for start in range(0, len(lines), chunk):
                part = lines[start:start + chunk]
                try:
                    offsets = await producer.send_many(part)
                    results.extend({"offset": o, "value": v} for o, v in zip(offsets, part))
                except RaftlogError as e:
                    failed += len(part)
                    for v in part:
                        results.append({"error": e.code, "value": v})
                        print(f"raftlog produce: not acknowledged ({e.code}: {e.message}): {v}",
                              file=sys.stderr)
        for r in results:
            if args.json:
                print(json.dumps(r))
            elif "offset" in r:
                print(r["offset"])
        return 1 if failed else 0

    return trio.run(run)


# ============================================================================ consume
def cmd_consume(args: argparse.Namespace) -> int:
    """Records from --from (default: the log start) up to --to (exclusive); stops at the high
    watermark unless --follow."""
    async def run() -> int:
        printed = 0
        offset = args.from_offset
        async with Client(args.servers, timeout=args.timeout) as client:
            if offset < 0:
                offset = (await client.fetch(0, max_bytes=1, address=args.node)).start_offset
            while args.count is None or printed < args.count:
                if args.to is not None and offset >= args.to:
                    return 0
                res = await client.fetch(offset, max_bytes=args.max_bytes,
                                         max_wait=args.max_wait if args.follow else 0.0,
                                         address=args.node)
                for r in res.records:
                    if args.to is not None and r.offset >= args.to:
                        return 0
                    _print_record(r, args.json)
                    printed += 1
                    if args.count is not None and printed >= args.count:
                        return 0
                if res.next_offset <= offset and not res.records and not args.follow:
                    return 0  # at the high watermark: everything committed was printed
                offset = max(offset, res.next_offset)
        return 0

    try:
        return trio.run(run)
    except KeyboardInterrupt:
        return 0


def _print_record(r: FetchedRecord, as_json: bool) -> None:
    if as_json:
        out: dict[str, Any] = {"offset": r.offset, "timestamp_ms": r.timestamp_ms}
        _put_bytes(out, "value", r.value)
        if r.key is not None:
            _put_bytes(out, "key", r.key)
        print(json.dumps(out))
    else:
        print(f"{r.offset}\t{_text(r.value)}")


def _put_bytes(out: dict[str, Any], name: str, b: bytes) -> None:
    """UTF-8 text as `name`, anything else base64 as `name_b64`."""
    try:
        out[name] = b.decode()
    except UnicodeDecodeError:
        out[f"{name}_b64"] = base64.b64encode(b).decode()


def _text(b: bytes) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:
        return "b64:" + base64.b64encode(b).decode()


# ============================================================================ status
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
        nodes.add_row(str(st["node_id"]), addr, st["role"], str(st["term"]),
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
                         "yes" if f.get("learner") else "no", str(f["last_heard_ticks"]))
        console.print(prog)


# ============================================================================ demo
def cmd_demo(args: argparse.Namespace) -> int:
    from raft.cli.demo import run_demo

    return run_demo(records=args.records, keep=args.keep)


# ============================================================================ parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftlog", description="A Raft-replicated log of record batches.",
        epilog="Start with `raftlog demo`, or `raftlog up` and then produce/consume/status.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug); quiet by default")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("serve", help="run one node until SIGTERM")
    NodeConfig.add_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("up", help="run a local cluster of real processes until Ctrl-C")
    p.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    p.add_argument("--data-dir", default="./data", help="where the nodes keep their logs")
    p.add_argument("--base-port", type=int, default=7101,
                   help="node i listens on base-port + i - 1 (default 7101)")
    p.set_defaults(func=cmd_up)

    def servers_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--servers", default=DEFAULT_SERVERS, type=_servers,
                       help=f"any nodes of the cluster (default {DEFAULT_SERVERS})")
        p.add_argument("--timeout", type=_positive_float, default=10.0,
                       help="seconds per operation, retries included (default 10)")

    p = sub.add_parser("produce", help="send stdin lines as records; prints their offsets")
    servers_arg(p)
    p.add_argument("--acks", choices=["quorum", "leader", "none"], default="quorum",
                   help="quorum: flushed on a majority; leader: appended by the leader; "
                        "none: accepted (default quorum)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per input line, in input order, with its offset")
    p.add_argument("--batch-bytes", type=_positive_int, default=1 << 20,
                   help="largest batch sent in one request (default 1 MiB)")
    p.add_argument("--batch-records", type=_positive_int, default=10_000,
                   help="lines handed to the producer at a time (default 10000)")
    p.add_argument("--linger", type=float, default=0.0,
                   help="seconds a partial batch may wait for more records (default 0)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print committed records from an offset")
    servers_arg(p)
    p.add_argument("--from", "--offset", dest="from_offset", type=int, default=-1,
                   metavar="OFFSET", help="first offset to read (default: the log start)")
    p.add_argument("--to", type=int, default=None, metavar="OFFSET",
                   help="stop before this offset (exclusive)")
    p.add_argument("--count", type=_positive_int, default=None,
                   help="stop after this many records")
    p.add_argument("--follow", action="store_true", help="keep waiting for new records")
    p.add_argument("--max-wait", type=float, default=5.0,
                   help="long-poll seconds per fetch with --follow (default 5)")
    p.add_argument("--max-bytes", type=_positive_int, default=1 << 20,
                   help="bytes per fetch (default 1 MiB)")
    p.add_argument("--node", metavar="HOST:PORT", default=None,
                   help="read from this node (default: the leader)")
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    p.set_defaults(func=cmd_consume)

    p = sub.add_parser("status", help="every node's role, term, offsets and follower progress")
    servers_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("demo", help="start a local 3-node cluster, run a short workload "
                                    "(every ack level, a leader SIGKILL), report, stop")
    p.add_argument("--records", type=_positive_int, default=3000,
                   help="records written per ack level (default 3000)")
    p.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    p.set_defaults(func=cmd_demo)

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
    return parser


def _servers(text: str) -> str:
    try:
        parse_servers(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


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
