"""Runs the probes and the chosen workloads, with a progress bar, into one results dict."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)

from bench import disk, plots, probes
from bench.catalogue import WORKLOADS, workload_module  # noqa: F401 (WORKLOADS: re-exported)
from bench.results import SCHEMA_VERSION, print_summary, save
from bench.workloads.common import BenchConfig, Ctx


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "processor": platform.machine(),
            "hostname": platform.node()}


def run(cfg: BenchConfig, console: Console, command: list[str] | None = None) -> dict[str, Any]:
    """Probe the machine, run every workload on its own fresh cluster, return the results.

    Everything the run writes lives in one directory under --data-dir, one subdirectory per
    workload, removed as soon as that workload ends (unless --keep-data): the next workload
    starts with the space back. Raises DiskTooSmall when not even the probes fit."""
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
                   "window": cfg.window, "server_args": cfg.server_args,
                   "keep_data": cfg.keep, "only": cfg.only, "partitions": cfg.partitions,
                   "producers": cfg.producers},
        "limits": {}, "figures": [], "details": {}, "errors": [], "plots": [],
        "elapsed_s": None,
    }
    run_dir = tempfile.mkdtemp(prefix="raftlog-bench-run-", dir=cfg.base_dir)
    try:
        where = os.path.abspath(cfg.base_dir or tempfile.gettempdir())
        need = probes.disk_need(sizes)
        free = disk.free_bytes(run_dir)
        if free < need:
            raise disk.DiskTooSmall(
                f"the machine probes need {disk.fmt_bytes(need)} free on {where} and "
                f"{disk.fmt_bytes(free)} is free. Free some space or point --data-dir at a "
                f"bigger disk")
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=False) as progress:
            task = progress.add_task("probing machine limits", total=total)

            def advance(_: str) -> None:
                progress.advance(task)

            def describe(text: str) -> None:
                progress.update(task, description=text)

            t0 = time.monotonic()
            results["limits"] = probes.run_probes(run_dir, sizes, probe_repeats,
                                                  on_step=lambda name: (describe(f"probe {name}"),
                                                                        advance(name)))
            results["limits"]["elapsed_s"] = round(time.monotonic() - t0, 1)
            ctx = Ctx(cfg, results["limits"], advance, describe, results["errors"])
            for name, mod in zip(cfg.workloads, mods):
                figures, details = _run_workload(ctx, name, mod, run_dir, where, console)
                results["figures"].extend(figures)
                results["details"][name] = details
            describe("done")
    finally:
        if cfg.keep:
            console.print(f"bench: data kept in {run_dir} (--keep-data)")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    return results


def _run_workload(ctx: Ctx, name: str, mod: ModuleType, run_dir: str, where: str,
                  console: Console) -> tuple[list[dict], dict]:
    """One workload in its own directory, under the disk bound sized to the space free now;
    refused (with the space it needs) when it would not fit; its data removed after it."""
    cfg = ctx.cfg
    t0 = time.monotonic()
    need = mod.disk_need(cfg) if hasattr(mod, "disk_need") else disk.DiskNeed()
    free = disk.free_bytes(run_dir)
    try:
        plan = disk.plan(name, need, free, cfg.nodes, where, cfg.server_args)
    except (disk.DiskTooSmall, ValueError) as e:
        # ValueError: a --server-arg --retention-bytes the node would refuse as well.
        error = f"refused: {e}"
        console.print(f"[red]bench: workload {name} {error}[/]")  # "refused: it needs ..."
        ctx.errors.append({"workload": name, "error": error, "refused": True})
        for _ in range(mod.steps(cfg)):
            ctx.advance(name)
        return [], {"error": error, "refused": True, "elapsed_s": 0.0,
                    "disk": {"free_bytes": free, "keep_bytes": need.keep_bytes}}
    ctx.describe(f"{name}: starting a fresh {cfg.nodes}-node cluster "
                 f"(retention {disk.fmt_bytes(plan.retention_bytes)} a node)")
    ctx.data_dir = tempfile.mkdtemp(prefix=f"{name}-", dir=run_dir)
    ctx.disk = plan
    watch = disk.FreeSpaceWatch(run_dir)
    try:
        with watch:
            figures, details = mod.run(ctx)
    except Exception as e:  # noqa: BLE001 - one workload's failure must not end the run
        # A load generator that died, a cluster that did not come up: reported in
        # results.json with its error, and the next workload still runs on its own fresh
        # cluster (Ctrl-C still ends the whole run).
        error = f"{type(e).__name__}: {e}"
        console.print(f"[red]bench: workload {name} failed: {error[:2000]}[/]")
        ctx.errors.append({"workload": name, "error": error})
        figures, details = [], {"error": error}
    finally:
        if not cfg.keep:
            shutil.rmtree(ctx.data_dir, ignore_errors=True)
        ctx.data_dir, ctx.disk = None, None
    details["elapsed_s"] = round(time.monotonic() - t0, 1)
    details["disk"] = {**plan.to_json(), "min_free_bytes": watch.min_free,
                       "most_used_bytes": None if watch.min_free is None
                       else free - watch.min_free}
    return figures, details


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
        if err.get("refused"):
            console.print(f"[red]{where}: {err['error']}[/]")
        else:
            console.print(f"[red]failed: {where}: {err['error'].splitlines()[-1][:300]}[/]")
    console.print(f"results: {path} (plots: {', '.join(results['plots'])}) in "
                  f"{results['elapsed_s']} s")
    failed = failed_workloads(results)
    if failed:
        console.print(f"[red]bench: {len(failed)} of {len(results['config']['workloads'])} "
                      f"workloads failed or were refused ({', '.join(failed)}): exit status 1[/]")
    return path


def failed_workloads(results: dict[str, Any]) -> list[str]:
    """The workloads that failed, were refused, or lost a point to an error (the run's exit
    status is then 1): each once, in the order of the errors."""
    return list(dict.fromkeys(err["workload"] for err in results.get("errors", [])))
