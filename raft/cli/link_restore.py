"""`raftlog link create NAME --source ... --topic T --restore`: recreate topics this cluster
lost from another cluster's copy (a mirror of them, usually), under their own names, at the
same offsets, with their subscriptions; then make them writable again (docs/REPLICATION.md,
"Disaster recovery runbook"; seed 000's recovery of a location from the locations connected to
it).

Run against the cluster that lost the topics. Steps, each checked before the next:
1. Refuse a topic that exists here with records (say what to do); an empty leftover (the topic
   recreated empty) is deleted first, as the operator would.
2. Create a link NAME mirroring each topic under its own name (a mirror topic: read-only
   while restoring). Its pullers copy the other cluster's batches at their offsets, and the
   subscriptions with them.
3. Wait until every partition is caught up and committed here (the link's own lag).
4. Set each subscription of the other cluster's copy here at its position there (capped at
   what is committed here, as the pullers do), so nothing depends on the pullers' next round.
5. `topic promote` each topic (writes continue at the next offset) and delete the link.
With `--no-wait` it stops after step 2 (promote later by hand).

The other cluster's mirror of the lost topic keeps its link to this cluster: its pullers stop
(`source_behind`) while the topic here is gone or shorter than the mirror, never copy another
history (`diverged` if the topic here was written again), and follow the restored topic again
once it holds the mirror's last batch (paused there first in the runbook: resume it after).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from raft.client import Client
from raft.client.errors import OffsetOutOfRangeError, RaftlogError
from raft.client.metadata import Metadata, TopicInfo
from raft.protocol.link_requests import LinkAlter, LinkCreate, TopicPromote

POLL_S = 0.2  # the CLI's look at the link's progress (a pause between polls, not a sync)
LINK_PREFIX = "__link."
MAX_LEFTOVER_READS = 1_000  # fetches per partition to find a record in an "empty" leftover

Describe = Callable[[Client, str, float], Awaitable[dict[str, Any] | None]]


def _fail(message: str) -> int:
    print(f"raftlog link: {message}", file=sys.stderr)
    return 1


async def leftover_records(sink: Client, topic: str, partitions: int) -> str | None:
    """Where the first record of `topic` here is ("partition P offset O"), None if it holds
    none (every partition read from its log start to its high watermark)."""
    for p in range(partitions):
        offset = 0
        for _ in range(MAX_LEFTOVER_READS):
            try:
                res = await sink.fetch(offset, max_bytes=1 << 16, topic=topic, partition=p)
            except OffsetOutOfRangeError as e:
                if e.start_offset is None or int(e.start_offset) <= offset:
                    break  # past the end (a partition emptied meanwhile)
                offset = int(e.start_offset)
                continue
            if res.records or res.undecodable:
                first = res.records[0].offset if res.records else res.undecodable[0].base_offset
                return f"partition {p} offset {first}"
            if res.next_offset > res.high_watermark or res.next_offset <= offset:
                break
            offset = res.next_offset
        else:
            return f"partition {p} (not read to its end)"
    return None


async def _leftover_refusal(sink: Client, info: TopicInfo) -> str | None:
    """Why topic `info` here must not be replaced by the restore, or None (empty)."""
    name = info.name
    if info.origin is not None and info.mirror_active:
        return (f"topic {name!r} here is an active mirror (link "
                f"{info.origin.get('link')!r}); delete that link and the topic first, or "
                f"promote it, then run this again")
    where = await leftover_records(sink, name, info.partition_count)
    if where is None:
        return None
    return (f"topic {name!r} exists here and holds records ({where}); --restore recreates it "
            f"from the other cluster at the same offsets, so it must not hold data. If these "
            f"records are leftovers of the lost data, delete the topic (`raftlog topic delete "
            f"{name}`) and run this again; if they matter, copy them first (e.g. to another "
            f"topic) and then delete it")


async def caught_up(sink: Client, describe: Describe, name: str, timeout: float,
                    topics: list[str]) -> tuple[bool, list[dict[str, Any]]]:
    """Whether every partition of link `name` is caught up with its source and committed
    here (the mirrored offset is the topic's high watermark here), and the link's rows."""
    desc = await describe(sink, name, timeout)
    rows = desc["partitions"] if desc else []
    if not rows:
        return False, rows
    committed: dict[tuple[str, int], int | None] = {}
    for topic in topics:
        described = await sink.describe_topic(topic)
        for row in described["partitions"]:
            committed[(topic, row["partition"])] = row.get("high_watermark")
    done = all(r["state"] == "caught_up" and r["lag_records"] == 0 and
               r["mirrored_offset"] is not None and
               committed.get((r["topic"], r["partition"])) == r["mirrored_offset"]
               for r in rows)
    return done, rows


async def copy_subscriptions(source: Client, sink: Client, topic: str,
                             partitions: int) -> dict[int, dict[str, int]]:
    """Set every subscription of the source's `topic` here at its position there (capped at
    the high watermark + 1 here: never ahead of the data); per partition {name: position}."""
    out: dict[int, dict[str, int]] = {}
    for p in range(partitions):
        rows = await source.subscriptions(topic=topic, partition=p)
        try:
            hw = (await sink.fetch(0, max_bytes=1, topic=topic, partition=p)).high_watermark
        except OffsetOutOfRangeError as e:
            hw = int(e.high_watermark if e.high_watermark is not None else -1)
        have = {r["name"]: int(r["position"])
                for r in await sink.subscriptions(topic=topic, partition=p)}
        out[p] = {}
        for row in rows:
            name = str(row["name"])
            if name.startswith(LINK_PREFIX):
                continue
            position = min(int(row["position"]), hw + 1)
            if have.get(name) != position:
                await sink.subscription_reset(name, position, topic=topic, partition=p)
            out[p][name] = position
    return out


def _next_steps(src_meta: Metadata, topics: list[str], here: str,
                cluster_id: str | None) -> list[str]:
    """What to run on the other cluster (its copy of each topic)."""
    out = []
    for topic in topics:
        info = src_meta.topics[topic]
        o = info.origin
        if o is not None and info.mirror_active and o.get("source_cluster_id") == cluster_id:
            out.append(f"{topic}: its mirror there (link {o.get('link')!r}) follows this "
                       f"cluster again: if you paused that link, run `raftlog link resume "
                       f"{o.get('link')}` there")
        elif o is not None and info.mirror_active:
            out.append(f"{topic}: it is a mirror there of cluster {o.get('source_cluster_id')}"
                       f" (link {o.get('link')!r}); if that was this cluster before it was "
                       f"rebuilt at the same addresses, `raftlog link resume {o.get('link')}` "
                       f"there makes it follow this cluster (its pullers first check that "
                       f"{topic} here holds their last batch); else the copy here is "
                       f"independent of it now")
        else:
            out.append(f"{topic}: it is writable there too; stop writing it there, and to keep "
                       f"a copy there delete it there and link it from here: `raftlog link "
                       f"create NAME --source {here} --topic {topic}` run there")
    return out


async def restore(args: argparse.Namespace, source: Client, sink: Client, src_meta: Metadata,
                  sink_meta: Metadata, ca_pem: str, describe: Describe) -> int:
    """The whole of `link create --restore` (the module docstring's steps). Progress lines go
    to stdout, or to stderr with --json (stdout is then one JSON object)."""
    out = sys.stderr if args.json else sys.stdout
    if args.prefix:
        return _fail("--restore recreates each topic under its own name (offsets and "
                     "subscriptions with it); drop --prefix")
    mirrors: list[tuple[str, str, int]] = []
    leftovers: list[str] = []
    for topic in dict.fromkeys(args.topic):
        info = src_meta.topics.get(topic)
        if info is None:
            return _fail(f"the source has no topic {topic!r} (its topics: "
                         f"{', '.join(sorted(src_meta.topics)) or 'none'}); restore from the "
                         f"cluster that holds its copy")
        here = sink_meta.topics.get(topic)
        if here is not None:
            why = await _leftover_refusal(sink, here)
            if why is not None:
                return _fail(why)
            leftovers.append(topic)
        mirrors.append((topic, topic, info.partition_count))
    for topic in leftovers:
        await sink.delete_topic(topic)
        print(f"deleted the empty topic {topic!r} here, to recreate it from the other cluster",
              file=out)
    replicas = args.replicas or min(3, max(1, len(sink_meta.nodes)))
    await sink.call(LinkCreate(args.name, list(args.source), src_meta.cluster_id or "", mirrors,
                               replicas, ca_pem, args.source_token or "",
                               int(args.timeout * 1000)), timeout=args.timeout)
    topics = [m[0] for m in mirrors]
    print(f"restoring {', '.join(topics)} from cluster {src_meta.cluster_id} (link "
          f"{args.name}): read-only here until restored", file=out)
    if args.no_wait:
        print(f"watch `raftlog link describe {args.name}`; when every partition is caught_up, "
              f"run `raftlog topic promote TOPIC` for each topic and `raftlog link delete "
              f"{args.name}`", file=out)
        return 0
    deadline = trio.current_time() + args.restore_timeout
    while True:
        try:
            done, rows = await caught_up(sink, describe, args.name, args.timeout, topics)
        except RaftlogError:
            done, rows = False, []  # a new topic's leaders being elected: look again
        if done:
            break
        if trio.current_time() >= deadline:
            behind = [f"{r['topic']}[{r['partition']}] {r['state']} at {r['mirrored_offset']} "
                      f"of {r['source_high_watermark']}" for r in rows
                      if r["state"] != "caught_up" or r["lag_records"]]
            return _fail(f"not restored after {args.restore_timeout:g} s ({'; '.join(behind)}"
                         f"); the link {args.name} goes on: watch `raftlog link describe "
                         f"{args.name}`, then promote each topic and delete the link")
        await trio.sleep(POLL_S)
    subs = {t: await copy_subscriptions(source, sink, t, n) for t, _, n in mirrors}
    for topic in topics:
        await sink.call(TopicPromote(topic, int(args.timeout * 1000)), timeout=args.timeout)
    await sink.call(LinkAlter(args.name, "delete", int(args.timeout * 1000)),
                    timeout=args.timeout)
    restored = {t: {r["partition"]: {"high_watermark": r["mirrored_offset"],
                                     "offsets_lost": r["offsets_lost"]}
                    for r in rows if r["topic"] == t} for t in topics}
    here = args.servers if isinstance(args.servers, str) else "THIS-CLUSTER:PORT"
    steps = _next_steps(src_meta, topics, here, sink_meta.cluster_id)
    if args.json:
        print(json.dumps({"restored": restored, "subscriptions": subs, "next": steps},
                         indent=2, sort_keys=True))
        return 0
    for t in topics:
        parts = ", ".join(f"{p}: up to {v['high_watermark']}" +
                          (f" ({v['offsets_lost']} offsets lost)" if v["offsets_lost"] else "")
                          for p, v in sorted(restored[t].items()))
        n = sum(len(s) for s in subs[t].values())
        print(f"restored {t} (partitions {parts}) with {n} subscription positions; it is "
              f"writable here again, produces continuing at the next offsets")
    print("On the other cluster:\n  " + "\n  ".join(steps))
    return 0


__all__ = ["caught_up", "copy_subscriptions", "leftover_records", "restore"]
