"""Incremental Spark reads through a subscription: each job reads what arrived since the last
successful one, exactly once when jobs succeed, the same range again when one fails.

    df = sparkio.read_subscription(spark, "h1:7101,h2:7102", "etl")
    df.write.parquet(out, mode="append")       # the job; if it raises, nothing is committed
    sparkio.commit(df)                         # only after the job succeeded

or with the plain reader:

    df = spark.read.format("raftlog").option("servers", s).option("subscription", "etl").load()
    ...job...
    sparkio.commit(servers=s, subscription="etl")

How: planning a read of subscription `etl` *pins* its range in the cluster (a `sub_pin` entry in
the log): [position, high watermark at the first plan + 1). The pin stays until a commit reaches
it, so every re-plan of the DataFrame (each action plans again) and every retry after a failed
job reads exactly that range; `commit` moves the position to the pin's end, and the next read
pins a new range from there. Records produced meanwhile wait for the next read. Both the pin
and the position are replicated with the log, so a fail-over between the read and the commit
changes nothing. `startingOffset` ("earliest", "latest" or an offset) places the subscription on
first use only; `endingOffset` does not combine with `subscription`.

Two jobs that read the same subscription concurrently would share one pin (and so one range):
give each job its own subscription.
"""

from __future__ import annotations

import weakref
from typing import Any

from raft.protocol.subscription_requests import SubRequest
from sparkio.security import ConnSecurity
from sparkio.staging import RaftlogError, Session, parse_servers

SPARK_CONSUMER = "spark"
_FIRST_USE = {"earliest": "start", "latest": "end", "start": "start", "end": "end"}

# id(DataFrame) -> (servers, subscription, pinned end, security) for DataFrames made by
# read_subscription.
_READS: dict[int, tuple[str, str, int, ConnSecurity]] = {}


def first_use_position(value: str | None) -> Any:
    """startingOffset -> the sub_pin `from` field: "start", "end" or an offset."""
    if value is None or str(value).strip() == "":
        return "start"
    v = str(value).strip().lower()
    if v in _FIRST_USE:
        return _FIRST_USE[v]
    try:
        offset = int(v)
    except ValueError:
        raise ValueError(f"startingOffset {value!r} is not an offset, 'earliest' or "
                         f"'latest'") from None
    if offset < 0:
        raise ValueError(f"startingOffset {offset} must be >= 0")
    return offset


def pin(session: Session, subscription: str, first_use: Any = "start") -> tuple[int, int]:
    """Pin (or find pinned) the range of the next read of `subscription`: (start, end)."""
    sub = session.call(SubRequest("sub_pin", subscription, consumer=SPARK_CONSUMER,
                                  initial=first_use))["subscription"]
    end = sub.get("pin_end")
    start = int(sub["position"])
    return start, int(end) if end is not None else start


def read_subscription(spark: Any, servers: str, subscription: str, *,
                      starting_offset: str | int | None = None, **options: Any) -> Any:
    """A DataFrame of `subscription`'s next range, which `commit(df)` commits. Extra options
    are passed to the reader (fetchBytes, numPartitions, requestTimeoutMs)."""
    first = first_use_position(None if starting_offset is None else str(starting_offset))
    security = ConnSecurity.from_options({k.lower(): str(v) for k, v in options.items()})
    session = Session(parse_servers(servers), float(options.get("requestTimeoutMs",
                                                                60_000)) / 1000,
                      security=security)
    try:
        _, end = pin(session, subscription, first)
    finally:
        session.close()
    reader = (spark.read.format("raftlog").option("servers", servers)
              .option("subscription", subscription))
    if starting_offset is not None:
        reader = reader.option("startingOffset", str(starting_offset))
    for key, value in options.items():
        reader = reader.option(key, str(value))
    df = reader.load()
    key = id(df)
    _READS[key] = (servers, subscription, end, security)
    try:
        weakref.finalize(df, _READS.pop, key, None)
    except TypeError:  # not weak-referenceable in this Spark build: keep the small entry
        pass
    return df


def commit(df: Any = None, *, servers: str | None = None, subscription: str | None = None,
           timeout_s: float = 60.0, **options: str) -> int:
    """Commit a successful incremental read: the subscription's position moves to the end of
    the range the read covered. Call it only after the job that consumed the DataFrame
    succeeded. Returns the new position.

    `commit(df)` for a DataFrame from read_subscription; `commit(servers=..., subscription=...)`
    commits the range pinned by the last planned read of that subscription (TLS and token
    as the reader's options: tlsCa=..., tlsCert=..., tlsKey=..., token=...)."""
    security = ConnSecurity.from_options({k.lower(): str(v) for k, v in options.items()})
    if df is not None:
        known = _READS.get(id(df))
        if known is None:
            raise ValueError("this DataFrame was not made by sparkio.read_subscription (or is a "
                             "DataFrame derived from it); pass that one, or "
                             "commit(servers=..., subscription=...)")
        servers, subscription, end, security = known
    elif servers is None or subscription is None:
        raise ValueError("commit needs the DataFrame from read_subscription, or servers and "
                         "subscription")
    else:
        end = None
    session = Session(parse_servers(servers), timeout_s, security=security)
    try:
        sub = session.call(SubRequest("sub_get", subscription))["subscription"]
        if end is None:
            pinned = sub.get("pin_end")
            if pinned is None:
                return int(sub["position"])  # nothing read since the last commit
            end = int(pinned)
        if int(sub["position"]) >= end:
            if int(sub["position"]) > end:
                raise RaftlogError("POSITION_BEHIND",
                                   f"subscription {subscription!r} is already at "
                                   f"{sub['position']}, past this read's end {end}: another "
                                   f"job read and committed it; give each job its own "
                                   f"subscription")
            return end  # committed already (a second commit of the same read)
        reply = session.call(SubRequest("sub_commit", subscription, consumer=SPARK_CONSUMER,
                                        position=end))
        return int(reply["subscription"]["position"])
    finally:
        session.close()


__all__ = ["commit", "first_use_position", "pin", "read_subscription"]
