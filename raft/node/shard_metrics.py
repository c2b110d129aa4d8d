"""/metrics of a node that runs K > 1 shard processes (docs/SHARDS.md "Status and metrics").

Every series a shard exports carries a `shard` label ("0".."K-1"), on its own /metrics (the
metrics port + k) and on the node's. The node's metrics address is shard 0's: a scrape of it
gives every shard's series and the node's totals, so one scrape target per node is enough.
Shard 0 reads the other shards' /metrics at scrape time (in prometheus_client's HTTP thread,
never on the trio loop; all at once, SCRAPE_TIMEOUT_S each), merges each family's samples and
adds the totals with `shard="node"`:
- counters and histograms: the sum over the shards of each series (same other labels; a
  histogram's buckets are the same on every shard, so the summed buckets are the node's);
- gauges that count things (ADDITIVE_GAUGES: groups, connections, bytes held, memory, open
  files): the sum; gauges that flag or bound (MAX_GAUGES: disk full, loop lag): the maximum;
- every other gauge (a role, a term, an offset of one group, a partition's figure) has no
  total: it means something for one shard only.
`raftlog_shard_up{shard}` says whether shard 0 read that shard's series in this scrape (a shard
that does not answer leaves its series out, and its figures out of the totals, until it does).
To sum without double counting, select one: `x{shard="node"}` or `sum without (shard)
(x{shard!="node"})`. A one-shard node has no `shard` label at all (its metrics are unchanged).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

NODE = "node"  # the `shard` label of the node's totals
SCRAPE_TIMEOUT_S = 2.0
ADDITIVE_GAUGES = frozenset((
    "raftlog_open_connections", "raftlog_groups", "raftlog_groups_quiesced",
    "raftlog_groups_awake", "raftlog_retained_bytes", "raftlog_damaged_batches",
    "raftlog_partition_series_left_out", "raftlog_subscription_series_left_out",
    "process_resident_memory_bytes", "process_virtual_memory_bytes", "process_open_fds"))
MAX_GAUGES = frozenset((
    "raftlog_disk_full", "raftlog_event_loop_lag_window_max_seconds",
    "raftlog_event_loop_lag_window_p99_seconds"))
SUMMED_TYPES = frozenset(("counter", "histogram", "summary"))


def labelled(families: Iterable[Metric], shard: str) -> Iterator[Metric]:
    """The families with `shard` added to every sample's labels."""
    for fam in families:
        out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        for s in fam.samples:
            out.add_sample(s.name, {**s.labels, "shard": shard}, s.value, s.timestamp,
                           s.exemplar)
        yield out


def merged(families: Iterable[Metric]) -> list[Metric]:
    """Families of the same name (one per shard) as one each, with the node's totals."""
    by_name: dict[str, Metric] = {}
    for fam in families:
        into = by_name.get(fam.name)
        if into is None:
            into = by_name[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        into.samples.extend(fam.samples)
    for fam in by_name.values():
        fam.samples.extend(_totals(fam))
    return list(by_name.values())


def _totals(fam: Metric) -> list[Any]:
    if fam.type in SUMMED_TYPES or fam.name in ADDITIVE_GAUGES:
        combine = float.__add__
    elif fam.name in MAX_GAUGES:
        combine = max
    else:
        return []
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for s in fam.samples:
        if s.labels.get("shard") == NODE:
            continue
        key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "shard")))
        out[key] = combine(out[key], float(s.value)) if key in out else float(s.value)
    total = Metric(fam.name, fam.documentation, fam.type, fam.unit)
    for (name, labels), value in out.items():
        total.add_sample(name, {**dict(labels), "shard": NODE}, value)
    return total.samples


def scrape_text(address: str, timeout: float = SCRAPE_TIMEOUT_S) -> str:
    host, _, port = address.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}.get(host, host)
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


class ShardView:
    """The collector a shard's /metrics serves (module docstring): its own registry labelled
    with its shard; on shard 0 also the other shards' series (`others`: shard -> metrics
    address) and the node's totals."""

    def __init__(self, registry: CollectorRegistry, shard: int,
                 others: dict[int, str] | None = None) -> None:
        self.registry = registry
        self.shard = shard
        self.others = dict(others or {})

    def collect(self) -> Iterator[Metric]:
        own = list(labelled(self.registry.collect(), str(self.shard)))
        if not self.others:
            yield from own
            return
        with ThreadPoolExecutor(len(self.others)) as pool:
            texts = dict(zip(self.others, pool.map(self._read, self.others.values())))
        families = own
        up = Metric("raftlog_shard_up", "1 if the node's metrics address read this shard's "
                    "series in this scrape (0: the shard did not answer; its series and its "
                    "share of the totals are missing)", "gauge")
        up.add_sample("raftlog_shard_up", {"shard": str(self.shard)}, 1.0)
        for shard, text in sorted(texts.items()):
            up.add_sample("raftlog_shard_up", {"shard": str(shard)}, 0.0 if text is None
                          else 1.0)
            if text is not None:
                families.extend(labelled(text_string_to_metric_families(text), str(shard)))
        yield from merged(families)
        yield up

    @staticmethod
    def _read(address: str) -> str | None:
        try:
            return scrape_text(address)
        except (OSError, ValueError):
            return None


def shard_registry(registry: CollectorRegistry, shard: int,
                   others: dict[int, str] | None = None) -> CollectorRegistry:
    """A registry serving `ShardView` of `registry` (what a shard's HTTP server exports)."""
    served = CollectorRegistry(auto_describe=False)
    served.register(ShardView(registry, shard, others))
    return served
