"""Runs the probes and the chosen workloads, with a progress bar, into one results dict."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)

from bench import plots, probes
from bench.catalogue import WORKLOADS, workload_module  # noqa: F401 (WORKLOADS: re-exported)
from bench.results import SCHEMA_VERSION, print_summary, save
from bench.workloads.common import BenchConfig, Ctx


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "processor": platform.machine(),
            "hostname": platform.node()}


def run(cfg: BenchConfig, console: Console, command: list[str] | None = None) -> dict[str, Any]:
    """Probe the machine, run every workload on its own fresh cluster, return the results."""
    mods = [workload_module(w) for w in cfg.workloads]
    probe_repeats = 1 if cfg.quick else 3
    sizes = probes.ProbeSizes.quick() if cfg.quick else probes.ProbeSizes()
    total = probes.PROBE_STEPS * probe_repeats + sum(m.steps(cfg) for m in mods)
    started = time.monotonic()
    results: dict[str, Any] = {
        "schema": SCHEMA_VERSION, "tool": "raftlog bench",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(command or ["raftlog", "bench", *sys.argv[1:]]),
        "machine": machine(),
        "config": {"workloads": cfg.workloads, "nodes": cfg.nodes, "duration_s": cfg.duration,
                   "repeats": cfg.repeats, "quick": cfg.quick, "batch_bytes": cfg.batch_bytes,
                   "window": cfg.window, "server_args": cfg.server_args},
        "limits": {}, "figures": [], "details": {}, "errors": [], "plots": [],
        "elapsed_s": None,
    }
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=False) as progress:
        task = progress.add_task("probing machine limits", total=total)

        def advance(_: str) -> None:
            progress.advance(task)

        def describe(text: str) -> None:
            progress.update(task, description=text)

        t0 = time.monotonic()
        results["limits"] = probes.run_probes(cfg.base_dir, sizes, probe_repeats,
                                              on_step=lambda name: (describe(f"probe {name}"),
                                                                    advance(name)))
        results["limits"]["elapsed_s"] = round(time.monotonic() - t0, 1)
        ctx = Ctx(cfg, results["limits"], advance, describe, results["errors"])
        for name, mod in zip(cfg.workloads, mods):
            describe(f"{name}: starting a fresh {cfg.nodes}-node cluster")
            t0 = time.monotonic()
            try:
                figures, details = mod.run(ctx)
            except Exception as e:  # noqa: BLE001 - one workload's failure must not end the run
                # A load generator that died, a cluster that did not come up: reported in
                # results.json with its error, and the next workload still runs on its own
                # fresh cluster (Ctrl-C still ends the whole run).
                error = f"{type(e).__name__}: {e}"
                console.print(f"[red]bench: workload {name} failed: {error[:2000]}[/]")
                results["errors"].append({"workload": name, "error": error})
                figures, details = [], {"error": error}
            details["elapsed_s"] = round(time.monotonic() - t0, 1)
            results["figures"].extend(figures)
            results["details"][name] = details
        describe("done")
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    return results


def finish(results: dict[str, Any], out_dir: str, console: Console,
           compare: dict[str, Any] | None = None) -> str:
    """Write plots and results.json into out_dir, print the summary (and the comparison)."""
    os.makedirs(out_dir, exist_ok=True)
    results["plots"] = plots.write_all(results, out_dir)
    path = os.path.join(out_dir, "results.json")
    save(results, path)
    lim = results["limits"]
    console.print(
        f"machine limits: fsync p50 {lim['fsync_ms']['p50']:.3f} ms, p99 "
        f"{lim['fsync_ms']['p99']:.3f} ms; LMDB commit p50 {lim['lmdb_commit_ms']['p50']:.3f} ms; "
        f"RPC floor p50 {lim['rpc_floor_ms']['p50']:.3f} ms; "
        f"sequential write "
        f"{lim['seq_write_MBps']['median']:.0f} MB/s; loopback TCP "
        f"{lim['tcp_loopback_MBps']['median']:.0f} MB/s; raw LMDB append "
        f"{lim['lmdb_append_MBps']['median']:.0f} MB/s")
    print_summary(results, console, compare)
    for err in results.get("errors", []):
        where = err["workload"] + (f" ({err['point']})" if err.get("point") else "")
        console.print(f"[red]failed: {where}: {err['error'].splitlines()[-1][:300]}[/]")
    console.print(f"results: {path} (plots: {', '.join(results['plots'])}) in "
                  f"{results['elapsed_s']} s")
    return path
