"""`spark.read.format("raftlog")`: committed records as Arrow batches, split by offset range.

Planning asks the cluster for the log start and the consumer-visible high watermark (the last
stable offset: committed data of no open load). With `subscription`, the range is the one the
subscription pins for its next incremental read (sparkio/incremental.py). Each partition fetches its offset range and
yields one Arrow RecordBatch per fetch reply. Schema as Spark's Kafka source.

Topics (issue 26): with option `topic`, the read covers every partition of that topic: planning
asks the metadata for its partition count and each partition's leader for that partition's log
start and last stable offset, and gives every topic partition at least one Spark partition
(more for a large range, about one per 500,000 offsets), so Spark reads the topic's partitions
in parallel. Rows carry their `partition` (offsets are per partition). Without `topic`, the
default topic's partition 0, as before topics.

A committed batch that cannot be decoded as records (storage/records.py: written by a faulty
client, or before nodes validated payloads) fails the read with UndecodableBatchError, which
names its offsets and what to do; with option skipUndecodable=true it is logged (a warning on
the executor) and skipped, and the records after it are read as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from raft.protocol.load_requests import LoadStatus
from raft.protocol.requests import DEFAULT_TOPIC
from sparkio.security import ConnSecurity
from sparkio.staging import RaftlogError, Session, parse_servers, topic_partitions
from sparkio.incremental import first_use_position, pin
from storage.records import MalformedRecords, check_records, undecodable_message

log = logging.getLogger("sparkio.reader")

READ_SCHEMA = ("key binary, value binary, offset long, timestamp timestamp, "
               "headers array<struct<key: string, value: binary>>, partition int")
RANGE_PER_SPARK_PARTITION = 500_000
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class UndecodableBatchError(RaftlogError):
    """A committed batch in the range read is not valid records; `first_offset`/`last_offset`
    name it. Set option skipUndecodable=true to read past it."""

    def __init__(self, first: int, last: int, reason: str) -> None:
        super().__init__("UNDECODABLE_BATCH", undecodable_message(
            first, last, reason, f"The read stopped there: set option skipUndecodable=true "
                                 f"to skip its records and read on at offset {last + 1}"))
        self.first_offset, self.last_offset, self.reason = first, last, reason


@dataclass
class OffsetRange(InputPartition):
    start: int  # first offset to read
    end: int  # exclusive
    topic_partition: int = 0  # the topic's partition the offsets are of

    def __init__(self, start: int, end: int, topic_partition: int = 0) -> None:
        super().__init__((topic_partition, start, end))
        self.start, self.end, self.topic_partition = start, end, topic_partition


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


def split(start: int, end: int, parts: int, topic_partition: int = 0) -> list[OffsetRange]:
    if end <= start:
        return [OffsetRange(start, start, topic_partition)]
    parts = max(1, min(parts, end - start))
    step = -(-(end - start) // parts)
    return [OffsetRange(s, min(s + step, end), topic_partition)
            for s in range(start, end, step)]


def default_parts(start: int, end: int) -> int:
    return max(1, min(64, -(-(end - start) // RANGE_PER_SPARK_PARTITION)))


class RaftlogReader(DataSourceReader):
    def __init__(self, options: dict[str, str], arrow_tz: str) -> None:
        options = {k.lower(): v for k, v in options.items()}  # Spark options ignore case
        if "servers" not in options:
            raise ValueError("raftlog reader needs option servers='host:port,host:port,...'")
        self.servers = parse_servers(options["servers"])
        self.timeout_s = int(options.get("requesttimeoutms", 60_000)) / 1000
        self.fetch_bytes = int(options.get("fetchbytes", 4 << 20))
        self.skip_undecodable = options.get("skipundecodable", "false").lower() == "true"
        self.security = ConnSecurity.from_options(options)
        self.arrow_tz = arrow_tz
        self.topic = options.get("topic") or DEFAULT_TOPIC
        self.ranges: list[OffsetRange] | None = None
        if options.get("topic"):
            if options.get("subscription"):
                raise ValueError("option subscription reads the default topic for now; drop "
                                 "option topic, or read the topic by offsets")
            self.ranges = self._plan_topic(options)
            return
        session = Session(self.servers, self.timeout_s, security=self.security)
        try:
            info = session.call(LoadStatus())
        finally:
            session.close()
        log_start, hw = int(info["start_offset"]), int(info["high_watermark"])
        if options.get("subscription"):
            # An incremental read: the subscription's pinned range (sparkio/incremental.py).
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
        self.num_partitions = int(options.get("numpartitions",
                                              default_parts(self.start, self.end)))

    def _plan_topic(self, options: dict[str, str]) -> list[OffsetRange]:
        """Every partition of the topic: its range (startingOffset/endingOffset apply to each
        partition, clipped to its log), split into at least one Spark partition."""
        start_opt = _parse_offset(options.get("startingoffset"), {"earliest": None}) or 0
        end_opt = _parse_offset(options.get("endingoffset"), {"latest": None})
        session = Session(self.servers, self.timeout_s, security=self.security)
        try:
            count = topic_partitions(session, self.topic)
            bounds = []
            for tp in range(count):
                info = session.call(LoadStatus(topic=self.topic, topic_partition=tp))
                bounds.append((int(info["start_offset"]), int(info["high_watermark"])))
        finally:
            session.close()
        total = options.get("numpartitions")
        out: list[OffsetRange] = []
        for tp, (log_start, hw) in enumerate(bounds):
            start = max(start_opt, log_start)
            end = hw + 1 if end_opt is None else min(end_opt, hw + 1)
            parts = (max(1, int(total) // max(1, count)) if total
                     else default_parts(start, end))
            out += split(start, max(start, end), parts, tp)
        self.num_partitions = len(out)
        return out

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
        if self.ranges is not None:
            return list(self.ranges)
        return split(self.start, self.end, self.num_partitions)

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        start, end = partition.start, partition.end
        if end <= start:
            return
        tp = getattr(partition, "topic_partition", 0)
        where = {"topic": self.topic, "topic_partition": tp}
        session = Session(self.servers, self.timeout_s, security=self.security)
        try:
            offset = start
            deadline = time.monotonic() + self.timeout_s
            session.call(LoadStatus(**where))  # lands the connection on the leader
            while offset < end:
                try:
                    r = session.fetch(offset, self.fetch_bytes, max_wait_ms=200,
                                      topic=self.topic, partition=tp)
                except RaftlogError as e:
                    # A replica that lags the leader we planned against: go back to the leader.
                    err = e.reply.get("error") or {}
                    if e.code != "OFFSET_OUT_OF_RANGE" or offset < int(err.get("start_offset", 0)) \
                            or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
                    session.close()
                    session.call(LoadStatus(**where))
                    continue
                batches = r.get("batches") or []
                rb = to_arrow(batches, offset, end, self.arrow_tz, self.skip_undecodable, tp)
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


def to_arrow(batches: list[dict], lo: int, hi: int, arrow_tz: str,
             skip_undecodable: bool = False, partition: int = 0) -> pa.RecordBatch | None:
    """The records of fetched `batches` at offsets [lo, hi) as one Arrow batch (None if
    none). An undecodable batch raises UndecodableBatchError, or with `skip_undecodable` is
    logged and skipped."""
    keys, values, offsets, stamps, headers = [], [], [], [], []
    for b in batches:
        base, ts = int(b["base_offset"]), int(b["timestamp_ms"]) * 1000
        count = int(b.get("count") or 1)
        if base + count <= lo or base >= hi:
            continue
        try:  # the rule every node applies before appending (a walk, no copy)
            check_records(b["payload"], b.get("count"))
        except MalformedRecords as e:
            if not skip_undecodable:
                raise UndecodableBatchError(base, base + count - 1, e.reason) from None
            log.warning("%s", undecodable_message(base, base + count - 1, e.reason))
            continue
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
         pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz=arrow_tz)),
         pa.array(headers, _HEADERS), pa.array([partition] * len(offsets), pa.int32())],
        names=["key", "value", "offset", "timestamp", "headers", "partition"])
