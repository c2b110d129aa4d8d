"""`raftlog consume`: print committed records, one per line, as `offset<TAB>value` or as JSON.

Where to start: `--from N` (an offset), `--from -N` (the last N records), `--from start` (the
log start, the default), `--from end` (only records committed from now on, with --follow), or
`--since TIME` (the first record stamped at or after TIME: a duration back from now such as
`10m`, or an ISO time; found by a binary search over batch timestamps, see
raft.client.Client.offset_for_time). `--to` stops before an offset.

Offsets: every entry of the replicated log takes offsets, and some are not records: a new
leader's no-op (so the first record of a new cluster is at offset 1), membership changes and
staged-load markers. Record offsets therefore have gaps; consume reads across them.

Text output escapes values so each record is one unambiguous line (raft.cli.output); --format
TEMPLATE lays each record out with placeholders for key, value, offset, partition, timestamp and
headers (raft.cli.template); --json prints {"offset", "timestamp_ms", "value"|"value_b64",
"key"|"key_b64", "headers"}.

Topics: `--topic T --partition P` reads one partition of topic T (every flag as above, offsets
being that partition's); `--topic T` alone reads every partition of T, each in offset order,
taking turns across them: --from/--since apply to each partition (`--from -N`: the last N of
each), --count to the total, and --to and --node, being one partition's offsets or copy, need
--partition. With --topic or --partition each text line is `partition<TAB>offset<TAB>value`;
--json lines always carry "partition". Without them: the default topic's partition 0.

A committed batch that cannot be decoded as records (written by a faulty client, or before
nodes validated payloads) is reported on stderr, one line naming its offsets and what to do;
the records after it are printed as usual, and the exit status is 1 once all is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import trio

from raft.cli import subscriptions_cmd as subscriptions
from raft.cli.args import json_flag, non_negative_int, positive_float, positive_int, \
    servers_arg, since, start_offset
from raft.cli.security import client_options
from raft.cli.output import Undecodable, escape_value, headers_json, put_bytes
from raft.cli.template import FIELDS, compile_template
from raft.client import Client, FetchedRecord, OffsetOutOfRangeError, TopicConsumer, \
    UndecodableBatch
from raft.node.config import ConfigError

MAX_WAIT_S = 5.0  # --follow's long poll unless --max-wait says otherwise
OFFSETS_NOTE = ("Offsets: every log entry takes offsets, and some are not records (a new "
                "leader's no-op, so a new cluster's first record is at offset 1; membership "
                "changes; load markers): record offsets have gaps, and consume reads across "
                "them.")


def cmd_consume(args: argparse.Namespace) -> int:
    _refuse_flags_that_cannot_apply(args)
    args.print_record = _printer(args)
    if args.subscription is not None:  # resume from a subscription (raft/cli/subscriptions_cmd.py)
        return subscriptions.consume_subscription(args, lambda r, _json: args.print_record(r))
    if isinstance(args.from_offset, int) and args.from_offset >= 0 and args.to is not None \
            and args.to <= args.from_offset:
        raise ConfigError(f"--to {args.to} must be above --from {args.from_offset} (--to is "
                          f"exclusive: --from 5 --to 8 reads offsets 5, 6 and 7)")

    bad = Undecodable(as_json=args.json)

    async def run() -> int:
        async with Client(args.servers, timeout=args.timeout, **client_options(args)) as client:
            if args.topic is not None and args.partition is None \
                    and (await client.topic(args.topic)).partition_count > 1:
                await _consume_topic(client, args, bad)
            else:
                await _consume(client, args, bad)
        return bad.status

    return trio.run(run)  # Ctrl-C (how --follow ends): main() exits 130, as documented


def _refuse_flags_that_cannot_apply(args: argparse.Namespace) -> None:
    """A flag that would be ignored is a usage error: the user meant something by it."""
    if args.subscription is None:
        given = [flag for flag, value in (("--from-start", args.sub_start == "start"),
                                          ("--from-end", args.sub_start == "end"),
                                          ("--commit-ms", args.commit_ms is not None),
                                          ("--exclusive", args.exclusive),
                                          ("--auto-reset", args.auto_reset is not None),
                                          ("--member", args.member is not None))
                 if value]
        if given:
            raise ConfigError(f"{', '.join(given)} only apply with --subscription NAME; add "
                              f"it, or use --from (start, end, an offset) to read without one")
    if args.max_wait is not None and not args.follow:
        raise ConfigError("--max-wait is the long poll of --follow; add --follow, or drop "
                          "--max-wait (without --follow consume stops at the end of the log)")
    if args.max_wait is None:
        args.max_wait = MAX_WAIT_S
    if args.format is not None and args.json:
        raise ConfigError("--format lays out text lines and --json prints JSON objects; "
                          "give one of them")


def where(args: argparse.Namespace) -> dict[str, Any]:
    """The topic partition a single-partition read is of (--topic, --partition)."""
    return {"topic": args.topic, "partition": args.partition or 0}


def _printer(args: argparse.Namespace) -> Callable[[FetchedRecord], None]:
    """How each record is printed: --format's template, --json, or `offset<TAB>value`
    (`partition<TAB>offset<TAB>value` with --topic or --partition)."""
    if args.format is None:
        partitioned = args.topic is not None or args.partition is not None
        return lambda r: _print_record(r, args.json, partitioned)
    render = compile_template(args.format)

    def print_formatted(r: FetchedRecord) -> None:
        sys.stdout.write(render(r))
    return print_formatted


async def _bounds(client: Client, node: str | None,
                  at: dict[str, Any] | None = None) -> tuple[int, int]:
    """(log start, high watermark) of a partition (`at`: its topic and partition)."""
    try:
        res = await client.fetch(0, max_bytes=1, address=node, **(at or {}))
        return res.start_offset, res.high_watermark
    except OffsetOutOfRangeError as e:
        start = e.start_offset if e.start_offset is not None else 0
        return start, e.high_watermark if e.high_watermark is not None else start - 1


async def _read_range(client: Client, args: argparse.Namespace, first: int,
                      last: int) -> tuple[list[FetchedRecord], list[UndecodableBatch]]:
    """Every committed record in [first, last], and the undecodable batches there."""
    out: list[FetchedRecord] = []
    bad: list[UndecodableBatch] = []
    offset = first
    while offset <= last:
        res = await client.fetch(offset, max_bytes=args.max_bytes, address=args.node,
                                 **where(args))
        out.extend(r for r in res.records if r.offset <= last)
        bad.extend(b for b in res.undecodable if b.first_offset <= last)
        if res.next_offset <= offset:
            break
        offset = res.next_offset
    return out, bad


async def _last_records(client: Client, args: argparse.Namespace, n: int,
                        bad: Undecodable) -> tuple[list[FetchedRecord], int]:
    """The last n committed records (fewer if the log holds fewer), and the offset after them.
    Offsets have gaps (control entries), so the window is widened until it holds n records.
    Undecodable batches among them are reported."""
    start, hw = await _bounds(client, args.node, where(args))
    back = n
    while True:
        lo = max(start, hw + 1 - back)
        records, undecodable = await _read_range(client, args, lo, hw)
        if len(records) >= n or lo == start:
            first = records[-n].offset if len(records) >= n else lo
            for b in undecodable:
                if b.last_offset >= first:
                    bad.report(b)
            return records[-n:], hw + 1
        back *= 2


async def _consume(client: Client, args: argparse.Namespace, bad: Undecodable) -> None:
    printed = 0
    frm = "start" if args.from_offset is None else args.from_offset
    if args.since is not None:
        offset = await client.offset_for_time(args.since, address=args.node, **where(args))
    elif frm == "start":
        offset = (await _bounds(client, args.node, where(args)))[0]
    elif frm == "end":
        offset = (await _bounds(client, args.node, where(args)))[1] + 1
    elif frm < 0:
        records, offset = await _last_records(client, args, -frm, bad)
        for r in records:
            if args.to is not None and r.offset >= args.to:
                return
            args.print_record(r)
            printed += 1
            if args.count is not None and printed >= args.count:
                return
        sys.stdout.flush()
    else:
        offset = frm
    while args.count is None or printed < args.count:
        if args.to is not None and offset >= args.to:
            return
        res = await client.fetch(offset, max_bytes=args.max_bytes,
                                 max_wait=args.max_wait if args.follow else 0.0,
                                 address=args.node, **where(args))
        for r in sorted([*res.records, *res.undecodable], key=lambda x: x.offset):
            if args.to is not None and r.offset >= args.to:
                return
            if isinstance(r, UndecodableBatch):
                bad.report(r)
                continue
            args.print_record(r)
            printed += 1
            if args.count is not None and printed >= args.count:
                return
        sys.stdout.flush()
        if res.next_offset <= offset and not res.records and not res.undecodable \
                and not args.follow:
            return  # at the high watermark: everything committed was printed
        offset = max(offset, res.next_offset)


async def _consume_topic(client: Client, args: argparse.Namespace, bad: Undecodable) -> None:
    """Every partition of --topic, each from where --from/--since says, taking turns."""
    if args.to is not None or args.node is not None:
        flag = "--to" if args.to is not None else "--node"
        raise ConfigError(f"{flag} is about one partition (offsets are per partition): add "
                          f"--partition P, or drop {flag} to read every partition of "
                          f"{args.topic}")
    info = await client.topic(args.topic)
    frm = "start" if args.from_offset is None else args.from_offset
    starts: dict[int, int] = {}
    for p in range(info.partition_count):
        at = {"topic": args.topic, "partition": p}
        if args.since is not None:
            starts[p] = await client.offset_for_time(args.since, **at)
        elif frm in ("start", "end"):
            lo, hw = await _bounds(client, None, at)
            starts[p] = lo if frm == "start" else hw + 1
        elif isinstance(frm, int) and frm < 0:
            one = argparse.Namespace(**{**vars(args), "partition": p})
            records, after = await _last_records(client, one, -frm, bad)
            starts[p] = records[0].offset if records else after
        else:
            starts[p] = int(frm)
    printed = 0
    reader = TopicConsumer(client, args.topic, partitions=sorted(starts), start=starts,
                           follow=args.follow, max_bytes=args.max_bytes,
                           max_wait=args.max_wait, on_undecodable=bad.report)
    async for r in reader:
        args.print_record(r)
        printed += 1
        if printed % 256 == 0:
            sys.stdout.flush()
        if args.count is not None and printed >= args.count:
            break
    sys.stdout.flush()


def record_json(r: FetchedRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"partition": r.partition, "offset": r.offset,
                           "timestamp_ms": r.timestamp_ms}
    put_bytes(out, "value", r.value)
    if r.key is not None:
        put_bytes(out, "key", r.key)
    if r.headers:
        out["headers"] = headers_json(r.headers)
    return out


def _print_record(r: FetchedRecord, as_json: bool, partitioned: bool = False) -> None:
    if as_json:
        sys.stdout.write(json.dumps(record_json(r)) + "\n")
    elif partitioned:
        sys.stdout.write(f"{r.partition}\t{r.offset}\t{escape_value(r.value)}\n")
    else:
        sys.stdout.write(f"{r.offset}\t{escape_value(r.value)}\n")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "consume", help="print committed records from an offset, the end, or a time",
        description="Print committed records, one per line: `offset<TAB>value` (values "
                    "escaped: \\n, \\t, \\\\, \\xNN for bytes that are not UTF-8) or JSON. "
                    + OFFSETS_NOTE)
    servers_arg(p)
    p.add_argument("--topic", default=None, metavar="TOPIC",
                   help="read this topic: every partition, each in order (default: the topic "
                        "`default`, partition 0)")
    p.add_argument("--partition", type=non_negative_int, default=None, metavar="P",
                   help="read only partition P (of --topic, else of `default`)")
    first = p.add_mutually_exclusive_group()
    first.add_argument("--from", "--offset", dest="from_offset", type=start_offset,
                       default=None, metavar="OFFSET",
                       help="N: from offset N; -N: the last N records; start: the log start "
                            "(default); end: only new records (with --follow)")
    first.add_argument("--since", type=since, default=None, metavar="TIME",
                       help="from the first record stamped at or after TIME: a duration back "
                            "from now (90s, 10m, 1h30m, 2d) or an ISO time (2026-11-23T10:00, "
                            "local time unless it has an offset)")
    p.add_argument("--to", type=non_negative_int, default=None, metavar="OFFSET",
                   help="stop before this offset (exclusive)")
    p.add_argument("--count", type=positive_int, default=None,
                   help="stop after this many records")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep waiting for new records (Ctrl-C stops)")
    p.add_argument("--max-wait", type=positive_float, default=None,
                   help=f"long-poll seconds per fetch with --follow (default {MAX_WAIT_S:g})")
    p.add_argument("--max-bytes", type=positive_int, default=1 << 20,
                   help="bytes per fetch (default 1 MiB)")
    p.add_argument("--node", metavar="HOST:PORT", default=None,
                   help="read from this node, up to its own high watermark (default: the "
                        "leader)")
    json_flag(p, 'one JSON object per record: partition, offset, timestamp_ms, value (or '
                 'value_b64 when not UTF-8), key, headers')
    p.add_argument("--format", metavar="TEMPLATE", default=None,
                   help="print each record as TEMPLATE, with placeholders "
                        + ", ".join(f"{{{f}}}" for f in FIELDS)
                        + r" (e.g. '{offset} {key}={value}'; \t is a tab); keys and values "
                          "escaped as in the default output")
    subscriptions.add_consume_arguments(p)
    p.set_defaults(func=cmd_consume)
