"""`raftlog produce`: stdin lines become records, sent through an idempotent Producer; prints
each line's offset (or a JSON object per line with --json)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio

from raft.cli.args import positive_int, servers_arg
from raft.cli.security import client_options
from raft.client import Client, Producer, RaftlogError


def cmd_produce(args: argparse.Namespace) -> int:
    lines = [line.rstrip("\n") for line in sys.stdin]
    if not lines:
        return 0

    async def run() -> int:
        failed = 0
        results: list[dict[str, Any]] = []
        async with Client(args.servers, timeout=args.timeout,
                          **client_options(args)) as client, \
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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("produce", help="send stdin lines as records; prints their offsets")
    servers_arg(p)
    p.add_argument("--acks", choices=["quorum", "leader", "none"], default="quorum",
                   help="quorum: flushed on a majority; leader: appended by the leader; "
                        "none: accepted (default quorum)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per input line, in input order, with its offset")
    p.add_argument("--batch-bytes", type=positive_int, default=1 << 20,
                   help="largest batch sent in one request (default 1 MiB)")
    p.add_argument("--batch-records", type=positive_int, default=10_000,
                   help="lines handed to the producer at a time (default 10000)")
    p.add_argument("--linger", type=float, default=0.0,
                   help="seconds a partial batch may wait for more records (default 0)")
    p.set_defaults(func=cmd_produce)
