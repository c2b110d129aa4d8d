"""`raftlog produce`: stdin lines become records as they arrive, sent through an idempotent
Producer; each line's offset is printed (in input order) as soon as it is acknowledged.

Streaming: a line is sent once it is complete, batched with whatever else arrived while the
previous batch was out (`--linger` can wait a little longer, `--batch-bytes` bounds a batch),
so `tail -f app.log | raftlog produce` delivers as the log grows. Reading pauses while
`--max-pending` records (or 64 MiB) wait for their acknowledgement.

Topics: `--topic T` writes to topic T, each record to its key's partition (Kafka's murmur2 hash;
keys from --key, --key-separator or the "key" of --input json) or, without a key, to one
partition per batch; `--partition P` pins every record to P. Offsets are per partition, so
with --topic or --partition each acknowledged line prints `PARTITION<TAB>OFFSET` (--json:
"partition" and "offset" always). Without them: the default topic's partition 0, and the
offset alone, as before topics.

Failures never echo the data: a run of lines that failed the same way is one stderr line with
their line numbers and size. When no node can be reached at all, produce stops reading and
exits 1 with one summarised error. Ctrl-C stops reading, waits (up to --timeout) for what was
already sent, prints those offsets and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

import trio

from raft.cli.args import (ACKS_CHOICES, acks, json_flag, non_negative_float,
                           non_negative_int, positive_int, servers_arg)
from raft.cli.client_settings import ACKS_DEFAULT
from raft.cli.output import print_error, put_bytes
from raft.cli.security import client_options
from raft.cli.produce_input import Line, RecordMaker, parse_header, read_lines
from raft.client import Client, Delivery, Producer, RaftlogError, TooLargeError

MAX_PENDING_BYTES = 64 << 20


@dataclass(slots=True)
class _Item:
    line: Line
    delivery: Delivery | None = None
    error: RaftlogError | None = None  # refused before sending (bad JSON, too long)


class _Report:
    """Prints results in input order; folds consecutive failures of one kind into one line.
    Output is buffered until `flush()`, which the printer calls before it waits for an answer
    (so everything acknowledged so far is visible) and when it has caught up."""

    def __init__(self, as_json: bool, partitioned: bool = False) -> None:
        self.as_json = as_json
        self.partitioned = partitioned  # --topic/--partition: text lines name the partition
        self.acked = 0
        self.failed = 0
        self.unreachable: RaftlogError | None = None
        self.stdout_gone = False
        self._out: list[str] = []
        self._run: tuple[str, str, int, int, int] | None = None  # code, message, first, last, bytes

    def ok(self, item: _Item, offset: int) -> None:
        self._end_run()
        self.acked += 1
        partition = item.delivery.partition if item.delivery else 0
        if self.as_json:
            out: dict[str, Any] = {"partition": partition, "offset": offset}
            put_bytes(out, "value", item.delivery.record.value if item.delivery else b"")
            self._out.append(json.dumps(out))
        elif self.partitioned:
            self._out.append(f"{partition}\t{offset}")
        else:
            self._out.append(str(offset))

    def fail(self, item: _Item, err: RaftlogError) -> None:
        self.failed += 1
        n, size = item.line.number, item.line.size
        if self.as_json:
            self._out.append(json.dumps({"line": n, "bytes": size, "error": {
                "code": err.code, "message": err.message}}))
        if self._run and self._run[:2] == (err.code, err.message) and self._run[3] == n - 1:
            code, message, first, _, total = self._run
            self._run = (code, message, first, n, total + size)
        else:
            self._end_run()
            self._run = (err.code, err.message, n, n, size)

    def _end_run(self) -> None:
        if self._run is None:
            return
        code, message, first, last, total = self._run
        self._run = None
        self._write()  # stdout up to here first: the two streams stay in order on a terminal
        which = f"line {first}" if first == last else f"lines {first}-{last}"
        count = last - first + 1
        print_error("produce", code, f"{which} ({count} line{'s' * (count > 1)}, {total:,} "
                                     f"bytes) not acknowledged: {message}", as_json=self.as_json,
                    lines=[first, last])

    def flush(self, *, end_runs: bool = True) -> None:
        if end_runs:
            self._end_run()
        self._write()

    def _write(self) -> None:
        """To stdout, until its reader goes away (`| head`): then quietly nowhere."""
        text, self._out = self._out, []
        if self.stdout_gone:
            return
        try:
            if text:
                sys.stdout.write("\n".join(text) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            self.stdout_gone = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the final flush at exit must not fail


class _Reader:
    """The input's lines; `stop()` ends the reading at once, even inside a blocked read, but
    never while a line is being handed on (so no line is sent without being reported)."""

    def __init__(self, lines: Any) -> None:
        self._lines = lines.__aiter__()
        self._scope: trio.CancelScope | None = None
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def next(self) -> list[Line] | None:
        if self._stopped:
            return None
        with trio.CancelScope() as self._scope:
            try:
                return await self._lines.__anext__()
            except StopAsyncIteration:
                return None
            finally:
                self._scope = None
        return None  # stopped while waiting for input


def cmd_produce(args: argparse.Namespace) -> int:
    try:
        maker = RecordMaker(args.input, args.key.encode() if args.key is not None else None,
                            [parse_header(h) for h in args.header or []],
                            key_separator(args.key_separator))
    except ValueError as e:
        print_error("produce", "USAGE", str(e), as_json=args.json)
        return 2
    return trio.run(_produce, args, maker)


def key_separator(text: str | None) -> bytes | None:
    """--key-separator as bytes; `\\t` is a tab, for shells where typing one is awkward."""
    if text is None:
        return None
    return b"\t" if text == "\\t" else text.encode()


async def _produce(args: argparse.Namespace, maker: RecordMaker) -> int:
    report = _Report(args.json, args.topic is not None or args.partition is not None)
    interrupts = 0
    pending = [0, 0]  # records and bytes read but not yet answered
    freed = trio.Event()
    printed = trio.Event()
    last_read = 0
    send_ch, recv_ch = trio.open_memory_channel[list[_Item]](64)

    async with Client(args.servers, timeout=args.timeout, **client_options(args)) as client, \
            Producer(client, acks=args.acks, batch_bytes=args.batch_bytes,
                     linger=args.linger, timeout=args.timeout, topic=args.topic,
                     partition=args.partition) as producer:
        async with trio.open_nursery() as nursery:
            reading = _Reader(read_lines(sys.stdin.fileno()))

            async def printer() -> None:
                nonlocal freed
                async with recv_ch:
                    async for items in recv_ch:
                        for item in items:
                            delivery = item.delivery
                            if delivery is not None and not delivery.done.is_set():
                                report.flush(end_runs=False)  # show what is answered so far
                                await delivery.done.wait()
                            err = item.error or (delivery.error if delivery else None)
                            if err is None and delivery is not None:
                                report.ok(item, delivery.offset)
                            elif isinstance(err, RaftlogError):
                                report.fail(item, err)
                                if err.code == "UNAVAILABLE" and report.unreachable is None:
                                    report.unreachable = err
                                    reading.stop()  # nothing answers: stop reading stdin
                            elif err is not None:
                                raise err  # not a RaftlogError: a bug, let it show
                            pending[0] -= 1
                            pending[1] -= item.line.size
                        freed.set()
                        freed = trio.Event()
                        if recv_ch.statistics().current_buffer_used == 0:
                            # Caught up with the input; a run of failures is complete once
                            # nothing read is still waiting for its answer.
                            report.flush(end_runs=pending[0] == 0)
                        if report.stdout_gone:
                            reading.stop()  # nobody reads the offsets: stop, like `cat`
                report.flush()
                printed.set()

            async def on_interrupt(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
                nonlocal interrupts
                with trio.open_signal_receiver(signal.SIGINT) as signals:
                    task_status.started()
                    async for _ in signals:
                        interrupts += 1
                        reading.stop()  # first Ctrl-C: stop reading, finish what was sent
                        if interrupts > 1:  # second: stop waiting too
                            nursery.cancel_scope.cancel()

            await nursery.start(on_interrupt)
            nursery.start_soon(printer)
            async with send_ch:
                while (lines := await reading.next()) is not None:
                    while pending[0] > args.max_pending or pending[1] > MAX_PENDING_BYTES:
                        await freed.wait()
                    items = []
                    for line in lines:
                        item = _Item(line)
                        items.append(item)
                        pending[0] += 1
                        pending[1] += line.size
                        if line.data is None:
                            item.error = TooLargeError(
                                f"the line is over {line.size - 1:,} bytes, more than one "
                                f"record may hold; it was skipped")
                            continue
                        try:
                            record = maker.make(line.data)
                        except ValueError as e:
                            item.error = RaftlogError(str(e), code="BAD_INPUT")
                        else:
                            item.delivery = producer.submit(record)
                    # Stopping the reading never cuts this send short: a line handed to the
                    # producer is always reported.
                    await send_ch.send(items)
                    last_read = lines[-1].number
            await printed.wait()  # every line read has its answer
            nursery.cancel_scope.cancel()  # stop listening for Ctrl-C
        report.flush()
        if interrupts > 1:
            raise KeyboardInterrupt  # the producer drops what it had not sent yet
    if report.unreachable is not None:
        print_error("produce", "UNAVAILABLE", f"stopped reading the input after line "
                    f"{last_read}: no node is reachable", as_json=args.json, hint=False)
        return 1
    if interrupts:
        return 130
    if report.stdout_gone:
        return 128 + signal.SIGPIPE
    return 1 if report.failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "produce", help="send stdin lines as records as they arrive; prints their offsets",
        description="Send each stdin line as one record as soon as it is complete, and print "
                    "each line's offset as it is acknowledged, in input order. Lines are "
                    "bytes (split at \\n); failures go to stderr, one line per run of lines "
                    "that failed alike, and make the exit code 1.")
    servers_arg(p)
    p.add_argument("--acks", type=acks, default=None, choices=ACKS_CHOICES,
                   metavar="{quorum,leader,none}",
                   help="quorum (Kafka: all): flushed on a majority; leader (1): appended by "
                        "the leader; none (0): accepted (default quorum, or the profile's "
                        "acks)")
    p.set_defaults(acks_default=ACKS_DEFAULT)
    p.add_argument("--topic", default=None, metavar="TOPIC",
                   help="write to this topic (default: the topic `default`, partition 0); "
                        "records go to their key's partition, keyless ones to one partition "
                        "per batch")
    p.add_argument("--partition", type=non_negative_int, default=None, metavar="P",
                   help="write every record to partition P (of --topic, else of `default`)")
    p.add_argument("--key", default=None, help="the key of every record (UTF-8 text; with "
                                               "--topic it picks the partition)")
    p.add_argument("--key-separator", metavar="SEP", default=None,
                   help="each line is KEY SEP VALUE, split at the first SEP (e.g. ':' or "
                        "'\\t' for a tab); a line without SEP is not sent and is reported "
                        "like other failed lines (exit 1)")
    p.add_argument("--header", action="append", metavar="KEY=VALUE",
                   help="a header on every record (repeatable)")
    p.add_argument("--input", choices=["lines", "json"], default="lines",
                   help="lines: each line's bytes are the value (default); json: each line "
                        'is {"value"|"value_b64", "key"|"key_b64", "headers"} as '
                        "`consume --json` prints")
    json_flag(p, "one JSON object per input line, in input order: its partition, offset and "
                 "value, or its line number and error")
    p.add_argument("--batch-bytes", type=positive_int, default=1 << 20,
                   help="largest batch sent in one request (default 1 MiB)")
    p.add_argument("--max-pending", "--batch-records", dest="max_pending", type=positive_int,
                   default=10_000, help="records read but not yet acknowledged before reading "
                                        "pauses (default 10000)")
    p.add_argument("--linger", type=non_negative_float, default=0.0,
                   help="seconds a partial batch may wait for more lines (default 0: send as "
                        "soon as the previous batch is answered)")
    p.set_defaults(func=cmd_produce)


__all__ = ["cmd_produce", "register"]
