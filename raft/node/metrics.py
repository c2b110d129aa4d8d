"""Prometheus metrics for one node (`--metrics-listen HOST:PORT` serves them at /metrics).

Two kinds, read in two ways:
- events (requests, flushes, elections, connections) are counted where they happen, on the trio
  thread, into prometheus_client counters and histograms (thread safe, a lock per update);
- state (role, term, offsets, follower lag, links) is read when scraped: prometheus_client's
  HTTP server runs in its own thread, which hands one short function to the trio loop
  (trio.from_thread.run_sync) that builds the same map `status` answers with. The loop is never
  blocked by the HTTP server, the state is read on the thread that owns it, and the figures
  agree with `raftlog status --json` by construction.

Each node has its own registry (in-process tests run several nodes in one process). Names follow
Prometheus conventions: `raftlog_` prefix, `_total` for counters, `_seconds` and `_bytes` units.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import trio
from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from raft.controller.state import shard_address
from raft.node.config import ConfigError, format_address, parse_address
from raft.core.types import Role

log = logging.getLogger("raftlog.node")

LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                   2.0, 5.0, 10.0)
RECORDS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 50_000,
                   200_000)
# Per-subscription series are bounded: a cluster may hold 100,000 subscriptions, a scrape must
# not. The ones furthest behind are exported (those are the ones to watch);
# raftlog_subscription_series_left_out says how many were not.
SUBSCRIPTION_SERIES_MAX = 100
# Per-partition series (issue 26 item 10) are bounded too: a node may run thousands of
# partitions. At most this many partitions get series (those it leads first, the furthest behind
# first); raftlog_partition_series_left_out counts the rest. Computed at scrape time only.
PARTITION_SERIES_MAX = 1000
ROLES = tuple(r.value for r in Role)


class NodeMetrics:
    """The node's registry, its event hooks (called on the trio thread) and its HTTP server."""

    def __init__(self) -> None:
        # No `_created` series beside every counter: they double the scrape for a timestamp
        # that a process start time already gives.
        disable_created_metrics()
        reg = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("raftlog_requests", "Client requests answered, by type and "
                                "outcome (OK or the error code)", ["type", "code"], registry=reg)
        self.produce_requests = Counter("raftlog_produce_requests", "Produce requests answered, "
                                        "by ack level and outcome", ["acks", "code"],
                                        registry=reg)
        self.produce_latency = Histogram("raftlog_produce_latency_seconds", "Produce request "
                                         "latency on the node (receipt to answer), by ack level",
                                         ["acks"], buckets=LATENCY_BUCKETS, registry=reg)
        self.fetch_bytes = Counter("raftlog_fetch_bytes", "Record payload bytes served by fetch",
                                   registry=reg)
        self.errors = Counter("raftlog_errors", "Error answers and error frames sent, by code",
                              ["code"], registry=reg)
        self.fsync_latency = Histogram("raftlog_fsync_latency_seconds", "Duration of one log "
                                       "flush (write and fsync)", buckets=LATENCY_BUCKETS,
                                       registry=reg)
        self.fsyncs = Counter("raftlog_fsyncs", "Fsynced storage commits of this node: one per "
                              "flush of any number of groups' logs (group commit across "
                              "groups), metadata save or log cut", registry=reg)
        self.flush_records = Histogram("raftlog_flush_batch_records", "Records made durable by "
                                       "one flush (group commit size)", buckets=RECORDS_BUCKETS,
                                       registry=reg)
        self.loop_lag = Histogram("raftlog_event_loop_lag_seconds", "How late the trio loop "
                                  "ran a timer (a blocked loop delays every request); "
                                  "fed by the node's one loop-lag probe (raft.node.looplag)",
                                  buckets=LATENCY_BUCKETS, registry=reg)
        self.elections_started = Counter("raftlog_elections_started", "Elections this node "
                                         "started (it became a candidate in a new term)",
                                         registry=reg)
        self.elections_won = Counter("raftlog_elections_won", "Elections this node won",
                                     registry=reg)
        self.leader_changes = Counter("raftlog_leader_changes", "Times this node saw a "
                                      "different leader", registry=reg)
        self.connections = Gauge("raftlog_open_connections", "Open connections, by kind "
                                 "(client, peer, or handshake before the hello)", ["kind"],
                                 registry=reg)
        self.tls_failures = Counter("raftlog_tls_handshake_failures", "Incoming TLS "
                                    "handshakes that failed (untrusted or missing certificate, "
                                    "bad input)", registry=reg)
        self.plaintext_refused = Counter("raftlog_plaintext_refused", "Plaintext connections "
                                         "refused by a TLS node", registry=reg)
        self.auth_failures = Counter("raftlog_auth_failures", "Client hellos refused as "
                                     "UNAUTHENTICATED", registry=reg)
        self.unknown_group_messages = Counter(
            "raftlog_peer_messages_unknown_group", "Raft messages from a peer for a group this "
            "node does not run (dropped: the group is not created here yet, or was removed)",
            ["peer"], registry=reg)
        for kind in ("client", "peer", "handshake"):
            self.connections.labels(kind)
        self.partition_series_max = PARTITION_SERIES_MAX  # the cap (tests lower it)
        self.shard, self.shards = 0, 1  # which shard process of its node (shard_info)
        self._produce = {}  # acks -> (latency child) cached: label lookups take a lock
        self._requests: dict[tuple[str, str], Any] = {}  # (type, code) -> counter child
        self._produce_requests: dict[tuple[str, str], Any] = {}  # (acks, code) -> child
        self._state: Callable[[], dict[str, Any] | None] = lambda: None
        self._token: trio.lowlevel.TrioToken | None = None
        self._campaign_term = 0
        self._last_leader: int | None = None
        self._last_role: Role | None = None
        self._httpd: Any = None
        reg.register(_StateCollector(self))
        try:
            ProcessCollector(registry=reg)  # CPU, memory, open files (Linux /proc)
        except Exception:  # no /proc: skip process metrics
            pass

    def shard_info(self, shard: int, shards: int) -> None:
        """`raftlog_shard_info{shard, shards} 1`: which shard process of its node this is
        With K > 1 every series gets a `shard` label and shard 0's address serves the node's
        (every shard's series and the totals: raft.node.shard_metrics, docs/SHARDS.md)."""
        self.shard, self.shards = shard, shards
        Gauge("raftlog_shard_info", "Which shard process of its node this is (1 per process)",
              ["shard", "shards"], registry=self.registry).labels(str(shard), str(shards)).set(1)

    def unknown_group(self, peer: int, count: int) -> None:
        """`count` messages from `peer` were for a group this node does not run."""
        self.unknown_group_messages.labels(str(peer)).inc(count)

    # -- wiring (the node) -----------------------------------------------------------------------
    def bind(self, state: Callable[[], dict[str, Any] | None]) -> None:
        """`state()` is called on the trio thread at scrape time and returns the status map."""
        self._state = state
        self._token = trio.lowlevel.current_trio_token()

    def snapshot(self) -> dict[str, Any] | None:
        """The node's state for a scrape, read on the trio thread (from any thread)."""
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            return self._state()  # already on the trio thread (tests)
        if self._token is None:
            return None
        try:
            return trio.from_thread.run_sync(self._state, trio_token=self._token)
        except (trio.RunFinishedError, trio.Cancelled):
            return None

    # -- events (trio thread) ----------------------------------------------------------------------
    def request_done(self, t: str, reply: dict[str, Any], started: float,
                     acks: str | None) -> None:
        code = "OK" if reply.get("ok") else str((reply.get("error") or {}).get("code", "?"))
        # Labelled children cached: labels() costs several microseconds a call, and this runs
        # for every request (issue 28: per-write cost).
        key = (t, code)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self.requests.labels(t, code)
        counter.inc()
        if code != "OK":
            self.errors.labels(code).inc()
        if t == "produce" and acks is not None:
            child = self._produce.get(acks)
            if child is None:
                child = self._produce[acks] = self.produce_latency.labels(acks)
            child.observe(time.perf_counter() - started)
            key = (acks, code)
            counter = self._produce_requests.get(key)
            if counter is None:
                counter = self._produce_requests[key] = self.produce_requests.labels(acks, code)
            counter.inc()
        elif t == "fetch" and code == "OK":
            n = sum(len(b.get("payload", b"")) for b in reply.get("batches", ()))
            if n:
                self.fetch_bytes.inc(n)

    def count_error(self, code: str) -> None:
        """An error answer or error frame that did not go through request_done."""
        self.errors.labels(code).inc()

    def flush_done(self, seconds: float, records: int) -> None:
        self.fsync_latency.observe(seconds)
        if records > 0:
            self.flush_records.observe(records)

    def observe_state(self, node_id: int, role: Role, term: int, leader_id: int | None,
                      voted_for: int | None) -> None:
        """After a role/term/leader change: count elections started and won, leader changes."""
        if voted_for == node_id and term > self._campaign_term and role in (Role.CANDIDATE,
                                                                            Role.LEADER):
            self._campaign_term = term  # a vote for ourselves in a new term: we campaigned
            self.elections_started.inc()
        if role == Role.LEADER and self._last_role != Role.LEADER:
            self.elections_won.inc()
        if leader_id is not None and leader_id != self._last_leader:
            self._last_leader = leader_id
            self.leader_changes.inc()
        self._last_role = role

    # -- HTTP ------------------------------------------------------------------------------------
    def start_http(self, address: str) -> str:
        """Serve /metrics on `address` in prometheus_client's own thread; the bound address."""
        from prometheus_client import start_http_server

        host, port = parse_address(address, what="metrics_listen address")
        registry = self.registry
        if self.shards > 1:  # every series labelled by shard; shard 0 serves the node's
            # Imported here: a one-shard node's start-up skips its scrape machinery
            # (prometheus_client.parser, urllib.request; docs/PERFORMANCE.md "start28").
            from raft.node.shard_metrics import shard_registry

            others = ({k: shard_address(address, k) for k in range(1, self.shards)}
                      if self.shard == 0 and port else {})
            registry = shard_registry(self.registry, self.shard, others)
        try:
            self._httpd, _thread = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise ConfigError(f"cannot serve metrics on {address}: {e.strerror or e}; pick a "
                              f"free --metrics-listen address") from None
        return format_address(host, self._httpd.server_port)

    async def stop_http(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            # shutdown() waits for the serving loop to notice (up to its poll interval).
            await trio.to_thread.run_sync(httpd.shutdown)
            httpd.server_close()


class _StateCollector:
    """Gauges read from the node's state at scrape time (see the module docstring)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        st = self._metrics.snapshot()
        if not st:
            return
        yield from state_families(st)


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    g = GaugeMetricFamily(name, doc, labels=list(labels) if labels else None)
    g.add_metric(list(labels.values()) if labels else [], value)
    return g


def state_families(st: dict[str, Any]) -> Iterator[Metric]:
    """The status map (raft.node.api.admin.status_map plus `disk_full`) as metric families."""
    role = GaugeMetricFamily("raftlog_role", "1 for the node's current Raft role", labels=["role"])
    for r in ROLES:
        role.add_metric([r], 1.0 if st.get("role") == r else 0.0)
    yield role
    yield _gauge("raftlog_term", "Current Raft term", st.get("term", 0))
    yield _gauge("raftlog_leader_id", "The leader this node knows (0: none)",
                 st.get("leader_id") or 0)
    for key, doc in (("dirty_offset", "Last offset appended to the log (may be unflushed)"),
                     ("flushed_offset", "Last offset fsynced to the log"),
                     ("commit_index", "Raft commit index: majority-flushed offset"),
                     ("high_watermark", "Last offset consumers may read"),
                     ("start_offset", "First offset the log still holds")):
        yield _gauge(f"raftlog_{key}", doc, st.get(key, -1))
    yield _gauge("raftlog_voters", "Voters in the configuration", len(st.get("voters") or ()))
    yield _gauge("raftlog_learners", "Learners in the configuration",
                 len(st.get("learners") or ()))
    yield _gauge("raftlog_disk_full", "1 while the disk is full (writes refused)",
                 1.0 if st.get("disk_full") else 0.0)
    loop = st.get("loop_lag") or {}  # raft.node.looplag: the status figure, windowed
    for key, doc in (("max_ms", "Largest event-loop lag over the last window (status "
                                "loop_lag.max_ms)"),
                     ("p99_ms", "p99 event-loop lag over the last window (status "
                                "loop_lag.p99_ms)")):
        yield _gauge(f"raftlog_event_loop_lag_window_{key[:-3]}_seconds", doc,
                     loop.get(key, 0.0) / 1000)
    # Disk loss and corruption (docs/DISK-LOSS.md).
    yield _gauge("raftlog_member_in_good_standing", "0 while the node may not vote or count "
                 "(it lost its disk and is being re-added, or is checking the cluster is new)",
                 1.0 if st.get("standing", "member") == "member" else 0.0)
    yield _gauge("raftlog_damaged_batches", "Damaged batches held (not served, being fetched "
                 "again)", len(st.get("damaged") or ()))
    scrub = st.get("scrub") or {}
    found = CounterMetricFamily("raftlog_scrub_damaged_batches", "Damaged batches the "
                                "background scrubber found")
    found.add_metric([], scrub.get("found", 0))
    yield found
    read = CounterMetricFamily("raftlog_scrub_read_bytes", "Bytes the background scrubber "
                               "re-read and checked")
    read.add_metric([], scrub.get("bytes_read", 0))
    yield read
    groups = st.get("groups") or {}  # raft.node.registry: quiescence (raft/core/quiesce.py)
    yield _gauge("raftlog_groups", "Raft groups this node runs", groups.get("count", 0))
    yield _gauge("raftlog_groups_quiesced", "Groups quiesced now: no ticks, no heartbeats "
                 "until an input wakes them", groups.get("quiesced", 0))
    yield _gauge("raftlog_groups_awake", "Groups the node's ticker visits (not found "
                 "quiesced since their last input)", groups.get("awake", 0))
    yield from _retention_families(st)
    yield from _partition_families(st.get("partition_series"))
    yield from _follower_families(st)
    yield from _link_families(st.get("links") or {})
    yield from _mirror_families(st.get("mirror_pullers") or [])


def _retention_families(st: dict[str, Any]) -> Iterator[Metric]:
    """Retention (docs/RETENTION.md) and subscriptions (docs/SUBSCRIPTIONS.md)."""
    ret = st.get("retention") or {}
    yield _gauge("raftlog_retained_bytes", "Encoded bytes of the batches the log holds (what "
                 "retention by size counts)", st.get("retained_bytes", 0))
    yield _gauge("raftlog_retention_held", "1 while a holder (a member, a load, a "
                 "subscription, a damaged batch) keeps retention from deleting what the policy "
                 "wants gone; `raftlog status` names it", 1.0 if ret.get("held_by") else 0.0)
    for key, doc in (("deleted_bytes", "Bytes retention deleted since the node started"),
                     ("deleted_batches", "Batches retention deleted since the node started")):
        fam = CounterMetricFamily(f"raftlog_retention_{key}", doc)
        fam.add_metric([], ret.get(key, 0))
        yield fam
    subs = st.get("subscriptions") or {}
    yield _gauge("raftlog_subscriptions", "Subscriptions in the replicated table",
                 subs.get("subscriptions", 0))
    yield from _subscription_families(st.get("subscription_lag"))


def _subscription_families(lag: dict[str, Any] | None) -> Iterator[Metric]:
    """Per-subscription lag and skips, for at most SUBSCRIPTION_SERIES_MAX subscriptions (those
    furthest behind), and totals over all of them."""
    if lag is None:
        return
    offsets = GaugeMetricFamily("raftlog_subscription_lag_offsets", "High watermark + 1 minus "
                                "the subscription's committed position (the "
                                f"{SUBSCRIPTION_SERIES_MAX} furthest behind)",
                                labels=["subscription"])
    records = GaugeMetricFamily("raftlog_subscription_lag_records", "Records between the "
                                "subscription's position and the high watermark (the "
                                f"{SUBSCRIPTION_SERIES_MAX} furthest behind)",
                                labels=["subscription"])
    skipped = CounterMetricFamily("raftlog_subscription_skipped_offsets", "Offsets resets "
                                  "forward passed over, by subscription (records it never "
                                  "read: retention removed them, or an operator moved it)",
                                  labels=["subscription"])
    for s in lag.get("series", ()):
        offsets.add_metric([s["name"]], s["lag_offsets"])
        records.add_metric([s["name"]], s["lag_records"])
        skipped.add_metric([s["name"]], s["skipped_offsets"])
    yield offsets
    yield records
    yield skipped
    yield _gauge("raftlog_subscription_series_left_out", "Subscriptions without lag series "
                 f"(only the {SUBSCRIPTION_SERIES_MAX} furthest behind are exported)",
                 lag.get("left_out", 0))
    for key, doc in (("skipped_offsets", "Offsets passed over by subscription resets forward, "
                                         "over every subscription (the replicated table's "
                                         "count)"),
                     ("resets", "Subscription resets applied, over every subscription")):
        fam = CounterMetricFamily(f"raftlog_subscriptions_{key}", doc)
        fam.add_metric([], lag.get(key, 0))
        yield fam


def _mirror_families(pullers: list[dict[str, Any]]) -> Iterator[Metric]:
    """Cross-cluster link lag, one series per mirror partition this node pulls (it leads it;
    docs/REPLICATION.md)."""
    labels = ["link", "topic", "partition"]
    records = GaugeMetricFamily("raftlog_link_lag_records", "Source high watermark minus the "
                                "mirror's last mirrored offset", labels=labels)
    seconds = GaugeMetricFamily("raftlog_link_lag_seconds", "How long the mirror has been "
                                "behind its source (0 when caught up)", labels=labels)
    boots = GaugeMetricFamily("raftlog_link_bootstraps", "Bootstraps of the mirror partition "
                              "(the source had deleted past its position; the link's "
                              "replicated count)", labels=labels)
    lost = GaugeMetricFamily("raftlog_link_offsets_lost", "Source offsets the mirror partition "
                             "skipped in its bootstraps (gaps, never hidden)", labels=labels)
    for p in pullers:
        key = [p["link"], p["topic"], str(p["partition"])]
        records.add_metric(key, p["lag_records"])
        seconds.add_metric(key, p["lag_seconds"])
        boots.add_metric(key, p.get("bootstraps", 0))
        lost.add_metric(key, p.get("offsets_lost", 0))
    yield from (records, seconds, boots, lost)


def _partition_families(parts: dict[str, Any] | None) -> Iterator[Metric]:
    """Per-partition series labelled topic and partition (raft.node.topic_runtime.
    partition_series, capped at PARTITION_SERIES_MAX partitions)."""
    if parts is None:
        return
    labels = ["topic", "partition"]
    hw = GaugeMetricFamily("raftlog_partition_high_watermark", "The partition's high watermark "
                           "on this replica (last offset consumers may read)", labels=labels)
    leader = GaugeMetricFamily("raftlog_partition_leader", "The partition's leader as this "
                               "replica knows it (node id; 0: none)", labels=labels)
    commit_lag = GaugeMetricFamily("raftlog_partition_commit_lag_offsets", "Leader only: "
                                   "dirty offset minus commit index (appended, not yet "
                                   "committed)", labels=labels)
    flushed_lag = GaugeMetricFamily("raftlog_partition_follower_flushed_lag_offsets", "Leader "
                                    "only: dirty offset minus the follower's verified flushed "
                                    "offset", labels=[*labels, "follower"])
    for row in parts.get("series", ()):
        key = [row["topic"], str(row["partition"])]
        hw.add_metric(key, row["high_watermark"])
        leader.add_metric(key, row["leader"])
        if "commit_lag" in row:
            commit_lag.add_metric(key, row["commit_lag"])
            for follower, lag in sorted(row.get("followers", {}).items()):
                flushed_lag.add_metric([*key, str(follower)], lag)
    yield hw
    yield leader
    yield commit_lag
    yield flushed_lag
    yield _gauge("raftlog_partition_series_left_out", "Partitions of this node without "
                 "per-partition series (the cap: PARTITION_SERIES_MAX)",
                 parts.get("left_out", 0))


def _follower_families(st: dict[str, Any]) -> Iterator[Metric]:
    followers = st.get("followers") or []
    dirty = st.get("dirty_offset", -1)
    lag = GaugeMetricFamily("raftlog_follower_lag_offsets", "Leader's dirty offset minus the "
                            "follower's match index (kind=match) or flushed offset "
                            "(kind=flushed); leader only", labels=["follower", "kind"])
    lag_bytes = GaugeMetricFamily("raftlog_follower_lag_bytes", "The lag in bytes (estimated "
                                  "from recent batch sizes); leader only",
                                  labels=["follower", "kind"])
    rate = GaugeMetricFamily("raftlog_follower_recovery_bytes_per_second", "How fast the "
                             "follower is catching up (bytes acknowledged per second over "
                             "the last seconds); leader only", labels=["follower"])
    recovering = GaugeMetricFamily("raftlog_follower_recovering", "1 while the follower is "
                                   "being caught up by a recovery stream", labels=["follower"])
    acked = CounterMetricFamily("raftlog_follower_replicated_bytes", "Bytes the follower "
                                "acknowledged since this node became leader (rate() of it is "
                                "the replication or recovery speed); leader only",
                                labels=["follower"])
    acked_bytes = st.get("acked_bytes") or {}
    for f in followers:
        fid = str(f.get("node_id"))
        match_lag = max(0, dirty - f.get("match_index", -1))
        flushed_lag = max(0, dirty - f.get("flushed_offset", -1))
        per = (f.get("bytes_behind", 0) / match_lag) if match_lag else st.get(
            "bytes_per_offset", 0.0)
        lag.add_metric([fid, "match"], match_lag)
        lag.add_metric([fid, "flushed"], flushed_lag)
        lag_bytes.add_metric([fid, "match"], f.get("bytes_behind", int(match_lag * per)))
        lag_bytes.add_metric([fid, "flushed"], int(flushed_lag * per))
        rate.add_metric([fid], f.get("catchup_bytes_per_s", 0.0))
        recovering.add_metric([fid], 1.0 if f.get("recovering") else 0.0)
        if f.get("node_id") in acked_bytes:
            acked.add_metric([fid], acked_bytes[f["node_id"]])
    yield acked
    yield lag
    yield lag_bytes
    yield rate
    yield recovering


def _link_families(links: dict[str, Any]) -> Iterator[Metric]:
    connected = GaugeMetricFamily("raftlog_peer_connected", "1 while the outgoing link to "
                                  "the peer is up", labels=["peer"])
    dropped = CounterMetricFamily("raftlog_peer_dropped_messages", "Raft messages dropped for "
                                  "the peer (queue full or link down; Raft resends)",
                                  labels=["peer"])
    frames = CounterMetricFamily("raftlog_peer_frames_sent", "Raft frames written to the peer "
                                 "(one frame carries the messages of all groups queued then)",
                                 labels=["peer"])
    up = GaugeMetricFamily("raftlog_peer_up", "The node's failure detector on the peer node: "
                           "1 up, 0 down (nothing heard from it for peer_down_ms)",
                           labels=["peer"])
    pings = CounterMetricFamily("raftlog_peer_pings_sent", "Liveness pings written to the "
                                "peer (frames with no messages, on an idle link)",
                                labels=["peer"])
    for peer, link in sorted(links.items()):
        connected.add_metric([str(peer)], 1.0 if link.get("connected") else 0.0)
        up.add_metric([str(peer)], 1.0 if link.get("up", True) else 0.0)
        pings.add_metric([str(peer)], link.get("pings", 0))
        dropped.add_metric([str(peer)], link.get("dropped", 0))
        frames.add_metric([str(peer)], link.get("frames", 0))
    yield connected
    yield up
    yield dropped
    yield frames
    yield pings
