"""Node configuration: one dataclass, filled from CLI flags or a TOML file, validated up front.

Why validate here and not where values are used: a misconfigured node should fail before it binds
a port or opens a log, with one line saying which setting to fix (the CLI prints it and exits 2).

Data directory layout: a node keeps its log in `<data_dir>/node-<node_id>/`. Several nodes can
therefore share one `--data-dir` (as `raftlog up` does) without clobbering each other, and a node
started with the wrong id finds an empty directory instead of another node's log.

TOML keys are the dataclass field names; `peers` is a table `{ "1" = "127.0.0.1:7101", ... }`
(or a string in the CLI form `1=HOST:PORT,2=HOST:PORT`). Unknown keys are refused (typos must not
silently fall back to defaults).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raft.core.config import RaftConfig
from raft.node.config_help import FLAG_HELP
from raft.node.config_values import (  # re-exported: the CLI and tests import them from here
    ConfigError,
    _parse_bool,
    check_keys,
    format_address,
    parse_address,
    parse_duration_ms,
    parse_peers,
    parse_size,
)
from raft.node.liveness import derived_timeouts
from raft.protocol.framing import DEFAULT_MAX_FRAME_BYTES

DEFAULT_HOST = "127.0.0.1"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
# Settings that name files or addresses: strings, with their own flags (see add_arguments).
_SECURITY_FLAGS = {
    "tls_cert": ("FILE.pem", "this node's certificate (with --tls-key and --tls-ca: TLS on "
                             "every connection; `raftlog certs issue` makes one)"),
    "tls_key": ("FILE.pem", "this node's private key"),
    "tls_ca": ("FILE.pem", "the cluster CA: peers and client certificates must be signed by it"),
    "auth_file": ("FILE.toml", "principals, permissions and hashed tokens; clients must then "
                               "authenticate (needs TLS; SIGHUP reloads it)"),
    "metrics_listen": ("HOST:PORT", "serve Prometheus metrics at http://HOST:PORT/metrics "
                                    "(default off)"),
}


def raft_default(name: str) -> Any:
    """The core's default for a RaftConfig setting (what a None knob here means)."""
    return {f.name: f.default for f in dataclasses.fields(RaftConfig)}[name]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), what `--shards auto` uses."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _parse_shards(text: str) -> int:
    if text == "auto":
        return usable_cores()
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shards takes a number or auto, got {text!r}"
                                         ) from None
    return value


