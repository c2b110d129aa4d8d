"""The workload catalogue of `raftlog bench`: the default set and every other workload module
found in bench/workloads. Both bench.cli (argument checking, imported by every `raftlog`
start) and bench.runner (which pulls in matplotlib for the plots) use it, so it imports
nothing heavy."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

# Latency first: it measures single fsynced writes, and should not share the disk with the
# writeback of the gigabytes the produce workload leaves behind.
WORKLOADS = ("latency", "produce", "fetch", "failover")
# `--only` choices: the measures of the workloads that have several (bench/workloads/partitions.py,
# and trace's `closed`: 64 closed-loop writers instead of the open-loop rate).
PARTITION_MEASURES = ("throughput", "keyed", "fsyncs", "idle", "create", "failover")
TRACE_MEASURES = ("closed",)
LATENCY_MEASURES = ("closed64",)  # latency: only the closed-loop writers, no open-loop rates
# produce's points by their figure id's middle (`quorum.1KiB.p8`): iterate on one point in
# ~10 s instead of the whole ~75 s workload.
PRODUCE_MEASURES = tuple(f"{acks}.{size}.p{n}" for n in (1, 8)
                         for acks in ("quorum", "leader", "none")
                         for size in ("100B", "1KiB", "16KiB"))
MEASURES = (*PARTITION_MEASURES, *TRACE_MEASURES, *LATENCY_MEASURES, *PRODUCE_MEASURES)


def available_workloads() -> list[str]:
    """The default set plus every other module in bench/workloads offering steps() and run()
    (recovery, spark, ...: run only when named)."""
    import bench.workloads as pkg

    extra = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)
                   if m.name not in WORKLOADS and m.name != "common")
    return [*WORKLOADS, *extra]


def workload_module(name: str) -> ModuleType:
    if name not in available_workloads():
        raise ValueError(f"unknown workload {name!r}; choose from "
                         f"{', '.join(available_workloads())}")
    mod = importlib.import_module(f"bench.workloads.{name}")
    if not (hasattr(mod, "run") and hasattr(mod, "steps")):
        raise ValueError(f"bench.workloads.{name} is not a workload (needs steps() and run())")
    return mod
