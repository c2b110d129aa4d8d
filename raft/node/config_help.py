"""What each `raftlog serve` setting does, for `--help` (raft/node/config.py adds the default
from the field, or from RaftConfig for the core's knobs). Apart from config.py to keep each
file to one concern: the text here, the dataclass and its validation there."""

from __future__ import annotations

# What each numeric or boolean setting does, for `raftlog serve --help` (the default is added
# from the field, or from RaftConfig for the core's knobs). Every field but the ones with their
# own flag above (node_id, data_dir, peers, listen, log_level, raft) is listed.
FLAG_HELP = {
    "tick_ms": "length of one Raft tick in ms",
    "election_ticks": "a follower that hears no leader for a random 1-2x this many ticks "
                      "campaigns",
    "heartbeat_ticks": "leader heartbeat interval in ticks (carries the commit index)",
    "max_append_bytes": "bytes per AppendEntries in normal replication (up to an eighth over, "
                        "so round-sized batches fill it)",
    "recovery_chunk_bytes": "bytes per recovery chunk to a lagging follower (sent unflushed; "
                            "up to an eighth over)",
    "max_append_batches": "batches per AppendEntries or recovery chunk (bounds one event-loop "
                          "step with small batches)",
    "max_inflight": "pipelined AppendEntries per follower",
    "max_inflight_bytes": "pipelined AppendEntries bytes per follower",
    "follower_flush_bytes": "a follower flushes deferred recovery data after this many bytes",
    "follower_flush_ticks": "... or after this many ticks",
    "pre_vote": "pre-vote: a partitioned node cannot disrupt the cluster when it returns",
    "check_quorum": "a leader that loses touch with a majority steps down",
    "max_pending_produce": "quorum writes waiting for commit before BACKPRESSURE",
    "merge_max_records": "concurrent produces without a producer id, of one timestamp, are "
                         "stored as one batch of at most this many records (0 = each its own "
                         "batch; raft/core/merging.py)",
    "merge_max_bytes": "... and at most this many bytes (never above max_append_bytes)",
    "max_frame_bytes": "largest accepted frame; larger requests get TOO_LARGE",
    "max_inflight_per_connection": "pipelined requests per client connection before the node "
                                   "stops reading from it",
    "peer_queue_messages": "outgoing messages queued per peer (beyond: dropped, Raft retries)",
    "peer_queue_bytes": "outgoing bytes queued per peer",
    "peer_down_ms": "report a peer node down to every group's core after this many ms without "
                    "a frame from it (0 = one election timeout, election_ticks x tick_ms); "
                    "an idle link pings after a fifth of it (docs/DESIGN.md, \"Quiescence and "
                    "node liveness\")",
    "reconnect_min_ms": "first pause before redialling a peer",
    "reconnect_max_ms": "longest pause before redialling a peer",
    "default_timeout_ms": "a request's timeout when the client gives none",
    "max_timeout_ms": "the longest timeout a client may ask for",
    "max_fetch_wait_ms": "the longest long poll a fetch may ask for",
    "shutdown_transfer_ms": "on SIGTERM a leader hands leadership over for at most this long",
    "recovery_rate": "limit on recovery traffic in MiB/s, all partitions of the node together "
                     "(0 = unlimited)",
    "recovery_streams": "followers this node's partitions catch up at once, all partitions "
                        "together; more wait their turn (0 = no limit)",
    "recovery_burst": "MiB the recovery limit may bank while idle",
    "link_rate": "limit on what this node's cross-cluster links fetch from their sources, in "
                 "MiB/s for all its mirror partitions together (0 = unlimited; "
                 "docs/REPLICATION.md)",
    "join": "start outside the configuration and wait to be added with `raftlog add-node`",
    "scrub_rate": "re-read flushed batches in the background at this many MiB/s (for the whole "
                  "node, shared by all its partitions) to find "
                  "damage early (0 = off; docs/DISK-LOSS.md)",
    "scrub_slice_kib": "KiB one scrub slice reads, in a worker thread",
    "retention_respect_subscriptions": "retention never deletes past the lowest subscription "
                                       "position, within the retention valves",
    "controller_retention_bytes": "bytes of controller log (the cluster's metadata) kept; "
                                  "older entries are folded into the metadata stored with the "
                                  "log start (0 = keep the whole log)",
    "subscription_expiry_ms": "drop a subscription nobody opened or committed for this long, "
                              "e.g. 604800000 for a week (0 = never)",
}
