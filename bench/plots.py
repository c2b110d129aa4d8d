"""PNG plots of a results dict (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

ACK_COLORS = {"quorum": "#1f77b4", "leader": "#ff7f0e", "none": "#2ca02c"}


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def throughput(results: dict, path: str) -> None:
    """Grouped bars: MB/s per record size, one bar per ack level, one panel per producer count;
    whiskers span min..max over repeats."""
    figs = [f for f in results["figures"] if f["workload"] == "produce" and f["unit"] == "MB/s"]
    producers = sorted({f["params"]["producers"] for f in figs}) or [1]
    fig, axes = plt.subplots(1, len(producers), figsize=(5.5 * len(producers), 4), squeeze=False)
    for ax, nprod in zip(axes[0], producers):
        sub = [f for f in figs if f["params"]["producers"] == nprod]
        if not sub:
            _empty(ax, "no produce figures")
            continue
        sizes = sorted({f["params"]["record_size"] for f in sub})
        acks = [a for a in ACK_COLORS if any(f["params"]["acks"] == a for f in sub)]
        width = 0.8 / max(1, len(acks))
        for j, a in enumerate(acks):
            xs, ys, lo, hi = [], [], [], []
            for i, s in enumerate(sizes):
                f = next((f for f in sub if f["params"]["acks"] == a
                          and f["params"]["record_size"] == s), None)
                if f is None or f["median"] is None:
                    continue
                xs.append(i + (j - (len(acks) - 1) / 2) * width)
                ys.append(f["median"])
                lo.append(f["median"] - f["min"])
                hi.append(f["max"] - f["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=f"acks={a}",
                   color=ACK_COLORS[a])
        ax.set_xticks(range(len(sizes)), [_size(s) for s in sizes])
        ax.set_xlabel("record size")
        ax.set_ylabel("MB/s (median, min–max)")
        ax.set_title(f"produce, {nprod} producer{'s' if nprod > 1 else ''}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _size(n: int) -> str:
    return f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def latency_cdf(results: dict, path: str) -> None:
    rates = (results["details"].get("latency") or {}).get("rates", [])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    if not rates:
        _empty(ax, "latency workload not run")
    for r in rates:
        pts = r.get("cdf_ms") or []
        if not pts:
            continue
        xs = [max(p[0], 1e-3) for p in pts]
        ys = [p[1] * 100 for p in pts]
        ok = "pass" if r.get("pass") else "fail"
        ax.step(xs, ys, where="post", label=f"{r['rate']}/s (p99 {r.get('p99_ms') or 0:.2f} ms, "
                                             f"{ok})")
    if rates:
        lim = results["details"]["latency"].get("p99_limit_ms")
        if lim:
            ax.axvline(lim, color="red", ls="--", lw=1, label=f"p99 limit {lim} ms")
        ax.axhline(99, color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("latency from intended send (ms, log)")
    ax.set_ylabel("percent of requests ≤ latency")
    ax.set_title("quorum produce latency, open loop, single 100 B records")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def failover_timeline(results: dict, path: str) -> None:
    d = results["details"].get("failover") or {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, mode, title in ((axes[0][0], "kill", "SIGKILL of the leader"),
                            (axes[0][1], "transfer", "graceful leadership transfer")):
        pts = d.get(f"timeline_{mode}") or []
        if not pts:
            _empty(ax, f"no {mode} timeline")
            ax.set_title(title)
            continue
        ok = [(t, max(lat, 1e-2)) for t, lat, good in pts if good]
        bad = [(t, max(lat, 1e-2)) for t, lat, good in pts if not good]
        if ok:
            ax.scatter(*zip(*ok), s=4, color="#2ca02c", label="write ok")
        if bad:
            ax.scatter(*zip(*bad), s=10, color="#d62728", marker="x", label="write failed")
        ax.axvline(0, color="black", lw=1, label=mode)
        runs = d.get(mode) or []
        out = runs[0].get("outage_s") if runs else None
        if out is not None:
            ax.axvspan(0, out, color="red", alpha=0.1, label=f"no writes: {out:.2f} s")
        ax.set_yscale("log")
        ax.set_xlabel("seconds since the event (request send time)")
        ax.set_ylabel("request latency (ms, log)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(results: dict, out_dir: str) -> list[str]:
    """Every plot into out_dir; returns the file names written."""
    names = []
    for name, fn in (("throughput.png", throughput), ("latency_cdf.png", latency_cdf),
                     ("failover.png", failover_timeline)):
        fn(results, os.path.join(out_dir, name))
        names.append(name)
    return names
