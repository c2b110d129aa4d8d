"""Markdown for docs/PERFORMANCE.md from a results.json, so the doc shows exactly what a run
measured: `python -m bench.report bench-results/results.json [--plots-to docs/performance]`."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from bench.results import fmt, load


def limits_markdown(results: dict) -> str:
    lim = results["limits"]
    rows = [
        ("fsync latency (4 KiB write + fsync)",
         f"p50 {lim['fsync_ms']['p50']:.3f} ms, p99 {lim['fsync_ms']['p99']:.3f} ms"),
        ("LMDB durable commit of one small record (two fsyncs)",
         f"p50 {lim['lmdb_commit_ms']['p50']:.3f} ms, p99 {lim['lmdb_commit_ms']['p99']:.3f} ms")
        if "lmdb_commit_ms" in lim else None,
        ("RPC floor (round trip to a do-nothing wire server)",
         f"p50 {lim['rpc_floor_ms']['p50']:.3f} ms, p99 {lim['rpc_floor_ms']['p99']:.3f} ms"),
        ("sequential write, 1 MiB writes + fsync", _mmm(lim["seq_write_MBps"], "MB/s")),
        ("loopback TCP between two processes", _mmm(lim["tcp_loopback_MBps"], "MB/s")),
        ("raw LMDB append, fsynced 4 MiB transactions", _mmm(lim["lmdb_append_MBps"], "MB/s")),
    ]
    out = ["| machine limit | measured (median, min … max) |", "|---|---|"]
    out += [f"| {r[0]} | {r[1]} |" for r in rows if r is not None]
    return "\n".join(out)


def _mmm(s: dict, unit: str) -> str:
    return f"{fmt(s['median'], unit)} ({fmt(s['min'])} … {fmt(s['max'])})"


def figures_markdown(results: dict) -> str:
    out = ["| figure | median | min … max | of its limit | target |", "|---|---:|---:|---:|---|"]
    for f in results["figures"]:
        frac = f.get("fraction_of_limit")
        lim = f"{frac:.1%} of {f['limit']}" if frac is not None else ""
        tgt = f.get("target")
        t = "" if tgt is None else f"{tgt['op']} {fmt(tgt['value'])} " + (
            "**met**" if f["met"] else "**missed**" if f["met"] is False else "n/a")
        out.append(f"| {f['title']} | {fmt(f['median'], f['unit'])} | {fmt(f['min'])} … "
                   f"{fmt(f['max'])} | {lim} | {t} |")
    return "\n".join(out)


def latency_gate_markdown(results: dict) -> str:
    lat = results["details"].get("latency")
    if not lat:
        return ""
    out = [f"| rate | achieved | p50 | p99 | p99.9 | max | gate (>= 90% rate, p99 <= "
           f"{lat['p99_limit_ms']} ms) |", "|---:|---:|---:|---:|---:|---:|---|"]
    for r in lat["rates"]:
        ach = sorted(x["achieved_rate"] for x in r["repeats"])
        out.append(f"| {r['rate']}/s | {fmt(ach[len(ach) // 2], 'req/s')} | "
                   f"{fmt(r['p50_ms'], 'ms')} | {fmt(r['p99_ms'], 'ms')} | "
                   f"{fmt(r['p999_ms'], 'ms')} | {fmt(r['max_ms'], 'ms')} | "
                   f"{'pass' if r['pass'] else 'FAIL'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report")
    p.add_argument("results")
    p.add_argument("--plots-to", help="copy the run's PNG plots into this directory")
    args = p.parse_args(argv)
    results = load(args.results)
    if args.plots_to:
        os.makedirs(args.plots_to, exist_ok=True)
        for name in results["plots"]:
            shutil.copy(os.path.join(os.path.dirname(args.results), name), args.plots_to)
    print(f"Run {results['date']} on {results['machine']['cpus']} cores "
          f"({results['machine']['platform']}, Python {results['machine']['python']}), "
          f"{results['elapsed_s']} s:\n\n    {results['command']}\n")
    print(limits_markdown(results), "\n")
    print(figures_markdown(results), "\n")
    print(latency_gate_markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
