"""`spark.read.format("raftlog")`: committed records as Arrow batches, split by offset range.

Planning asks the cluster for the log start and the consumer-visible high watermark (the last
stable offset: committed data of no open load). With `subscription`, the range is the one the
subscription pins for its next incremental read (sparkio/subscriptions.py). Each partition fetches its offset range and
yields one Arrow RecordBatch per fetch reply. Schema as Spark's Kafka source.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sparkio.security import ConnSecurity
from sparkio.staging import RaftlogError, Session, parse_servers
from sparkio.subscriptions import first_use_position, pin

READ_SCHEMA = ("key binary, value binary, offset long, timestamp timestamp, "
               "headers array<struct<key: string, value: binary>>")
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@dataclass
class OffsetRange(InputPartition):
    start: int  # first offset to read
    end: int  # exclusive

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end


def _parse_offset(value: str | None, names: dict[str, int | None]) -> int | None:
    if value is None or value == "":
        return None
    v = str(value).strip().lower()
    if v in names:
        return names[v]
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"offset {value!r} is not an integer or one of {sorted(names)}") from None


def split(start: int, end: int, parts: int) -> list[OffsetRange]:
    if end <= start:
        return [OffsetRange(start, start)]
    parts = max(1, min(parts, end - start))
    step = -(-(end - start) // parts)
    return [OffsetRange(s, min(s + step, end)) for s in range(start, end, step)]


class RaftlogReader(DataSourceReader):
    def __init__(self, options: dict[str, str], arrow_tz: str) -> None:
        options = {k.lower(): v for k, v in options.items()}  # Spark options ignore case
        if "servers" not in options:
            raise ValueError("raftlog reader needs option servers='host:port,host:port,...'")
        self.servers = parse_servers(options["servers"])
        self.timeout_s = int(options.get("requesttimeoutms", 60_000)) / 1000
        self.fetch_bytes = int(options.get("fetchbytes", 4 << 20))
        self.security = ConnSecurity.from_options(options)
        self.arrow_tz = arrow_tz
        session = Session(self.servers, self.timeout_s, security=self.security)
        try:
            info = session.call({"t": "load_status"})
        finally:
            session.close()
        log_start, hw = int(info["start_offset"]), int(info["high_watermark"])
        if options.get("subscription"):
            # An incremental read: the subscription's pinned range (sparkio/subscriptions.py).
            start, end = self._subscription_range(options)
            if start < log_start and options.get("failondataloss", "true").lower() != "false":
                raise ValueError(
                    f"subscription {options['subscription']!r} is at offset {start} but "
                    f"retention removed everything below {log_start}: those records are "
                    f"lost to it. Set option failOnDataLoss=false to read on from {log_start}, "
                    f"or reset the subscription (raftlog subscriptions reset)")
        else:
            start = _parse_offset(options.get("startingoffset"), {"earliest": None}) or 0
            end = _parse_offset(options.get("endingoffset"), {"latest": None})
        self.start = max(start, log_start)
        self.end = hw + 1 if end is None else min(end, hw + 1)
        if options.get("subscription"):
            # Never clipped: committing the pin must mean its whole range was read (a leader
            # just elected may not show all of it yet; the partition read waits for it).
            self.end = max(self.start, end)
        default_parts = max(1, min(64, -(-(self.end - self.start) // 500_000)))
        self.num_partitions = int(options.get("numpartitions", default_parts))

    def _subscription_range(self, options: dict[str, str]) -> tuple[int, int]:
        if options.get("endingoffset"):
            raise ValueError("endingOffset does not combine with subscription: a subscription "
                             "read ends where its pin does (see docs/SUBSCRIPTIONS.md)")
        first = first_use_position(options.get("startingoffset"))
        session = Session(self.servers, self.timeout_s, security=self.security)
        try:
            return pin(session, options["subscription"], first)
        finally:
            session.close()

    def partitions(self) -> list[OffsetRange]:
        return split(self.start, self.end, self.num_partitions)

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        start, end = partition.start, partition.end
        if end <= start:
            return
        session = Session(self.servers, self.timeout_s, security=self.security)
        try:
            offset = start
            deadline = time.monotonic() + self.timeout_s
            session.call({"t": "load_status"})  # lands the connection on the leader
            while offset < end:
                try:
                    r = session.fetch(offset, self.fetch_bytes, max_wait_ms=200)
                except RaftlogError as e:
                    # A replica that lags the leader we planned against: go back to the leader.
                    err = e.reply.get("error") or {}
                    if e.code != "OFFSET_OUT_OF_RANGE" or offset < int(err.get("start_offset", 0)) \
                            or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
                    session.close()
                    session.call({"t": "load_status"})
                    continue
                batches = r.get("batches") or []
                rb = self._to_arrow(batches, offset, end)
                if rb is not None and rb.num_rows:
                    yield rb
                nxt = int(r.get("next_offset", offset))
                if nxt > offset:
                    offset = nxt
                    deadline = time.monotonic() + self.timeout_s
                elif time.monotonic() > deadline:
                    raise TimeoutError(f"offset {offset} did not become readable within "
                                       f"{self.timeout_s:.0f}s (high watermark "
                                       f"{r.get('high_watermark')}); is the cluster healthy?")
        finally:
            session.close()

    def _to_arrow(self, batches: list[dict], lo: int, hi: int) -> pa.RecordBatch | None:
        keys, values, offsets, stamps, headers = [], [], [], [], []
        for b in batches:
            base, ts = int(b["base_offset"]), int(b["timestamp_ms"]) * 1000
            recs = msgpack.unpackb(b["payload"], raw=False)
            for i, (k, v, h) in enumerate(recs):
                off = base + i
                if off < lo or off >= hi:
                    continue
                keys.append(k)
                values.append(v)
                offsets.append(off)
                stamps.append(ts)
                headers.append([{"key": hk, "value": hv} for hk, hv in h] if h else None)
        if not offsets:
            return None
        return pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
             pa.array(offsets, pa.int64()),
             pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz=self.arrow_tz)),
             pa.array(headers, _HEADERS)],
            names=["key", "value", "offset", "timestamp", "headers"])