def _parse_raft_options(items: list[str]) -> dict[str, Any]:
    """['k=v', ...] -> {k: int | float | bool | str}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--raft {item!r} must look like KEY=VALUE, e.g. "
                              f"--raft max_inflight=8")
        value: Any = raw.strip()
        if value.lower() in ("true", "false"):
            value = value.lower() == "true"
        else:
            for conv in (int, float):
                try:
                    value = conv(value)
                    break
                except ValueError:
                    pass
        out[key.strip()] = value
    return out


_RETENTION_SETTINGS = ("retention_bytes", "retention_ms", "retention_min_ms",
                       "retention_max_ms", "low_disk_mb")



def read_toml(path: str, name: str | None = None) -> dict[str, Any]:
    """A TOML settings file as a dict, or a ConfigError that names it (`name`, default
    "config file PATH") and says what is wrong: missing, unreadable, or not TOML."""
    name = name or f"config file {path}"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{name} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{name} cannot be read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{name} is not valid TOML: {e}") from None

@dataclass(slots=True)
class NodeConfig:
    """Everything one node needs. `peers` lists every voter, this node included."""

    node_id: int
    data_dir: Path
    peers: dict[int, str]
    # Where to listen; defaults to this node's entry in `peers`. Default bind host is 127.0.0.1:
    # exposing a node beyond the machine is an explicit choice.
    listen: str | None = None
    tick_ms: int = 50
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    # Client connections: requests a connection may have in flight before the node stops
    # reading from it (per-connection backpressure).
    max_inflight_per_connection: int = 256
    # Outgoing per-peer queue: raft messages beyond these bounds are dropped (Raft retries).
    peer_queue_messages: int = 4096
    peer_queue_bytes: int = 64 * 1024 * 1024
    # Node-pair failure detector (raft/node/liveness.py): a peer node silent this long is
    # reported down to every group's core (what lets a quiesced follower notice its leader's
    # node died); 0 = one election timeout. Idle links ping after a fifth of it.
    peer_down_ms: int = 0
    # Peer reconnect backoff (exponential with full jitter).
    reconnect_min_ms: int = 50
    reconnect_max_ms: int = 2000
    # Client request bounds.
    default_timeout_ms: int = 5000
    max_timeout_ms: int = 120_000
    max_fetch_wait_ms: int = 60_000
    # On SIGTERM a leader hands leadership over first, for at most this long.
    shutdown_transfer_ms: int = 1000
    # Node-wide limit on recovery traffic (AppendEntries chunks sent with flush=False while a
    # follower catches up), in MiB/s; 0 = unlimited. Keeps catch-up from starving live writes.
    recovery_rate: float = 0.0
    # Tokens the recovery limit may bank while idle, in MiB.
    recovery_burst: float = 4.0
    # Catch-up streams (partition, follower) this node leads at once, every partition together:
    # a node back after an outage lags in all its partitions, and without a bound each of
    # their leaders would stream to it at once (recovery/budget.py). 0 = no limit.
    recovery_streams: int = 32
    # Node-wide limit on what this node's cross-cluster link pullers fetch, MiB/s (0 =
    # unlimited): a link catching up must not starve producers on either cluster.
    link_rate: float = 32.0
    # Start outside the configuration: this node waits to be added (`raftlog add-node`) instead
    # of counting itself a voter of the --peers it was given.
    join: bool = False
    # Shard processes (docs/SHARDS.md): with more than one, `raftlog serve` supervises that
    # many processes, shard k in DATA_DIR/node-<id>/shard-<k>/ on the listen port + k. `shard`
    # is which one this process is (set by the supervisor). 1 here (in-process nodes); the
    # program's default when --shards is left out is raft.node.supervisor.default_shards.
    shards: int = 1
    shard: int = 0
    # -- disk loss and corruption (docs/DISK-LOSS.md) -----------------------------------------
    # The background scrubber re-reads flushed batches at this many MiB/s, checking every
    # checksum, so damage is found (and re-fetched) before a read or a failover needs the data;
    # 0 turns it off. A full pass over a 100 GiB log takes about 14 h at the default.
    scrub_rate: float = 2.0
    # What one scrub slice reads, in KiB (each slice runs in a worker thread, off the event loop).
    scrub_slice_kib: int = 256
    log_level: str = "WARNING"
    # "text" (key=value) or "json" (one object per line with node, term, event) on stderr.
    log_format: str = "text"
    # Security (docs/SECURITY.md). All three TLS files or none: TLS on every connection, mutual
    # between nodes. Plaintext is the default, for local use.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    # With an auth file, clients authenticate (token or client certificate) and need permissions.
    auth_file: str | None = None
    # Prometheus text format over HTTP (prometheus_client's server, in a thread); None = off.
    metrics_listen: str | None = None
    # Raft knobs, passed through to raft.core.raft.RaftConfig (None = the core's default).
    election_ticks: int | None = None
    heartbeat_ticks: int | None = None
    max_append_bytes: int | None = None
    recovery_chunk_bytes: int | None = None
    max_append_batches: int | None = None
    max_inflight: int | None = None
    max_inflight_bytes: int | None = None
    follower_flush_bytes: int | None = None
    follower_flush_ticks: int | None = None
    pre_vote: bool | None = None
    check_quorum: bool | None = None
    max_pending_produce: int | None = None
    merge_max_records: int | None = None
    merge_max_bytes: int | None = None
    # Any other RaftConfig keyword (forward compatible with knobs the core adds).
    raft: dict[str, Any] = field(default_factory=dict)

    # -- retention (docs/RETENTION.md); the defaults keep everything ----------------------------
    # Keep at most this many bytes of log (sizes like "64MiB" accepted); None = no size limit.
    retention_bytes: int | None = None
    # Delete batches older than this (ms, or "7d", "12h", ...); None = no age limit.
    retention_ms: int | None = None
    # Never delete a batch younger than this, whatever the size.
    retention_min_ms: int = 0
    # Valve: delete (what the policy wants gone) past this age even if a member still needs it.
    retention_max_ms: int | None = None
    # Valve: below this much free disk (MiB), stop holding data back for members. 0 = off.
    low_disk_mb: int = 0
    # The controller's log (group 0, the cluster's metadata) keeps about this many bytes; what
    # is cut is folded into the metadata stored with the log start, so nothing is lost and a
    # node far behind gets that state instead of every command since the cluster began
    # (Kafka's KRaft snapshots its metadata log the same way). 0 = keep the whole log.
    controller_retention_bytes: int = 16 << 20
    # -- subscriptions (raft/core/subscription_table.py, docs/SUBSCRIPTIONS.md) -----------------------------
    # Retention never deletes past the lowest subscription position (within retention's valves,
    # --retention-max-ms and --low-disk-mb). Off: retention ignores subscriptions.
    retention_respect_subscriptions: bool = False
    # Drop a subscription nobody opened or committed for this long (ms); 0 = never. Forgotten
    # subscriptions otherwise hold retention back for good.
    subscription_expiry_ms: int = 0

    _RAFT_KNOBS = ("election_ticks", "heartbeat_ticks", "max_append_bytes",
                   "recovery_chunk_bytes", "max_append_batches", "max_inflight",
                   "max_inflight_bytes", "follower_flush_bytes", "follower_flush_ticks", "pre_vote", "check_quorum",
                   "max_pending_produce", "merge_max_records", "merge_max_bytes")

    # -- derived ---------------------------------------------------------------------------------
    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_address(self.listen or self.peers[self.node_id], what="listen address")

    @property
    def node_dir(self) -> Path:
        if self.shards > 1:
            return self.base_node_dir / f"shard-{self.shard}"
        return self.base_node_dir

    @property
    def base_node_dir(self) -> Path:
        """DATA_DIR/node-<id>: the node's data (one shard), or its shards' directories."""
        return Path(self.data_dir) / f"node-{self.node_id}"

    def liveness_timeouts(self) -> tuple[float, float]:
        """(ping interval, down timeout) in seconds for the node's failure detector."""
        election = self.election_ticks
        if election is None:
            election = self.raft.get("election_ticks", raft_default("election_ticks"))
        return derived_timeouts(self.tick_ms, election, self.peer_down_ms or None)

    def raft_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for RaftConfig besides node_id/voters/learners."""
        out = {k: getattr(self, k) for k in self._RAFT_KNOBS if getattr(self, k) is not None}
        if self.recovery_rate > 0:
            # The core throttles recovery in its own unit of time, the tick.
            out["recovery_rate_bytes_per_tick"] = max(
                1, int(self.recovery_rate * (1 << 20) * self.tick_ms / 1000))
            out["recovery_burst_bytes"] = max(1, int(self.recovery_burst * (1 << 20)))
        out.update(self.raft)
        return out

    # -- validation -------------------------------------------------------------------------------
    def validate(self) -> "NodeConfig":
        """Check every setting without side effects; raise ConfigError naming the first bad one."""
        if isinstance(self.node_id, bool) or not isinstance(self.node_id, int) or self.node_id <= 0:
            raise ConfigError(f"node id {self.node_id!r} must be a positive integer (--node-id)")
        if not self.peers:
            raise ConfigError("no peers given: list every node, this one included, e.g. "
                              "--peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103")
        self.peers = parse_peers(self.peers)
        if self.node_id not in self.peers:
            raise ConfigError(f"node id {self.node_id} is not in peers {sorted(self.peers)}; add "
                              f"{self.node_id}=HOST:PORT to --peers or fix --node-id")
        if self.listen is not None:
            host, port = parse_address(self.listen, what="listen address")
            self.listen = format_address(host, port)
        else:
            self.listen_address  # validates this node's peer entry
        if not str(self.data_dir):
            raise ConfigError("data dir is empty; pass --data-dir DIR")
        if not (isinstance(self.shards, int) and 1 <= self.shards <= 1024
                and isinstance(self.shard, int) and 0 <= self.shard < self.shards):
            raise ConfigError(f"shards {self.shards!r} must be 1..1024 (--shards N, or auto: "
                              f"the usable cores) and shard {self.shard!r} below it")
        self.data_dir = Path(self.data_dir)
        positive = ("tick_ms", "max_frame_bytes", "max_inflight_per_connection",
                    "peer_queue_messages", "peer_queue_bytes", "reconnect_min_ms",
                    "reconnect_max_ms", "default_timeout_ms", "max_timeout_ms",
                    "max_fetch_wait_ms")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.max_frame_bytes < 64 * 1024:
            raise ConfigError(f"max_frame_bytes {self.max_frame_bytes} is below the 65536-byte "
                              f"minimum (raft batches and headers must fit a frame)")
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ConfigError(f"default_timeout_ms {self.default_timeout_ms} must be <= "
                              f"max_timeout_ms {self.max_timeout_ms}")
        if self.reconnect_max_ms < self.reconnect_min_ms:
            raise ConfigError("reconnect_max_ms must be >= reconnect_min_ms")
        if (isinstance(self.peer_down_ms, bool) or not isinstance(self.peer_down_ms, int)
                or self.peer_down_ms < 0):
            raise ConfigError(f"peer_down_ms must be an integer >= 0 (0 = one election "
                              f"timeout), got {self.peer_down_ms!r}")
        if 0 < self.peer_down_ms < 5:
            raise ConfigError(f"peer_down_ms {self.peer_down_ms} is too short: links ping "
                              f"after a fifth of it; use at least a few ticks ({self.tick_ms} "
                              f"ms each), or 0 for one election timeout")
        if self.shutdown_transfer_ms < 0:
            raise ConfigError("shutdown_transfer_ms must be >= 0")
        for name in ("recovery_rate", "recovery_burst", "link_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0 (MiB/s or MiB), got {value!r}")
        if isinstance(self.recovery_streams, bool) or not isinstance(self.recovery_streams, int) \
                or self.recovery_streams < 0:
            raise ConfigError(f"recovery_streams must be an integer >= 0 (0 = no limit), got "
                              f"{self.recovery_streams!r}")
        if self.recovery_rate and not self.recovery_burst:
            raise ConfigError("recovery_burst must be above 0 when recovery_rate is set")
        if (isinstance(self.scrub_rate, bool) or not isinstance(self.scrub_rate, (int, float))
                or self.scrub_rate < 0):
            raise ConfigError(f"scrub_rate must be a number >= 0 (MiB/s; 0 = off), got "
                              f"{self.scrub_rate!r}")
        if (isinstance(self.scrub_slice_kib, bool) or not isinstance(self.scrub_slice_kib, int)
                or self.scrub_slice_kib < 1):
            raise ConfigError(f"scrub_slice_kib must be a positive integer (KiB), got "
                              f"{self.scrub_slice_kib!r}")
        if not isinstance(self.join, bool):
            raise ConfigError(f"join must be true or false, got {self.join!r}")
        level = str(self.log_level).upper()
        if level not in LOG_LEVELS:
            raise ConfigError(f"log level {self.log_level!r} must be one of "
                              f"{', '.join(LOG_LEVELS)}")
        self.log_level = level
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log format {self.log_format!r} must be one of "
                              f"{', '.join(LOG_FORMATS)}")
        self._validate_security()
        for name in self._RAFT_KNOBS:
            value = getattr(self, name)
            if value is None:
                continue
            if name in ("pre_vote", "check_quorum"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{name} must be true or false, got {value!r}")
            elif name == "merge_max_records":  # 0 turns merging off
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"{name} must be an integer >= 0 (0 = never merge), "
                                      f"got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.raft, dict):
            raise ConfigError("raft must be a table of extra RaftConfig settings")
        check_keys(self.raft, {f.name for f in dataclasses.fields(RaftConfig)}
                   - {"node_id", "voters", "learners"}, "raft settings (--raft / [raft])")
        self._validate_retention()
        self._validate_subscriptions()
        return self

    def _validate_subscriptions(self) -> None:
        if not isinstance(self.retention_respect_subscriptions, bool):
            raise ConfigError(f"retention_respect_subscriptions must be true or false, got "
                              f"{self.retention_respect_subscriptions!r}")
        value = self.subscription_expiry_ms
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"subscription_expiry_ms must be an integer >= 0 (0 = never "
                              f"expire), got {value!r}")
        if 0 < value < 1000:
            raise ConfigError(f"subscription_expiry_ms {value} is under a second: consumers "
                              f"would lose their position between two commits; use hours or "
                              f"days (or 0 to keep subscriptions until deleted)")

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert is not None

    def _validate_security(self) -> None:
        for name in _SECURITY_FLAGS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (str, os.PathLike)) or not str(value)):
                raise ConfigError(f"{name} must be a file path or address string, got {value!r}")
            if value is not None:
                setattr(self, name, str(value))
        tls = {k: getattr(self, k) for k in ("tls_cert", "tls_key", "tls_ca")}
        if any(tls.values()) and not all(tls.values()):
            missing = [f"--{k.replace('_', '-')}" for k, v in tls.items() if not v]
            raise ConfigError(f"TLS needs --tls-cert, --tls-key and --tls-ca together; missing "
                              f"{', '.join(missing)} (`raftlog certs` makes them)")
        for k, v in tls.items():
            if v and not Path(v).is_file():
                raise ConfigError(f"{k} {v} is not a readable file; pass the path of the PEM "
                                  f"file (`raftlog certs init|issue` makes them)")
        if self.auth_file is not None and not self.tls_enabled:
            raise ConfigError("auth_file needs TLS (--tls-cert, --tls-key, --tls-ca): tokens "
                              "would travel in clear and any process could pose as a peer")
        if self.metrics_listen is not None:
            host, port = parse_address(self.metrics_listen, what="metrics_listen address")
            self.metrics_listen = format_address(host, port)

    # -- retention settings -------------------------------------------------------------------
    def _validate_retention(self) -> None:
        for name in ("retention_bytes", "retention_ms", "retention_min_ms", "retention_max_ms",
                     "low_disk_mb"):
            value = getattr(self, name)
            if value is None:
                continue
            parse = parse_size if name == "retention_bytes" else (
                parse_duration_ms if name.endswith("_ms") else None)
            if isinstance(value, str) and parse is not None:
                value = parse(value, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
            least = 1 if name in ("retention_bytes", "retention_ms", "retention_max_ms") else 0
            if value < least:
                raise ConfigError(f"{name} must be >= {least}, got {value}; leave it unset "
                                  f"to keep everything")
            setattr(self, name, value)
        value = self.controller_retention_bytes
        if isinstance(value, str):
            value = self.controller_retention_bytes = parse_size(value,
                                                                 "controller_retention_bytes")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"controller_retention_bytes must be a size >= 0 (0 = keep the "
                              f"whole controller log), got {value!r}")
        try:
            self.retention_policy()
        except ValueError as e:
            raise ConfigError(f"{e}; raise --retention-max-ms or lower --retention-min-ms"
                              ) from None

    def controller_retention_policy(self) -> Any:
        """The controller log's retention: its size limit alone (the node's age and valve flags
        are for data: the metadata has no age after which it may go)."""
        from raft.core.retention import RetentionPolicy
        return RetentionPolicy(self.controller_retention_bytes or None).validate()

    def retention_policy(self) -> Any:
        """The sans-IO policy (raft.core.retention.RetentionPolicy) these settings describe."""
        from raft.core.retention import RetentionPolicy
        return RetentionPolicy(self.retention_bytes, self.retention_ms,
                               self.retention_min_ms or 0, self.retention_max_ms,
                               (self.low_disk_mb or 0) << 20).validate()

    @staticmethod
    def _add_retention_argument(parser: argparse.ArgumentParser, name: str) -> None:
        flag = "--" + name.replace("_", "-")
        if name == "retention_bytes":
            parser.add_argument(flag, metavar="SIZE", help=(
                "keep about this much log per node, e.g. 64MiB or 10GiB (default: no size "
                "limit): whole batches are removed from the front while what stays still "
                "holds at least this much; the newest committed batch always stays"))
        elif name == "retention_ms":
            parser.add_argument(flag, metavar="MS", help=(
                "remove batches older than this, in ms or with a unit (7d, 12h, 30m) "
                "(default: no age limit)"))
        elif name == "retention_min_ms":
            parser.add_argument(flag, metavar="MS", help=(
                "never remove a batch younger than this, whatever the size (default 0)"))
        elif name == "retention_max_ms":
            parser.add_argument(flag, metavar="MS", help=(
                "valve: past this age, remove what the policy wants gone even if a member "
                "has not flushed it (it then needs a state transfer); default: never"))
        else:
            parser.add_argument(flag, type=int, metavar="MiB", help=(
                "valve: below this much free disk, stop holding data back for members and "
                "consumers, and log it loudly (default 0 = off)"))

    def check_data_dir(self) -> Path:
        """Create the node's directory and prove it is writable; return it."""
        path = self.node_dir
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".write-test"
            with open(probe, "wb") as f:
                f.write(b"ok")
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"data dir {path} is not usable ({e.strerror or e}); pass a "
                              f"writable --data-dir") from None
        return path

    # -- constructors -----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> "NodeConfig":
        check_keys(values, {f.name for f in dataclasses.fields(cls)}, source)
        for required in ("node_id", "data_dir", "peers"):
            if values.get(required) is None:
                flag = "--" + required.replace("_", "-")
                raise ConfigError(f"{source}: missing {required} ({flag})")
        kwargs = dict(values)
        kwargs["peers"] = parse_peers(kwargs["peers"])
        kwargs["data_dir"] = Path(kwargs["data_dir"])
        return cls(**kwargs).validate()

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str],
                  overrides: dict[str, Any] | None = None) -> "NodeConfig":
        """Load a TOML file; `overrides` (e.g. flags given on the command line) win."""
        values = read_toml(path)
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_dict(values, source=str(path))

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The `raftlog serve` flags, one per field (the CLI calls this to stay in sync with the
        fields). Every flag's help says what it does and its default."""
        parser.add_argument("--config", metavar="FILE.toml",
                            help="read settings from a TOML file (keys = flag names with _; "
                                 "flags given too win)")
        parser.add_argument("--node-id", type=int, help="this node's id (a key of --peers)")
        parser.add_argument("--data-dir", help="directory for logs; this node uses "
                                               "DATA_DIR/node-<id>/ (one process at a time)")
        parser.add_argument("--listen", metavar="HOST:PORT",
                            help="address to listen on (default: this node's --peers entry)")
        parser.add_argument("--peers", metavar="ID=HOST:PORT,...",
                            help="every node of the cluster, this one included")
        parser.add_argument("--shards", type=_parse_shards, metavar="N|auto",
                            help="shard processes for this node (default: as many as its "
                                 "data was written with, for a new node the usable cores, 1 "
                                 "with port 0; auto = the usable cores): shard k listens on "
                                 "the listen port + k (so K free ports) and keeps its data in "
                                 "DATA_DIR/node-<id>/shard-<k>/ (docs/SHARDS.md)")
        parser.add_argument("--log-level", help="DEBUG, INFO, WARNING (default), ERROR")
        parser.add_argument("--log-format", choices=LOG_FORMATS,
                            help="text (key=value, default) or json (one object per line)")
        for name, (metavar, text) in _SECURITY_FLAGS.items():
            parser.add_argument("--" + name.replace("_", "-"), metavar=metavar, help=text)
        for name in _RETENTION_SETTINGS:
            NodeConfig._add_retention_argument(parser, name)
        parser.add_argument("--raft", action="append", metavar="KEY=VALUE",
                            help="any other raft.core.config.RaftConfig setting (repeatable), e.g. "
                                 "--raft producer_window=16")
        fields = {f.name: f for f in dataclasses.fields(NodeConfig)}
        for name, meaning in FLAG_HELP.items():
            flag = "--" + name.replace("_", "-")
            default = fields[name].default
            if default is None:
                default = raft_default(name)
            if name == "join":
                parser.add_argument(flag, action="store_const", const=True, default=None,
                                    help=meaning)
            elif isinstance(default, bool):
                parser.add_argument(flag, type=_parse_bool, metavar="true|false",
                                    help=f"{meaning} (default {str(default).lower()})")
            elif isinstance(default, float):
                parser.add_argument(flag, type=float, metavar="N",
                                    help=f"{meaning} (default {default:g})")
            else:
                parser.add_argument(flag, type=int, metavar="N",
                                    help=f"{meaning} (default {default})")

    @classmethod
    def from_args(cls, args: argparse.Namespace | dict[str, Any]) -> "NodeConfig":
        """Build from parsed `raftlog serve` flags (attribute names = field names). With
        `config` set, the TOML file is read first and the flags given override it."""
        values = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
        if isinstance(values.get("raft"), list):
            values["raft"] = _parse_raft_options(values["raft"])
        names = {f.name for f in dataclasses.fields(cls)}
        config_path = values.pop("config", None)
        picked = {k: v for k, v in values.items() if k in names and v is not None}
        if config_path:
            return cls.from_toml(config_path, picked)
        return cls.from_dict(picked, source="command line")
