"""`raftlog consume`: print committed records from an offset, as `offset<TAB>value` or as JSON
(values that are not UTF-8 come out base64)."""

from __future__ import annotations

import argparse
import base64
import json
from typing import Any

import trio

from raft.cli import subscriptions
from raft.cli.args import positive_int, servers_arg
from raft.client import Client, FetchedRecord


def cmd_consume(args: argparse.Namespace) -> int:
    """Records from --from (default: the log start) up to --to (exclusive); stops at the high
    watermark unless --follow."""
    if args.subscription is not None:  # resume from a subscription (raft/cli/subscriptions.py)
        return subscriptions.consume_subscription(args, _print_record)

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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("consume", help="print committed records from an offset")
    servers_arg(p)
    p.add_argument("--from", "--offset", dest="from_offset", type=int, default=-1,
                   metavar="OFFSET", help="first offset to read (default: the log start)")
    p.add_argument("--to", type=int, default=None, metavar="OFFSET",
                   help="stop before this offset (exclusive)")
    p.add_argument("--count", type=positive_int, default=None,
                   help="stop after this many records")
    p.add_argument("--follow", action="store_true", help="keep waiting for new records")
    p.add_argument("--max-wait", type=float, default=5.0,
                   help="long-poll seconds per fetch with --follow (default 5)")
    p.add_argument("--max-bytes", type=positive_int, default=1 << 20,
                   help="bytes per fetch (default 1 MiB)")
    p.add_argument("--node", metavar="HOST:PORT", default=None,
                   help="read from this node (default: the leader)")
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    subscriptions.add_consume_arguments(p)
    p.set_defaults(func=cmd_consume)
